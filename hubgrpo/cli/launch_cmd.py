"""``hubgrpo launch`` (workers as Hugging Face Jobs) and ``hubgrpo jobs ls|logs|stop`` (this run's jobs)."""

from __future__ import annotations

import json
import os

import typer

jobs_app = typer.Typer(
    help="List, follow and cancel the HF Jobs of a run (the ones `hubgrpo launch` started).", no_args_is_help=True
)
REPO_HELP = "Run repo on the Hub (user/name); its jobs carry the label hubgrpo-run=<repo>."


def _api():
    from hubgrpo.launch.jobs import hf_api

    return hf_api(os.environ.get("HF_TOKEN") or _saved_token(), os.environ.get("HF_ENDPOINT"))


def _saved_token() -> str | None:
    from huggingface_hub import get_token

    return get_token()


def launch(
    repo: str = typer.Option(..., "--repo", help=REPO_HELP),
    coordinator: str = typer.Option(..., "--coordinator", help="The run's Space (user/name) or an https URL."),
    workers: int = typer.Option(1, "--workers", "-n", min=1, max=256, help="Jobs to start, one worker per GPU each."),
    flavor: str = typer.Option(
        "t4-small",
        "--flavor",
        help="HF Jobs hardware: cpu-basic, t4-small, l4x1, a10g-small, a100-large, h200, …; on a multi-GPU "
        "one (l4x4, a10g-largex2, h100x8) each job runs `hubgrpo worker --gpus all`: one worker per GPU",
    ),
    timeout: str = typer.Option("2h", "--timeout", help="Longest a job runs: 90m, 2h, 1d, or seconds."),
    image: str = typer.Option(
        None, "--image", help="Docker image (default: a CUDA PyTorch image for GPU flavors, python:3.12 for cpu-*)."
    ),
    install: str = typer.Option(
        "space",
        "--install",
        help="space: the wheel the run's Space publishes "
        "(`hubgrpo space deploy`); none: the image has hubgrpo; else a pip "
        "requirement or wheel URL.",
    ),
    allow_reward: list[str] = typer.Option([], "--allow-reward", help="Passed to each worker (repeatable)."),
    pipeline: bool = typer.Option(
        None, "--pipeline/--no-pipeline", help="Passed to each worker (default: the run config's worker.pipeline)."
    ),
    prefix: str = typer.Option(
        "job", "--prefix", help="Worker names: PREFIX-<i>-<hex> (with -gpuN on multi-GPU flavors)."
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the job specs; start nothing."),
    as_json: bool = typer.Option(False, "--json", help="With --dry-run: the specs as JSON."),
) -> None:
    """Start N workers of a run on Hugging Face Jobs. Your token goes to each job as the secret HF_TOKEN, never
    in its command or environment; the jobs carry the label hubgrpo-run so `hubgrpo jobs` finds them."""
    from hubgrpo.config.recipe import pipeline_flag
    from hubgrpo.launch import jobs

    worker_args = [a for r in allow_reward for a in ("--allow-reward", r)] + pipeline_flag(pipeline)
    specs = jobs.worker_specs(
        repo,
        coordinator,
        workers=workers,
        flavor=flavor,
        timeout=timeout,
        image=image,
        install=install,
        endpoint=os.environ.get("HF_ENDPOINT"),
        worker_args=worker_args,
        prefix=prefix,
    )
    if dry_run:
        shown = [s.shown() for s in specs]
        typer.echo(json.dumps(shown, indent=2) if as_json else "\n\n".join(_describe(s) for s in shown))
        return
    api = _api()
    if install == "space":
        _check_space_owner(api, coordinator)
        _check_wheel(api, coordinator)
    started = jobs.start(specs, token=api.token, api=api)
    for spec, job in zip(specs, started):
        typer.echo(f"{spec.name}: job {job.id} ({job.status.stage}) {job.url}")
    typer.echo(
        f"follow: hubgrpo jobs logs --repo {repo} --worker {specs[0].name} --follow\n"
        f"stop:   hubgrpo jobs stop --repo {repo}"
    )


def _describe(spec: dict) -> str:
    lines = [
        f"job {spec['name']}: {spec['image']} on {spec['flavor']}, timeout {spec['timeout']}",
        f"  command: {spec['command'][-1]}",
        f"  env: {spec['env']}",
        f"  secrets: {', '.join(spec['secrets'])} (your token)",
        f"  labels: {spec['labels']}",
    ]
    return "\n".join(lines)


def _check_space_owner(api, space_id: str) -> None:
    """``--install space`` runs the Space's wheel in each job with your HF_TOKEN: only a Space in your namespace
    (your name or one of your orgs) is trusted with that; a coordinator someone gave you is not."""
    from hubgrpo.errors import ConfigError

    me = api.whoami()
    mine = {me.get("name")} | {o.get("name") for o in me.get("orgs") or [] if isinstance(o, dict)}
    if space_id.split("/")[0] not in mine:
        raise ConfigError(
            f"--install space would run the code that {space_id} publishes in each job, with your "
            f"HF_TOKEN; that Space is not in your namespace ({', '.join(sorted(filter(None, mine)))})",
            hint="install a hubgrpo you trust: --install 'hubgrpo==VERSION' or a wheel URL (if you "
            "trust that Space's owner with your token: --install <its wheel URL>), or --install "
            "none with an image that has hubgrpo",
        )


def _check_wheel(api, space_id: str) -> None:
    from hubgrpo import __version__
    from hubgrpo.errors import ConfigError
    from hubgrpo.layout import WHEELS_DIR, wheel_name

    path = f"{WHEELS_DIR}/{wheel_name(__version__)}"
    if not api.file_exists(space_id, path, repo_type="space"):
        raise ConfigError(
            f"the Space {space_id} does not publish {path} (the hubgrpo you are running)",
            hint=f"run `hubgrpo space deploy --repo RUN --space {space_id}` with this hubgrpo, or "
            "pass --install with a pip requirement",
        )


@jobs_app.command("ls")
def jobs_ls(
    repo: str = typer.Option(..., "--repo", help=REPO_HELP),
    active: bool = typer.Option(False, "--active", help="Only scheduling or running jobs."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """List this run's jobs, newest first."""
    from hubgrpo.launch.jobs import job_row, run_jobs

    rows = [job_row(j) for j in run_jobs(_api(), repo, active_only=active)]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    for r in rows:
        typer.echo(f"{r['id']}  {r['worker']:<20} {r['stage']:<10} {r['flavor'] or '':<12} {r['created']}  {r['url']}")
    if not rows:
        typer.echo(f"no jobs for {repo}")


@jobs_app.command("logs")
def jobs_logs(
    repo: str = typer.Option(..., "--repo", help=REPO_HELP),
    worker: str = typer.Option(None, "--worker", help="The worker name (default: the newest job)."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing until the job ends."),
) -> None:
    """Print the logs of one of this run's jobs."""
    from hubgrpo.errors import ConfigError
    from hubgrpo.launch.jobs import WORKER_LABEL, run_jobs

    api = _api()
    found = [j for j in run_jobs(api, repo) if worker is None or (j.labels or {}).get(WORKER_LABEL) == worker]
    if not found:
        raise ConfigError(
            f"no job of {repo}" + (f" runs worker {worker!r}" if worker else ""),
            hint=f"`hubgrpo jobs ls --repo {repo}` lists them",
        )
    for line in api.fetch_job_logs(job_id=found[0].id, follow=follow):
        typer.echo(line)


@jobs_app.command("stop")
def jobs_stop(repo: str = typer.Option(..., "--repo", help=REPO_HELP)) -> None:
    """Cancel every scheduling or running job of this run."""
    from hubgrpo.launch.jobs import stop

    ids = stop(_api(), repo)
    typer.echo(f"cancelled {len(ids)} job(s)" + (": " + ", ".join(ids) if ids else ""))


def register(app: typer.Typer) -> None:
    app.command()(launch)
    app.add_typer(jobs_app, name="jobs")
