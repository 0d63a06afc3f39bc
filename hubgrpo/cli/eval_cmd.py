"""``hubgrpo evaluate``: held-out scores of every version, recorded with the coordinator; ``--verify``:
proof-of-rollouts verdicts on admitted rounds instead (``hubgrpo.worker.verifier``)."""

from __future__ import annotations

import logging
import os

import typer

from hubgrpo.cli.run_cmd import ALLOW_HELP, REPO_HELP, _store


def evaluate(
    repo: str = typer.Option(..., "--repo", help=REPO_HELP),
    coordinator: str = typer.Option(
        None, "--coordinator", help="Coordinator URL or Space id (default: coordinator.url of the run's config)."
    ),
    once: bool = typer.Option(
        False,
        "--once",
        help="Score the versions there are now, then exit (default: follow new versions until the run is finished).",
    ),
    samples: int = typer.Option(16, "--samples", min=1, max=100_000, help="Held-out prompts per version (greedy)."),
    threads: int = typer.Option(None, "--threads", help="torch threads (default: all cores)."),
    allow_reward: list[str] = typer.Option([], "--allow-reward", help=ALLOW_HELP),
    verify: bool = typer.Option(
        False,
        "--verify",
        help="Instead of scoring versions, replay a sample of every admitted round with its leased version and record "
        "a verdict (proof of rollouts; the run needs coordinator.verify other than off).",
    ),
    verbose: bool = typer.Option(True, "--verbose/--quiet"),
) -> None:
    """Score every version without a held-out score on the run's held-out prompts and record it with the
    coordinator (HF_TOKEN, like a worker; on a Space only coordinator.evaluators may)."""
    from hubgrpo import runrepo
    from hubgrpo.errors import ConfigError
    from hubgrpo.worker.client import CoordinatorClient
    from hubgrpo.worker.evaluator import Evaluator
    from hubgrpo.worker.orphans import orphan_aware_sleep

    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    store = _store(repo)
    url = coordinator or runrepo.read_config(store).coordinator.url
    if not url:
        raise ConfigError("no coordinator given", hint="pass --coordinator URL_OR_SPACE or set coordinator.url")
    client = CoordinatorClient(url, token=os.environ.get("HF_TOKEN"), sleep=orphan_aware_sleep)
    if verify:
        from hubgrpo.worker.verifier import Verifier

        vf = Verifier(store, client, threads=threads, allow_code=allow_reward, sleep=orphan_aware_sleep)
        checked = vf.run(once=once)
        typer.echo(f"verified {len(checked)} rounds, {sum(not r['passed'] for r in checked)} failed")
        for r in checked:
            verdict = "passed" if r["passed"] else f"FAILED ({r['reason']})"
            typer.echo(f"  {r['submission_id']}  {r['checked']} tokens checked  {verdict}  {r.get('status')}")
        return
    ev = Evaluator(store, client, samples=samples, threads=threads, allow_code=allow_reward, sleep=orphan_aware_sleep)
    results = ev.run(once=once)
    mean = sum(ev.seconds) / len(ev.seconds) if ev.seconds else 0.0
    typer.echo(f"evaluated {len(results)} versions ({mean:.2f} s per version)")
    for r in results:
        typer.echo(
            f"  v{r['version']:06d}  held-out reward {r['eval_reward']:.4f} on {r['samples']} prompts  "
            f"{r.get('status')}"
        )


def register(app: typer.Typer) -> None:
    app.command("evaluate")(evaluate)
