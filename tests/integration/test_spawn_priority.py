"""``hubgrpo run`` starts its workers nicer than itself: the coordinator it serves answers on every round's path,
and on a machine the workers keep busy a request should not wait for a time slice (real processes)."""

from __future__ import annotations

import os
import time

import pytest

from hubgrpo.cli.embedded import SPAWN_NICE, spawn_workers, stop_workers


@pytest.mark.skipif(not hasattr(os, "getpriority"), reason="POSIX process priorities")
@pytest.mark.timeout(120)
def test_spawned_workers_run_nicer_than_the_coordinator(tmp_path):
    procs = spawn_workers(str(tmp_path / "repo"), "http://127.0.0.1:9", 2, log_dir=tmp_path / "logs", threads=1)
    try:
        mine, want = os.getpriority(os.PRIO_PROCESS, 0), [min(19, os.getpriority(os.PRIO_PROCESS, 0) + SPAWN_NICE)] * 2
        deadline = time.monotonic() + 10  # ``nice`` sets it, then execs the worker in the same process
        while [os.getpriority(os.PRIO_PROCESS, p.pid) for p in procs] != want and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [os.getpriority(os.PRIO_PROCESS, p.pid) for p in procs] == want
        assert all(p.poll() is None for p in procs), "the workers wait for their run to come up"
    finally:
        stop_workers(procs, timeout=10)
    assert os.getpriority(os.PRIO_PROCESS, 0) == mine, "the coordinator's own priority is untouched"
