"""``hubgrpo space`` (serve the coordinator with its web UI) and ``hubgrpo space deploy`` (put it on a Space).

``hubgrpo space --repo REPO`` is ``hubgrpo coordinator`` plus the page (leaderboard, reward curves, versions,
leases, refusals, config) and the ``upload`` endpoint; it authenticates workers (``hubgrpo.space.auth``) unless the run
repo has no Hub owner (a local folder, S3) and no ``coordinator.allowed_users`` — then it serves a loopback address
only. ``hubgrpo coordinator`` is the UI-less API server: open on loopback for trusted local runs (``hubgrpo run``
uses the same code path), authenticated like the Space on any other address.
"""

from __future__ import annotations

import os
from pathlib import Path

import typer

REPO_HELP = "Run repo: user/name on the Hub (honours HF_ENDPOINT, HF_TOKEN), or a local path."

space_app = typer.Typer(
    help="The coordinator as a Gradio app with its web UI; `deploy` puts it on a Space.",
    invoke_without_command=True,
    no_args_is_help=False,
)


@space_app.callback()
def space(
    ctx: typer.Context,
    repo: str = typer.Option(None, "--repo", help=REPO_HELP),
    host: str = typer.Option("127.0.0.1", help="Interface to listen on (0.0.0.0 for every interface)."),
    port: int = typer.Option(7860, help="Port (0 = any free port)."),
    refresh_s: float = typer.Option(5.0, "--refresh-s", help="UI refresh interval in seconds."),
    batch_size: int = typer.Option(8, "--batch-size", min=1, help="Commit uploaded submissions when this many wait."),
    batch_wait_s: float = typer.Option(5.0, "--batch-wait-s", min=0.0, help="... or this long after the first."),
    allow_reward: list[str] = typer.Option(
        [],
        "--allow-reward",
        help="A non-built-in reward function of "
        "the run's config that the coordinator may run to recompute "
        "rewards (repeatable). Built-ins always run.",
    ),
    verbose: bool = typer.Option(True, "--verbose/--quiet"),
) -> None:
    """Serve the coordinator API + web UI for a run repo (Ctrl-C to stop)."""
    if ctx.invoked_subcommand is not None:
        return
    from hubgrpo.cli.numbers import require_finite

    require_finite({"--refresh-s": refresh_s, "--batch-wait-s": batch_wait_s}, positive=("--refresh-s",))
    if not repo:
        from hubgrpo.errors import ConfigError

        raise ConfigError("no run repo given", hint="hubgrpo space --repo user/name (or a local path)")
    import logging
    import time

    from hubgrpo.cli.embedded import coordinator_secret
    from hubgrpo.coordinator.core import Coordinator
    from hubgrpo.coordinator.workdir import for_store
    from hubgrpo.space.api import stop
    from hubgrpo.space.app import serve_space
    from hubgrpo.space.auth import make_auth
    from hubgrpo.space.guard import check_exposure
    from hubgrpo.store import open_store

    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    store = open_store(repo, token=os.environ.get("HF_TOKEN"), endpoint=os.environ.get("HF_ENDPOINT"))
    coord = Coordinator(store, coordinator_secret(store), allow_code=allow_reward, workdir=for_store(store.location))
    auth = make_auth(coord)
    check_exposure(host, auth)  # no Hub owner and no coordinator.allowed_users: loopback only
    app, url = serve_space(
        coord, host=host, port=port, auth=auth, refresh_s=refresh_s, batch_size=batch_size, batch_wait_s=batch_wait_s
    )
    typer.echo(f"coordinator + UI for {store.location} at {url} (auth {'on' if auth else 'OFF'})")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        stop(app, coord)  # queued uploads, a last checkpoint (a stop loses no live version), then close


@space_app.command("deploy")
def deploy(
    repo: str = typer.Option(..., "--repo", help="Run repo on the Hub (user/name)."),
    space_id: str = typer.Option(..., "--space", help="Space to create or update (user/name)."),
    public: bool = typer.Option(False, "--public/--private", help="Space visibility (default private)."),
    space_token_env: str = typer.Option(
        None,
        "--space-token-env",
        help="Name of an environment variable "
        "holding the token the Space writes the run repo with "
        "(default: HF_TOKEN).",
    ),
    space_dir: Path = typer.Option(
        None,
        "--space-dir",
        help="Folder with app.py, README.md and requirements.txt (default: space/ of this checkout).",
    ),
) -> None:
    """Create/update a Gradio Space that coordinates REPO: files, HUBGRPO_REPO variable, HF_TOKEN and
    HUBGRPO_SECRET secrets."""
    from hubgrpo.cli.embedded import coordinator_secret
    from hubgrpo.space.deploy import deploy as deploy_space
    from hubgrpo.store import open_store

    token, endpoint = os.environ.get("HF_TOKEN"), os.environ.get("HF_ENDPOINT")
    secret = coordinator_secret(open_store(repo, token=token, endpoint=endpoint)).decode()
    space_token = os.environ.get(space_token_env) if space_token_env else None
    if space_token_env and not space_token:
        from hubgrpo.errors import ConfigError

        raise ConfigError(
            f"--space-token-env {space_token_env}: that environment variable is empty",
            hint=f"export {space_token_env}=<a token with write access to {repo}>",
        )
    out = deploy_space(
        repo,
        space_id,
        token=token,
        secret=secret,
        endpoint=endpoint,
        space_token=space_token,
        private=not public,
        space_dir=space_dir,
    )
    typer.echo(
        f"deployed {out['files']} files to {out['url']} (commit {out['commit'][:12]}); "
        f"variables {', '.join(out['variables'])}; secrets {', '.join(out['secrets'])}\n"
        f"workers install the matching hubgrpo with: pip install {out['wheel']}\n"
        f"start workers on HF Jobs: hubgrpo launch --repo {repo} --coordinator {space_id} --workers N "
        "--flavor t4-small"
    )


def register(app: typer.Typer) -> None:
    """Add ``hubgrpo space`` (and ``hubgrpo space deploy``) to the CLI."""
    app.add_typer(space_app, name="space")
