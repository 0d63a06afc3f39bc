"""``hubgrpo gc``: reclaim a run repo's history (``hubgrpo.coordinator.gc``)."""

from __future__ import annotations

import typer

from hubgrpo.cli.run_cmd import REPO_HELP, _store


def gc(
    repo: str = typer.Option(..., "--repo", help=REPO_HELP),
    keep: int = typer.Option(..., "--keep", min=1, help="Versions that stay loadable by their tag (the newest)."),
    yes: bool = typer.Option(False, "--yes", help="Do it (without it: print what would happen)."),
    force: bool = typer.Option(
        False,
        "--force",
        help="Run even though the run looks live (something was written within 2 x coordinator.round_timeout_s).",
    ),
) -> None:
    """Reclaim the run repo's history: one commit for the head, the newest KEEP version tags kept (each on a
    commit with its adapter, config, state and card), every other version tag and the data only they held gone.
    Stop the coordinator first (gc refuses while the run looks live); irreversible. After a failure, run it again:
    no kept version is lost on the way."""
    from hubgrpo.coordinator.gc import collect

    report = collect(_store(repo), keep, dry_run=not yes, force=force)
    verb = "would keep" if not yes else "kept"
    typer.echo(
        f"{verb} {len(report['kept'])} versions ({', '.join(report['kept'])}); "
        f"{'would drop' if not yes else 'dropped'} {len(report['dropped'])} version tags; "
        f"history {report['commits_before']} commits -> {report.get('commits_after', 1)}"
    )
    if not yes:
        if report["live"]:
            typer.echo(f"the run looks live ({report['live']}): --yes will refuse; stop the coordinator first")
        typer.echo("nothing changed: pass --yes to rewrite the history (stop the coordinator first)")


def register(app: typer.Typer) -> None:
    app.command("gc")(gc)
