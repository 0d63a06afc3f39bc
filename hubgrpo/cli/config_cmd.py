"""``hubgrpo config validate|show|fields``: check and print configs without running anything."""

from __future__ import annotations

from pathlib import Path

import typer

config_app = typer.Typer(help="Validate and show config files.", no_args_is_help=True)

SET_HELP = "Override a field, e.g. --set params.learning_rate=1e-4 (repeatable; value parsed as YAML)."


def load_checked(file: Path, overrides: list[str], *, warn: bool = True):
    """The config in ``file`` with ``overrides``, refused (``ConfigError``) when its task would fail on every
    worker (``hubgrpo.task.preflight``): what ``validate``, ``init``, ``run``, ``train`` and ``simulate`` load.
    ``warn``: log a warning for each key given at a place it moved from."""
    from hubgrpo.config import load_config
    from hubgrpo.task.preflight import check_task

    cfg = load_config(file, overrides=overrides, warn=warn)
    check_task(cfg, str(file))
    return cfg


@config_app.command("validate")
def validate(
    file: Path = typer.Argument(..., help="YAML config file."),
    set_: list[str] = typer.Option([], "--set", help=SET_HELP),
    repo: str = typer.Option(
        None,
        "--repo",
        help="The run repo it is for (default hub.repo_id): on the "
        "Hub, also say what `hubgrpo init` changes to fit its commit quota.",
    ),
) -> None:
    """Exit 0 when FILE is a valid config; otherwise print every problem with its key path and line. For a run
    repo on the Hub, a config `hubgrpo init` would refuse there fails too, and what init would change is printed
    as warnings, and so is each key written at a place it moved from (still accepted)."""
    from hubgrpo.config import deprecations, shown
    from hubgrpo.config.recipe import describe

    cfg = load_checked(file, set_, warn=False)
    for note in deprecations(cfg):
        typer.echo(f"warning: deprecated: {note}", err=True)
    what = {
        k: shown(cfg, k, v)
        for k, v in (("project_name", cfg.project_name), ("base_model", cfg.base_model), ("data.path", cfg.data.path))
    }
    for line in _hub_fit_lines(cfg, repo or cfg.hub.repo_id):
        if line.startswith("changed "):
            line = "on the Hub, `hubgrpo init` changes " + line[len("changed ") :]
        typer.echo(f"warning: {line}", err=True)
    typer.echo(
        f"{file}: ok (project {what['project_name']}, base model {what['base_model']}, "
        f"data {what['data.path']})\n{describe(cfg)}"
    )


def _hub_fit_lines(cfg, repo: str | None) -> list[str]:
    """``hubgrpo init``'s lines for ``repo`` when it is on the Hub (``init_quota.fit_to_store``; no I/O)."""
    if not repo or repo.startswith("s3://"):
        return []
    from hubgrpo.cli.init_quota import fit_to_store
    from hubgrpo.store import open_store

    return fit_to_store(cfg, open_store(repo))[1]


@config_app.command("show")
def show(
    file: Path = typer.Argument(..., help="YAML config file."),
    set_: list[str] = typer.Option([], "--set", help=SET_HELP),
) -> None:
    """Print the resolved config (defaults filled, overrides applied; secrets redacted, and every value taken from
    the environment shown as its ${VAR} placeholder), after a first line that names its recipe and where it
    differs from the default one."""
    from hubgrpo.config import load_config, to_yaml
    from hubgrpo.config.recipe import describe

    cfg = load_config(file, overrides=set_)
    typer.echo(f"# {describe(cfg)}\n{to_yaml(cfg)}", nl=False)


@config_app.command("fields")
def fields(
    markdown: bool = typer.Option(
        False, "--markdown", help="Print docs/config.md (Markdown tables) instead of one line per key."
    ),
) -> None:
    """List every config key with its default and meaning."""
    if markdown:
        from hubgrpo.config.reference import markdown as reference

        typer.echo(reference(), nl=False)
        return
    from hubgrpo.config import field_docs

    for key, default, doc in field_docs():
        typer.echo(f"{key:38s} {default:24s} {doc}")


def register(app: typer.Typer) -> None:
    app.add_typer(config_app, name="config")
