"""``hubgrpo space deploy``: put the coordinator on a Hugging Face Space (no gradio import here).

One call does it all, against the Hub or any Hub-compatible endpoint:

1. ``create_repo(space, repo_type="space", space_sdk="gradio", exist_ok=True)`` (private unless asked otherwise);
2. ONE commit with ``space/`` (``app.py``, ``README.md`` with the Space YAML, ``requirements.txt``) at the Space's
   root, plus the hubgrpo package source as ``hubgrpo/`` — the Space imports it from its working directory, so the
   coordinator always runs exactly the code that deployed it (no PyPI release needed) — and a wheel of that same
   code as ``wheels/hubgrpo-<version>-py3-none-any.whl``, so that any machine installs the matching worker with
   one line (``pip install <the Space's URL of that file>``; ``hubgrpo launch`` does it in each job);
3. the Space variable ``HUBGRPO_REPO`` (the run repo; ``HF_ENDPOINT`` too when it is not huggingface.co) and the
   Space secrets ``HF_TOKEN`` (the token the coordinator writes merges with) and ``HUBGRPO_SECRET`` (signs leases;
   the same secret as a local coordinator of this run, so leases survive the move).

Tokens are sent only to the Hub's secrets endpoint; they are never printed or written into files.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from hubgrpo import __version__
from hubgrpo.errors import AuthError, ConfigError
from hubgrpo.layout import WHEELS_DIR, space_wheel_url

SPACE_FILES = ("app.py", "README.md", "requirements.txt")
DEFAULT_ENDPOINT = "https://huggingface.co"


def package_dir() -> Path:
    """The installed hubgrpo package folder."""
    import hubgrpo

    return Path(hubgrpo.__file__).resolve().parent


def default_space_dir() -> Path:
    """``space/`` of the source checkout this package runs from."""
    return package_dir().parent / "space"


def space_files(space_dir: Path | None = None, pkg_dir: Path | None = None) -> dict[str, Path]:
    """Path in the Space → local file: the three ``space/`` files and every package source file."""
    space_dir, pkg_dir = Path(space_dir or default_space_dir()), Path(pkg_dir or package_dir())
    missing = [f for f in SPACE_FILES if not (space_dir / f).is_file()]
    if missing:
        raise ConfigError(
            f"{space_dir} lacks {', '.join(missing)}: the Space's files come from a source checkout",
            hint="run from a git clone of hubgrpo, or pass --space-dir pointing at its space/ folder",
        )
    files = {name: space_dir / name for name in SPACE_FILES}
    for path in sorted(pkg_dir.rglob("*")):
        rel = path.relative_to(pkg_dir)
        if path.is_file() and "__pycache__" not in rel.parts and path.suffix not in (".pyc", ".pyo"):
            files[f"hubgrpo/{rel.as_posix()}"] = path
    return files


def build_wheel(out_dir: Path, source: Path | None = None) -> Path:
    """Build hubgrpo's wheel from the source checkout this package runs from (``pip wheel --no-deps``; without
    build isolation when this environment's setuptools can build it, so no network is needed then)."""
    import subprocess
    import sys
    from importlib.metadata import PackageNotFoundError, version

    from hubgrpo import __version__
    from hubgrpo.layout import wheel_name

    source = Path(source or package_dir().parent)
    if not (source / "pyproject.toml").is_file():
        raise ConfigError(
            f"{source} is not a source checkout of hubgrpo (no pyproject.toml): no wheel to publish",
            hint="run `hubgrpo space deploy` from a git clone of hubgrpo",
        )
    try:
        local_setuptools = int(version("setuptools").split(".")[0]) >= 77
    except (PackageNotFoundError, ValueError):
        local_setuptools = False
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out_dir), str(source)]
    cmd += ["--no-build-isolation"] if local_setuptools else []
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    wheel = Path(out_dir) / wheel_name(__version__)
    if done.returncode != 0 or not wheel.is_file():
        raise ConfigError(
            f"building the hubgrpo wheel failed: {(done.stderr or done.stdout)[-1500:]}",
            hint="`pip wheel --no-deps .` in the checkout shows the whole error",
        )
    return wheel


def _hub_call(what: str, space_id: str, fn):
    """Run one HfApi call, mapping Hub errors onto hubgrpo's error tree (``store.hub_errors.map_error``)."""
    from hubgrpo.store.hub_errors import HUB_ERRORS, map_error

    try:
        return fn()
    except HUB_ERRORS as e:
        raise map_error(e, what=what, repo=space_id) from None


def deploy(
    repo: str,
    space_id: str,
    *,
    token: str | None,
    secret: str,
    endpoint: str | None = None,
    space_token: str | None = None,
    private: bool = True,
    space_dir: Path | None = None,
    api=None,
) -> dict:
    """Create or update Space ``space_id`` serving the coordinator of run repo ``repo``; returns a summary.

    ``token`` deploys (write access to the Space's namespace); ``space_token`` (default ``token``) becomes the
    Space's ``HF_TOKEN`` secret and must be able to write the run repo.
    """
    from huggingface_hub import HfApi

    if not token:
        raise AuthError(
            "deploying a Space needs a Hugging Face token with write access",
            hint="set HF_TOKEN (or run `hf auth login`) before `hubgrpo space deploy`",
        )
    if repo.count("/") != 1 or repo.startswith((".", "/", "~", "file://")):
        raise ConfigError(
            f"the run repo {repo!r} is not a Hub repo id (user/name)",
            hint="a Space can only coordinate a run repo on the Hub; create it with `hubgrpo init`",
        )
    endpoint = (endpoint or DEFAULT_ENDPOINT).rstrip("/")
    api = api or HfApi(endpoint=endpoint, token=token, library_name="hubgrpo")
    files = space_files(space_dir)
    with tempfile.TemporaryDirectory(prefix="hubgrpo-wheel-") as tmp:
        wheel = build_wheel(Path(tmp))
        files[f"{WHEELS_DIR}/{wheel.name}"] = wheel
        summary = _publish(
            api,
            repo,
            space_id,
            files,
            token=token,
            endpoint=endpoint,
            private=private,
            secrets={"HF_TOKEN": space_token or token, "HUBGRPO_SECRET": secret},
        )
    summary["wheel"] = space_wheel_url(space_id, endpoint, __version__)
    return summary


def _publish(
    api,
    repo: str,
    space_id: str,
    files: dict[str, Path],
    *,
    token: str,
    endpoint: str,
    private: bool,
    secrets: dict[str, str],
) -> dict:
    """Create the Space, commit ``files``, set its variables and secrets."""
    from huggingface_hub import CommitOperationAdd

    url = _hub_call(
        "create Space",
        space_id,
        lambda: api.create_repo(
            space_id, repo_type="space", space_sdk="gradio", private=private, exist_ok=True, token=token
        ),
    )
    ops = [CommitOperationAdd(path_in_repo=p, path_or_fileobj=str(f)) for p, f in files.items()]
    info = _hub_call(
        "upload the Space's files",
        space_id,
        lambda: api.create_commit(
            space_id, ops, commit_message=f"hubgrpo: coordinator for {repo}", repo_type="space", token=token
        ),
    )
    variables = {"HUBGRPO_REPO": repo}
    if endpoint != DEFAULT_ENDPOINT:
        variables["HF_ENDPOINT"] = endpoint
    for key, value in variables.items():
        _hub_call(
            f"set variable {key}",
            space_id,
            lambda: api.add_space_variable(
                space_id, key, value, description="set by hubgrpo space deploy", token=token
            ),
        )
    for key, value in secrets.items():
        _hub_call(
            f"set secret {key}",
            space_id,
            lambda: api.add_space_secret(space_id, key, value, description="set by hubgrpo space deploy", token=token),
        )
    return {
        "space": space_id,
        "url": str(url),
        "commit": info.oid,
        "files": len(files),
        "variables": sorted(variables),
        "secrets": sorted(secrets),
    }
