"""The processes ``hubgrpo run`` starts beside its coordinator: workers, the evaluator, the verifier — each a
``python -m hubgrpo.cli`` child with its own torch threads, nicer than the coordinator, that stops when its run
is gone."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from hubgrpo.config.recipe import pipeline_flag

WORKER_WAIT_S = 600.0  # how long a worker started with its run waits for the repo and the coordinator to come up
# The processes a run starts (workers, evaluator, verifier) run this much nicer than the coordinator, which answers
# on every round's path: on a machine the workers keep busy it answers at once (benchmarks/LOG.md, 2026-12-05).
SPAWN_NICE = 5


def spawn_workers(
    repo: str,
    url: str,
    n: int,
    *,
    log_dir: Path,
    threads: int | None = None,
    allow: list[str] | None = None,
    pipeline: bool | None = None,
) -> list:
    """Start N ``hubgrpo worker`` processes with torch threads split between them (cores // N each); ``allow``:
    the config's non-built-in reward functions (the owner runs their own config here); ``pipeline``: their
    ``--pipeline`` (None: the config's). Started before the repo and the coordinator are up, they wait (``--wait``)."""
    threads = threads or max(1, (os.cpu_count() or 1) // n)
    wait = ["--wait", str(WORKER_WAIT_S), *pipeline_flag(pipeline)]
    return [
        _spawn(
            ["worker", "--repo", repo, "--coordinator", url, "--name", f"worker{i}", *wait],
            threads,
            allow,
            log_dir / f"worker{i}.log",
        )
        for i in range(n)
    ]


def spawn_evaluator(repo: str, url: str, *, log_dir: Path, samples: int = 16, allow: list[str] | None = None):
    """Start ``hubgrpo evaluate`` (one torch thread): it scores every version and exits once the run is finished
    and every version is scored."""
    return _spawn(
        ["evaluate", "--repo", repo, "--coordinator", url, "--samples", str(samples)],
        1,
        allow,
        log_dir / "evaluator.log",
    )


def spawn_verifier(repo: str, url: str, *, log_dir: Path, allow: list[str] | None = None):
    """Start ``hubgrpo evaluate --verify`` (one torch thread) for a run with ``coordinator.verify``: it replays a
    sample of every admitted round (with ``all``/``untrusted`` the merges wait for it) until the run is finished."""
    return _spawn(["evaluate", "--verify", "--repo", repo, "--coordinator", url], 1, allow, log_dir / "verifier.log")


def _spawn(args: list[str], threads: int, allow: list[str] | None, log: Path) -> subprocess.Popen:
    env = dict(
        os.environ,
        OMP_NUM_THREADS=str(threads),
        MKL_NUM_THREADS=str(threads),
        HUBGRPO_NUM_THREADS=str(threads),
        TOKENIZERS_PARALLELISM="false",
        HUBGRPO_PARENT_PID=str(os.getpid()),
    )  # a process whose run is gone stops (worker.orphaned)
    cmd = [*_nicer(), sys.executable, "-m", "hubgrpo.cli", *args, "--threads", str(threads)]
    cmd += [x for f in allow or [] for x in ("--allow-reward", f)]
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    _nicer_group(proc.pid)
    return proc


def _nicer() -> list[str]:
    """``nice -n SPAWN_NICE`` before the command where the system has it (it execs the command: same process). Not
    ``preexec_fn``, which can deadlock a child forked from a process with threads; not on macOS, where the system's
    ``nice`` drops the ``DYLD_*`` variables some torch installs need."""
    found = shutil.which("nice") if os.name == "posix" and sys.platform != "darwin" else None
    return [found, "-n", str(SPAWN_NICE)] if found else []


def _nicer_group(pid: int) -> None:
    """Linux with autogroup scheduling: a process in a session of its own (``start_new_session``) is scheduled as its
    own group, where its nice value weighs only against itself; the group's nice is what yields (best effort)."""
    try:
        Path(f"/proc/{pid}/autogroup").write_text(str(SPAWN_NICE))
    except OSError:  # no autogroup here (or not allowed): the process's own nice is what counts
        pass


def stop_workers(procs: list, timeout: float = 20.0) -> None:
    """SIGINT first (a worker gives its lease back), then SIGKILL whatever is left."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
    end = time.time() + timeout
    for p in procs:
        try:
            p.wait(timeout=max(0.1, end - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
