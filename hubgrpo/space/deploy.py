"""``hubgrpo space deploy``: put the coordinator on a Hugging Face Space (no gradio import here).

One call does it all, against the Hub or any Hub-compatible endpoint:

1. ``create_repo(space, repo_type="space", space_sdk="gradio", exist_ok=True)`` (private unless asked otherwise);
2. ONE commit with ``space/`` (``app.py``, ``README.md`` with the Space YAML, ``requirements.txt``) at the Space's
   root, plus the hubgrpo package source as ``hubgrpo/`` — the Space imports it from its working directory, so the
   coordinator always runs exactly the code that deployed it (no PyPI release needed);
3. the Space variable ``HUBGRPO_REPO`` (the run repo; ``HF_ENDPOINT`` too when it is not huggingface.co) and the
   Space secrets ``HF_TOKEN`` (the token the coordinator writes merges with) and ``HUBGRPO_SECRET`` (signs leases;
   the same secret as a local coordinator of this run, so leases survive the move).

Tokens are sent only to the Hub's secrets endpoint; they are never printed or written into files.
"""

from __future__ import annotations

from pathlib import Path

from hubgrpo.errors import AuthError, ConfigError

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
        raise ConfigError(f"{space_dir} lacks {', '.join(missing)}: the Space's files come from a source checkout",
                          hint="run from a git clone of hubgrpo, or pass --space-dir pointing at its space/ folder")
    files = {name: space_dir / name for name in SPACE_FILES}
    for path in sorted(pkg_dir.rglob("*")):
        rel = path.relative_to(pkg_dir)
        if path.is_file() and "__pycache__" not in rel.parts and path.suffix not in (".pyc", ".pyo"):
            files[f"hubgrpo/{rel.as_posix()}"] = path
    return files


def _hub_call(what: str, space_id: str, fn):
    """Run one HfApi call, mapping Hub errors onto hubgrpo's error tree (``store.hub.map_error``)."""
    from hubgrpo.store.hub import HUB_ERRORS, map_error

    try:
        return fn()
    except HUB_ERRORS as e:
        raise map_error(e, what=what, repo=space_id) from None


def deploy(repo: str, space_id: str, *, token: str | None, secret: str, endpoint: str | None = None,
           space_token: str | None = None, private: bool = True, space_dir: Path | None = None,
           api=None) -> dict:
    """Create or update Space ``space_id`` serving the coordinator of run repo ``repo``; returns a summary.

    ``token`` deploys (write access to the Space's namespace); ``space_token`` (default ``token``) becomes the
    Space's ``HF_TOKEN`` secret and must be able to write the run repo.
    """
    from huggingface_hub import CommitOperationAdd, HfApi

    if not token:
        raise AuthError("deploying a Space needs a Hugging Face token with write access",
                        hint="set HF_TOKEN (or run `hf auth login`) before `hubgrpo space deploy`")
    if repo.count("/") != 1 or repo.startswith((".", "/", "~", "file://")):
        raise ConfigError(f"the run repo {repo!r} is not a Hub repo id (user/name)",
                          hint="a Space can only coordinate a run repo on the Hub; create it with `hubgrpo init`")
    endpoint = (endpoint or DEFAULT_ENDPOINT).rstrip("/")
    api = api or HfApi(endpoint=endpoint, token=token, library_name="hubgrpo")
    files = space_files(space_dir)
    url = _hub_call("create Space", space_id, lambda: api.create_repo(
        space_id, repo_type="space", space_sdk="gradio", private=private, exist_ok=True, token=token))
    ops = [CommitOperationAdd(path_in_repo=p, path_or_fileobj=str(f)) for p, f in files.items()]
    info = _hub_call("upload the Space's files", space_id, lambda: api.create_commit(
        space_id, ops, commit_message=f"hubgrpo: coordinator for {repo}", repo_type="space", token=token))
    variables = {"HUBGRPO_REPO": repo}
    if endpoint != DEFAULT_ENDPOINT:
        variables["HF_ENDPOINT"] = endpoint
    for key, value in variables.items():
        _hub_call(f"set variable {key}", space_id, lambda: api.add_space_variable(
            space_id, key, value, description="set by hubgrpo space deploy", token=token))
    secrets = {"HF_TOKEN": space_token or token, "HUBGRPO_SECRET": secret}
    for key, value in secrets.items():
        _hub_call(f"set secret {key}", space_id, lambda: api.add_space_secret(
            space_id, key, value, description="set by hubgrpo space deploy", token=token))
    return {"space": space_id, "url": str(url), "commit": info.oid, "files": len(files),
            "variables": sorted(variables), "secrets": sorted(secrets)}
