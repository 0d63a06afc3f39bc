"""``hubgrpo run``: a whole run on one machine — coordinator API on 127.0.0.1, N worker processes that use the
same HTTP path as remote workers and an evaluator process (``hubgrpo evaluate``: held-out scores of every
version), with a local directory (or a Hub repo) as the bucket."""

from __future__ import annotations

import logging
import os
import re
import secrets
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from hubgrpo import runrepo
from hubgrpo.cli.children import spawn_evaluator, spawn_verifier, spawn_workers, stop_workers
from hubgrpo.config import Config, from_env, placeholders
from hubgrpo.coordinator.repo_init import init_repo
from hubgrpo.errors import ConfigError, StoreError
from hubgrpo.store.base import Store
from hubgrpo.task.rewards import REWARD_ENV

if TYPE_CHECKING:
    from hubgrpo.coordinator.core import Coordinator

log = logging.getLogger("hubgrpo.cli.embedded")


def ensure_repo(store: Store, cfg: Config, *, force: bool = False) -> None:
    """Initialise the run repo with a version-0 adapter unless it already is a run (then it is resumed)."""
    head = store.head() if store.exists() else None
    if head is not None and store.exists_file("state.json", head) and not force:
        return
    from hubgrpo.worker.engine import RoundEngine

    with tempfile.TemporaryDirectory(prefix="hubgrpo-init-") as tmp:
        adapter = RoundEngine(cfg, worker="init").init_adapter(Path(tmp) / "v0")
        init_repo(store, cfg, adapter, force=force)


def fit_new_repo(cfg: Config, store: Store, *, force: bool = False) -> Config:
    """A run about to be created on the Hub gets the config ``hubgrpo init`` would store there (fitted to the
    commit quota: ``cli.init_quota``; what changed is logged); an existing run, a local folder or S3 keep theirs."""
    from hubgrpo.cli.init_quota import fit_to_store, holds_run

    if holds_run(store) and not force:
        return cfg
    fitted, lines = fit_to_store(cfg, store)
    for line in lines:
        log.warning(
            "%s (the Hub allows about %s commits an hour per repo)", line, getattr(store, "hourly_commit_quota", None)
        )
    return fitted


LOCAL_COMMIT_BUDGET = 1_000_000  # commits per hour of a run in a local directory, unless its config sets one


def lift_local_budget(cfg: Config, store: Store) -> None:
    """A run in a local directory has no hourly commit quota (the Hub's is what ``commit_budget_per_hour`` guards):
    unless the config sets the budget, it is lifted there, so that short rounds are not held back by it."""
    from hubgrpo.store.local import LocalStore

    if isinstance(store, LocalStore) and "commit_budget_per_hour" not in cfg.coordinator.model_fields_set:
        cfg.coordinator.commit_budget_per_hour = LOCAL_COMMIT_BUDGET


def coordinator_secret(store: Store) -> bytes:
    """HUBGRPO_SECRET, or a random secret kept beside the local cache (never in the repo), in a file that is 0600
    from its first byte (``_secret_file``)."""
    env = os.environ.get("HUBGRPO_SECRET")
    if env:
        return env.encode()
    path = runrepo.cache_root() / "secrets" / ("".join(c if c.isalnum() else "_" for c in store.location)[-100:])
    return _secret_file(path)


def _secret_file(path: Path) -> bytes:
    """The secret in ``path``, made if missing: written to a temporary file created 0600 (``O_CREAT | O_EXCL``,
    so no umask or earlier file makes it readable by others for an instant), then linked into place (two
    coordinators starting at once both read the one that won). An existing file that others may read or write is
    refused, not fixed: anyone who could read it can sign leases, so it must be replaced, and only its owner
    knows whether the run's live leases may be invalidated."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not path.exists():
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, secrets.token_hex(32).encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)
        except FileExistsError:  # another process made it first: use theirs
            pass
        finally:
            os.unlink(tmp)
    mode = path.stat().st_mode & 0o777
    if os.name == "posix" and mode & 0o077:
        raise ConfigError(
            f"the lease-signing secret {path} has mode {mode:04o}: others on this machine may read "
            "it, and whoever read it can sign leases for this run",
            hint=f"delete it (a new secret is made; live leases must be taken again) or, if nobody "
            f"else could have read it, chmod 600 {path}; or set HUBGRPO_SECRET",
        )
    return path.read_text().strip().encode()


def run(
    cfg: Config,
    store: Store,
    *,
    workers: int = 2,
    repo_arg: str,
    port: int = 0,
    on_status=None,
    max_wall_s: float | None = None,
    force: bool = False,
    evaluate: bool = True,
    eval_samples: int = 16,
    pipeline: bool | None = None,
) -> dict:
    """Run until ``rounds.versions`` versions exist (or Ctrl-C / max_wall_s), then let the evaluator score the
    last versions (``evaluate``); return the final status. ``pipeline``: the workers' ``--pipeline``."""
    from hubgrpo.space.wire import free_port
    from hubgrpo.task.rewards import foreign_code

    lift_local_budget(cfg, store)
    cfg = fit_new_repo(cfg, store, force=force)
    previous = _unwind_on_sigterm()
    granted = grant_reward_env(cfg)
    port = port or free_port()
    log_dir = runrepo.cache_root() / "logs" / cfg.project_name
    url = f"http://127.0.0.1:{port}"
    # the workers first: they import their libraries while this process makes the repo and starts the coordinator
    procs = spawn_workers(repo_arg, url, workers, log_dir=log_dir, allow=foreign_code(cfg.rewards), pipeline=pipeline)
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the workers own the cores; an oversubscribed merge stalls every submit
    try:
        ensure_repo(store, cfg, force=force)
        return _serve_and_watch(
            cfg,
            store,
            procs,
            port=port,
            repo_arg=repo_arg,
            on_status=on_status,
            max_wall_s=max_wall_s,
            eval_samples=eval_samples if evaluate else 0,
        )
    finally:
        stop_workers(procs)
        torch.set_num_threads(threads)
        _restore_env(REWARD_ENV, granted)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def grant_reward_env(cfg: Config) -> str | None:
    """A whole run on this machine from the user's OWN config file: the variables its reward kwargs name
    (``${JUDGE_API_KEY}``, filled from this environment when the file was loaded) are added to
    ``HUBGRPO_REWARD_ENV`` for the coordinator and the processes it spawns, which read the placeholders back from
    the run repo (``task.rewards.fill_kwargs``). Names come from the file, never from the repo. Returns the
    previous value of the variable (``_restore_env``)."""
    names = placeholders([text for path, text in from_env(cfg).items() if path and path[0] == "rewards"])
    previous = os.environ.get(REWARD_ENV)
    if names:
        listed = [n for n in re.split(r"[,\s]+", previous or "") if n]
        os.environ[REWARD_ENV] = ",".join(dict.fromkeys(listed + names))
    return previous


def _restore_env(name: str, previous: str | None) -> None:
    if previous is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = previous


def _unwind_on_sigterm():
    """Make SIGTERM (``kill``, a scheduler, a CI timeout) unwind like Ctrl-C, so that the ``finally`` stops the
    worker processes (they run in their own sessions) instead of leaving them behind. Returns the old handler."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum, frame):
        raise SystemExit(128 + signum)

    return signal.signal(signal.SIGTERM, handler)


def _serve_and_watch(
    cfg: Config,
    store: Store,
    procs: list,
    *,
    port: int,
    repo_arg: str,
    on_status,
    max_wall_s: float | None,
    eval_samples: int = 0,
) -> dict:
    """The coordinator API in this process on ``port``, for the worker ``procs`` (and an evaluator; a verifier with
    ``coordinator.verify``), and a status loop until the run finishes."""
    from hubgrpo.coordinator.core import Coordinator
    from hubgrpo.space.api import serve
    from hubgrpo.task.rewards import foreign_code
    from hubgrpo.worker.client import CoordinatorClient

    coord = Coordinator(
        store,
        coordinator_secret(store),
        workdir=runrepo.cache_root() / "coordinator" / cfg.project_name,
        allow_code=foreign_code(cfg.rewards),
    )  # the owner runs their own config
    app, url = serve(coord, port=port)
    client = CoordinatorClient(url)
    log_dir = runrepo.cache_root() / "logs" / cfg.project_name
    evaluator = (
        spawn_evaluator(repo_arg, url, log_dir=log_dir, samples=eval_samples, allow=foreign_code(cfg.rewards))
        if eval_samples
        else None
    )
    verifier = (
        spawn_verifier(repo_arg, url, log_dir=log_dir, allow=foreign_code(cfg.rewards))
        if cfg.coordinator.verify != "off"
        else None
    )
    start, flushed = time.time(), False
    try:
        status = _watch(client, procs, on_status, max_wall_s, log_dir)
        stop_workers(procs)
        if evaluator is not None and status["finished"]:
            _wait_for(evaluator, EVAL_WAIT_S)  # it scores the last versions, then exits
        coord.flush()  # held-out scores and refusals not in state.json yet
        flushed = True
        status = client.status()
    finally:
        stop_workers(procs + [p for p in (evaluator, verifier) if p is not None])
        if not flushed:  # Ctrl-C, SIGTERM, every worker gone: the versions made since the last checkpoint
            _last_checkpoint(coord)
        app.close()
        coord.close()  # its version folder: what the next run of the project would delete anyway
    status["wall_s"] = time.time() - start
    return status


def _last_checkpoint(coord: Coordinator) -> None:
    """A stopped run (Ctrl-C, SIGTERM, a failure) commits what the coordinator holds and the repo does not yet: the
    versions since the last checkpoint live only in the coordinator's folder, which closing it deletes. A failing
    store is reported, not raised over the error that stopped the run; a second Ctrl-C ends the wait."""
    try:
        if coord.flush():
            log.warning("stopped: a last checkpoint keeps version %d", coord.state.version)
    except Exception as e:  # noqa: BLE001 - the run is stopping on another error already
        log.error("stopped: the last checkpoint failed (%s); versions after the last one committed are lost", e)


def _watch(client, procs: list, on_status, max_wall_s: float | None, log_dir: Path) -> dict:
    """The run's status every second until it finishes (or ``max_wall_s`` passes); an error when every worker
    process has exited before that."""
    start = time.time()
    status = client.status()
    while not status["finished"]:
        time.sleep(1.0)
        status = client.status()
        if on_status:
            on_status(status, procs)
        if all(p.poll() is not None for p in procs):
            raise StoreError("every worker process exited before the run finished", hint=f"see the logs in {log_dir}")
        if max_wall_s and time.time() - start > max_wall_s:
            log.warning("stopping after max_wall_s=%s", max_wall_s)
            break
    return status


EVAL_WAIT_S = 600.0  # longest `hubgrpo run` waits, once the run is finished, for the evaluator's last scores


def _wait_for(proc, timeout: float) -> None:
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        log.warning("the evaluator did not finish within %.0f s; stopping it", timeout)


def plot(status: dict, path: Path) -> Path:
    """PNG: reward per version, against version and against wall-clock."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [v for v in status["versions"] if v["reward"] is not None]
    held = [v for v in status["versions"] if v.get("eval_reward") is not None]
    t0 = status["versions"][0]["created_at"] if status["versions"] else 0.0
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for ax, x in ((a, lambda r: r["version"]), (b, lambda r: (r["created_at"] - t0) / 60)):
        ax.plot([x(r) for r in rows], [r["reward"] for r in rows], marker="o", label="training (merged rounds)")
        if held:
            ax.plot([x(r) for r in held], [r["eval_reward"] for r in held], marker="s", label="held-out (greedy)")
        ax.legend()
    a.set_xlabel("version")
    a.set_ylabel("reward")
    b.set_xlabel("wall-clock (minutes)")
    fig.suptitle(f"hubgrpo run {status['project']}")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
