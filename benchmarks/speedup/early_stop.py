"""``speedup_real.py --stop-after K``: end ``hubgrpo run`` K rounds after the workers' own round log says the
training target is reached, instead of after all of ``rounds.versions``. The run's lr schedule still spans
``rounds.versions`` (what the run does up to the stop is the same run); only the versions after it are not made.

The check reads the workers' ``rounds.jsonl`` (the mean reward of the last ``window`` rounds), a proxy for the
report's own figure (the merged versions' windowed reward, read from the run repo afterwards); the K rounds after
it leave room for the two to differ by a few rounds. A run stopped before the report's figure reaches the target
is reported as not reaching it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

POLL_S = 2.0


def reached(since: float, window: int, target: float, after: int) -> bool:
    """Whether ``after`` rounds have been logged since the first ``window`` rounds whose mean reward reached
    ``target`` (rounds logged at or after ``since``)."""
    from hubgrpo import runrepo

    rounds = sorted((r for f in (runrepo.cache_root() / "worker").glob("*/rounds.jsonl")
                     for r in map(json.loads, f.read_text().splitlines())
                     if r.get("at", 0) >= since and r.get("reward_mean") is not None), key=lambda r: r["at"])
    rewards = [r["reward_mean"] for r in rounds]
    hit = next((i for i in range(window, len(rewards) + 1) if sum(rewards[i - window:i]) / window >= target), None)
    return hit is not None and len(rewards) - hit >= after


def run_cli(args: list[str], root: Path, env: dict | None, stop=None) -> tuple[float, bool]:
    """Run the CLI as ``benchmarks.common.hubgrpo`` does; with ``stop`` (a callable), SIGTERM it (``hubgrpo run``
    unwinds as on Ctrl-C: its workers are stopped, its last version kept) once ``stop()`` is true. Returns
    (seconds of wall time, whether it was stopped)."""
    t0 = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "hubgrpo.cli", *args], cwd=root,
                            stdout=subprocess.DEVNULL if os.environ.get("QUIET") else None,
                            env={**os.environ, **env} if env else None)
    stopped = False
    while proc.poll() is None:
        time.sleep(POLL_S)
        if stop is not None and not stopped and stop():
            proc.send_signal(signal.SIGTERM)
            stopped = True
    if proc.returncode and not stopped:
        raise subprocess.CalledProcessError(proc.returncode, proc.args)
    return time.time() - t0, stopped
