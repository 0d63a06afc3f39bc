"""``hubgrpo init | coordinator | worker | run | status | push``: the distributed run from the command line."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

import typer

SET_HELP = "Override a config field, e.g. --set rounds.versions=5 (repeatable)."
REPO_HELP = "Run repo: user/name on the Hub (honours HF_ENDPOINT, HF_TOKEN), or a local path / file://path."
ALLOW_HELP = (
    "A non-built-in reward function of the run's config (module:function or file.py:function) that this "
    "process may run (repeatable). Built-ins always run."
)
GPUS_HELP = (
    "all, or GPU indices like 0,1: one worker process per GPU, named NAME-gpuN, each with its own lease and "
    "CUDA_VISIBLE_DEVICES set to its GPU (threads default to cores / GPUs). Exits non-zero if any worker failed."
)


def _store(repo: str):
    from hubgrpo.store import open_store

    return open_store(repo, token=os.environ.get("HF_TOKEN"), endpoint=os.environ.get("HF_ENDPOINT"))


def _logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )


def init(
    config: Path = typer.Argument(..., help="YAML config file."),
    repo: str = typer.Option(None, "--repo", help=REPO_HELP + " Default: hub.repo_id, else runs/<project>."),
    set_: list[str] = typer.Option([], "--set", help=SET_HELP),
    force: bool = typer.Option(False, "--force", help="Start over in a repo that already holds a run."),
) -> None:
    """Create the run repo: config, version-0 adapter (equal to the base model), state and model card. On the Hub
    the config is first fitted to the commit quota (printed: what changed and why; refused if it cannot fit)."""
    from hubgrpo.cli.config_cmd import load_checked
    from hubgrpo.cli.embedded import ensure_repo
    from hubgrpo.cli.init_quota import fit_to_store, holds_run, hourly_quota

    cfg = load_checked(config, set_)
    repo = repo or cfg.hub.repo_id or f"./runs/{cfg.project_name}"
    store = _store(repo)
    cfg, lines = fit_to_store(cfg, store)  # before anything is read or created
    if holds_run(store) and not force:
        from hubgrpo.errors import StoreError

        raise StoreError(f"{repo} already holds a hubgrpo run", hint="pass --force to start over, or use a new repo")
    if lines:
        typer.echo(
            f"{repo} is on the Hub (about {hourly_quota(store)} commits an hour per repo); the config is "
            "fitted to it:\n  " + "\n  ".join(lines)
        )
    ensure_repo(store, cfg, force=force)
    typer.echo(
        f"initialised {store.location} (version 0)\nnext:\n"
        f"  hubgrpo coordinator --repo {repo}\n  hubgrpo worker --repo {repo} --coordinator URL\n"
        f"  or, all on this machine: hubgrpo run {config} --repo {repo}"
    )


def coordinator(
    repo: str = typer.Option(..., "--repo", help=REPO_HELP),
    host: str = typer.Option("127.0.0.1", help="Interface to listen on."),
    port: int = typer.Option(7860, help="Port (0 = any free port)."),
    allow_reward: list[str] = typer.Option(
        [], "--allow-reward", help=ALLOW_HELP + " The coordinator recomputes every round's rewards with them."
    ),
    verbose: bool = typer.Option(True, "--verbose/--quiet"),
) -> None:
    """Serve the coordinator API (lease, heartbeat, release, submit, status, record_eval, upload) for a run repo: open
    on a loopback address (a trusted local run); elsewhere only with auth (coordinator.allowed_users, default the Hub
    repo's owner), like `hubgrpo space`."""
    import time

    from hubgrpo.cli.embedded import coordinator_secret
    from hubgrpo.coordinator.core import Coordinator
    from hubgrpo.coordinator.workdir import for_store
    from hubgrpo.space.api import serve, stop
    from hubgrpo.space.auth import make_auth
    from hubgrpo.space.guard import is_loopback

    _logging(verbose)
    store = _store(repo)
    coord = Coordinator(store, coordinator_secret(store), allow_code=allow_reward, workdir=for_store(store.location))
    auth = None if is_loopback(host) else make_auth(coord)
    app, url = serve(coord, host=host, port=port, auth=auth, uploads=True)  # no non-loopback host without auth
    typer.echo(f"coordinator for {store.location} at {url}" + ("" if auth is None else " (auth on)"))
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        stop(app, coord)  # queued uploads, a last checkpoint (a stop loses no live version), then close


def worker(
    repo: str = typer.Option(..., "--repo", help=REPO_HELP),
    coordinator: str = typer.Option(
        None, "--coordinator", help="Coordinator URL or Space id (default: coordinator.url of the run's config)."
    ),
    name: str = typer.Option(None, "--name", help="Worker name (default: host name)."),
    max_rounds: int = typer.Option(None, "--max-rounds", help="Stop after this many rounds."),
    threads: int = typer.Option(None, "--threads", help="torch threads (default: all cores)."),
    upload_via: str = typer.Option(
        None,
        "--upload-via",
        help="store: commit submissions to the run "
        "repo (or put them in its hub.submissions inbox); coordinator: upload them "
        "to the coordinator (no write access). Default: coordinator when the "
        "run's hub.submissions is `coordinator`, else store.",
    ),
    allow_reward: list[str] = typer.Option([], "--allow-reward", help=ALLOW_HELP),
    gpus: str = typer.Option(None, "--gpus", help=GPUS_HELP),
    device: str = typer.Option(
        None,
        "--device",
        help="torch device of this worker: cpu, cuda, cuda:1, mps (default: the run config's worker.device, auto). "
        "With --gpus each worker gets its one GPU as cuda.",
    ),
    pipeline: bool = typer.Option(
        None,
        "--pipeline/--no-pipeline",
        help="Deliver each round while the next one trains, and ask the next lease ahead (the run allows it with "
        "coordinator.leases_per_worker ≥ 2 and a stale round admitted: merge.max_staleness, "
        "merge.staleness_per_worker or merge.rebase); --no-pipeline: lease, train, deliver, submit in sequence. "
        "Default: the run config's worker.pipeline (off unless the config turns it on: its rounds start from an older "
        "version, which wins on some tasks and loses on others; benchmarks/speedup/).",
    ),
    wait: float = typer.Option(
        0.0,
        "--wait",
        min=0,
        help="Wait up to this many seconds for the coordinator to answer and the run repo to hold a run (a worker "
        "started beside its run); the training libraries load meanwhile. Default 0: read the run at once.",
    ),
    verbose: bool = typer.Option(True, "--verbose/--quiet"),
) -> None:
    """Lease rounds, train them with GRPO + LoRA, push the adapters, submit — until the run finishes.

    Runs only built-in reward functions unless --allow-reward names the run's others."""
    import secrets
    import socket

    from hubgrpo.errors import ConfigError

    chosen = _chosen_gpus(gpus)  # first: a bad --gpus is refused before anything is read
    _check_device(device, chosen is not None)
    _logging(verbose)
    store = _store(repo)
    cfg, url = _run_of(store, coordinator, wait, preload=chosen is None)
    if not url:
        raise ConfigError("no coordinator given", hint="pass --coordinator URL_OR_SPACE or set coordinator.url")
    if not name:  # unique per process: two GPUs of one host must not share a name
        host = "".join(c if c.isalnum() or c in "-_." else "-" for c in socket.gethostname())[:40].strip("-.")
        name = f"{host or 'worker'}-{secrets.token_hex(2)}"
    if chosen is not None:
        from hubgrpo.config.recipe import pipeline_flag

        rest = pipeline_flag(pipeline)
        if (device or cfg.worker.device) != "auto":  # each child sees its one GPU, as cuda:0 (gpus.py); the
            rest += ["--device", "cuda"]  # run's cuda:1, cpu or mps would fail there or leave the GPU idle
        raise typer.Exit(
            _per_gpu(chosen, name, repo, url, max_rounds, threads, upload_via, allow_reward, verbose, rest)
        )
    from hubgrpo.worker.client import CoordinatorClient
    from hubgrpo.worker.loop import Worker
    from hubgrpo.worker.orphans import orphan_aware_sleep

    client = CoordinatorClient(url, token=os.environ.get("HF_TOKEN"), sleep=orphan_aware_sleep)
    typer.echo(f"{name}: rewards {', '.join(r.function for r in cfg.rewards)}; coordinator {url}", err=True)
    results = Worker(
        store,
        client,
        name=name,
        max_rounds=max_rounds,
        threads=threads,
        device=device,
        upload_via=upload_via,
        allow_code=allow_reward,
        sleep=orphan_aware_sleep,
        pipeline=pipeline,
    ).run()
    typer.echo(f"{name}: {len(results)} rounds submitted")


def _run_of(store, coordinator: str | None, wait: float, *, preload: bool):
    """The run's config and the coordinator's URL: read at once, or (``--wait``) once both are up, after the
    training libraries are imported (``preload``: this process trains)."""
    from hubgrpo import runrepo
    from hubgrpo.worker.orphans import orphan_aware_sleep

    if not wait:
        cfg = runrepo.read_config(store)
        return cfg, coordinator or cfg.coordinator.url
    from hubgrpo.worker import startup

    if preload:
        startup.preload()
    return startup.wait_for_run(store, coordinator, wait, token=os.environ.get("HF_TOKEN"), sleep=orphan_aware_sleep)


DEVICE = re.compile(r"auto|cpu|mps|cuda(:\d{1,3})?")


def _check_device(device: str | None, per_gpu: bool) -> None:
    """``--device``: a torch device this command knows; with ``--gpus`` only ``auto`` or ``cuda``."""
    from hubgrpo.errors import ConfigError

    if device is None:
        return
    if not DEVICE.fullmatch(device):
        raise ConfigError(f"--device {device!r} is no device", hint="use auto, cpu, cuda, cuda:N or mps")
    if per_gpu and device not in ("auto", "cuda"):
        raise ConfigError(
            f"--gpus runs one worker per GPU, each on its own, and --device {device} names another",
            hint="drop --device (or give cuda)",
        )


def _chosen_gpus(spec: str | None) -> list[tuple[int, str]] | None:
    if spec is None:
        return None
    from hubgrpo.cli.gpus import choose, visible

    return choose(spec, visible())


def _per_gpu(chosen, name, repo, url, max_rounds, threads, upload_via, allow_reward, verbose, extra) -> int:
    """``hubgrpo worker --gpus``: this command once per chosen GPU (without --gpus), supervised; its exit status."""
    import sys

    from hubgrpo.cli.gpus import supervise

    threads = threads or max(1, (os.cpu_count() or 1) // len(chosen))
    rest = ["--repo", repo, "--coordinator", url, "--threads", str(threads), "--verbose" if verbose else "--quiet"]
    rest += ["--max-rounds", str(max_rounds)] if max_rounds is not None else []
    rest += ["--upload-via", upload_via] if upload_via else []
    rest += [x for f in allow_reward for x in ("--allow-reward", f)] + list(extra)
    return supervise(
        chosen, name, lambda child: [sys.executable, "-m", "hubgrpo.cli", "worker", "--name", child, *rest]
    )


def run(
    config: Path = typer.Argument(..., help="YAML config file."),
    workers: int = typer.Option(2, "--workers", "-n", min=1, help="Worker processes on this machine."),
    repo: str = typer.Option(None, "--repo", help=REPO_HELP + " Default: ./runs/<project_name>."),
    set_: list[str] = typer.Option([], "--set", help=SET_HELP),
    force: bool = typer.Option(False, "--force", help="Start over in a repo that already holds a run."),
    max_wall_s: float = typer.Option(None, "--max-wall-s", help="Stop after this many seconds."),
    evaluate: bool = typer.Option(
        True, "--eval/--no-eval", help="Run `hubgrpo evaluate` beside the workers: a held-out score for every version."
    ),
    eval_samples: int = typer.Option(16, "--eval-samples", min=1, help="Held-out prompts per version."),
    pipeline: bool = typer.Option(
        None,
        "--pipeline/--no-pipeline",
        help="The workers' --pipeline (hubgrpo worker --help), local or HF Jobs. Default: the config's "
        "worker.pipeline.",
    ),
) -> None:
    """A whole run: coordinator on 127.0.0.1 + N local workers (+ an evaluator) until rounds.versions versions;
    with `backend: hf-jobs` the coordinator on a Space and backend_options.workers HF Jobs instead."""
    from hubgrpo.cli.config_cmd import load_checked
    from hubgrpo.cli.embedded import run as run_all
    from hubgrpo.cli.numbers import require_finite
    from hubgrpo.cli.report import print_run_report

    require_finite({"--max-wall-s": max_wall_s}, positive=("--max-wall-s",))
    _logging(False)
    cfg = load_checked(config, set_)
    if cfg.backend == "hf-jobs":
        from hubgrpo.cli.jobs_run import run_on_jobs
        from hubgrpo.errors import ConfigError

        repo = repo or cfg.hub.repo_id
        if not repo:
            raise ConfigError(
                "backend hf-jobs needs the run repo on the Hub", hint="pass --repo user/name or set hub.repo_id"
            )
        opts = cfg.backend_options
        typer.echo(
            f"hubgrpo run {cfg.project_name}: {opts.workers} HF Jobs ({opts.flavor}), bucket {repo}, "
            f"coordinator {opts.coordinator}, target {cfg.rounds.versions} versions"
        )
        status = run_on_jobs(cfg, repo, on_status=_live_printer(), max_wall_s=max_wall_s, pipeline=pipeline)
        print_run_report(status, _store(repo), cfg)
        return
    repo = repo or f"./runs/{cfg.project_name}"
    store = _store(repo)
    typer.echo(
        f"hubgrpo run {cfg.project_name}: {workers} workers, bucket {store.location}, "
        f"target {cfg.rounds.versions} versions"
    )
    status = run_all(
        cfg,
        store,
        workers=workers,
        repo_arg=repo,
        force=force,
        max_wall_s=max_wall_s,
        on_status=_live_printer(),
        evaluate=evaluate,
        eval_samples=eval_samples,
        pipeline=pipeline,
    )
    print_run_report(status, store, cfg)


def _live_printer():
    """``on_status`` for ``run``: the run's status line, printed when it changes (so a log gets one line per
    change, not one per second)."""
    shown = [""]

    def on_status(status: dict, procs: list) -> None:
        last = status["versions"][-1] if status["versions"] else {}
        alive = sum(p.poll() is None for p in procs)
        reward = last.get("reward")
        scored = [v for v in status["versions"] if v.get("eval_reward") is not None]
        held = f"  held-out v{scored[-1]['version']} {scored[-1]['eval_reward']:.3f}" if scored else ""
        text = (
            f"  version {status['version']}/{status['target_versions']}  reward "
            f"{'-' if reward is None else f'{reward:.3f}'}{held}  pending {len(status.get('pending', []))}  "
            f"leases {len(status.get('leases', []))}  workers alive {alive}"
        )
        if text != shown[0]:
            shown[0] = text
            typer.echo(text, err=True)

    return on_status


def status(
    repo: str = typer.Option(..., "--repo", help=REPO_HELP),
    coordinator: str = typer.Option(None, "--coordinator", help="Also ask a live coordinator."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Versions, leaderboard, live leases and commits per hour of a run."""
    from hubgrpo.cli.report import print_status

    print_status(_store(repo), coordinator, as_json)


def push(
    repo: str = typer.Option(..., "--repo", help=REPO_HELP),
    to: str = typer.Option(..., "--to", help="Destination Hub repo user/name (or a local path)."),
    version: int = typer.Option(None, "--version", help="Version to push (default: the latest)."),
    private: bool = typer.Option(False, "--private/--public"),
) -> None:
    """Publish a version's adapter as a standalone PEFT repo with a model card."""
    from hubgrpo.cli.report import push_adapter

    sha = push_adapter(_store(repo), _store(to), version=version, private=private)
    typer.echo(f"pushed to {to} ({sha[:12]})")


def register(app: typer.Typer) -> None:
    for fn in (init, coordinator, worker, run, status, push):
        app.command(fn.__name__)(fn)
