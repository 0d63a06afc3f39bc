"""``hubgrpo run`` starts its workers nicer than itself: the coordinator it serves answers on every round's path,
and on a machine the workers keep busy a request should not wait for a time slice (real processes)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from hubgrpo.cli.children import SPAWN_NICE, spawn_workers, stop_workers


def _worker_itself(pid: int) -> bool:
    """The process runs the worker: python, not ``nice`` before its exec (whose arguments name hubgrpo.cli too)."""
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    return argv[0] == sys.executable.encode() and b"hubgrpo.cli" in argv


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux: nice, /proc")
@pytest.mark.skipif(os.getpriority(os.PRIO_PROCESS, 0) > 19 - SPAWN_NICE, reason="already too nice to see a change")
@pytest.mark.timeout(120)
def test_spawned_workers_run_nicer_than_the_coordinator(tmp_path):
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    procs = spawn_workers(str(tmp_path / "repo"), "http://127.0.0.1:9", 2, log_dir=tmp_path / "logs", threads=1)
    try:
        deadline = time.monotonic() + 20  # ``nice`` sets the priority, then execs the worker in the same process
        while time.monotonic() < deadline and not all(_worker_itself(p.pid) for p in procs):
            time.sleep(0.05)
        assert all(_worker_itself(p.pid) for p in procs), "the worker itself"
        assert [os.getpriority(os.PRIO_PROCESS, p.pid) for p in procs] == [mine + SPAWN_NICE] * 2
        for p in procs:  # the session group too, where the kernel has autogroup scheduling
            group = Path(f"/proc/{p.pid}/autogroup")
            if group.exists():
                assert group.read_text().split()[-1] == str(SPAWN_NICE)
        assert all(p.poll() is None for p in procs), "the workers wait for their run to come up"
    finally:
        stop_workers(procs, timeout=10)
    assert os.getpriority(os.PRIO_PROCESS, 0) == mine, "the coordinator's own priority is untouched"
