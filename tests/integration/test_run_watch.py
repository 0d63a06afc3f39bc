"""``hubgrpo run``'s status loop (``hubgrpo.cli.embedded._watch``) over a real coordinator app on 127.0.0.1 and real
worker processes: it stops with a clear error when every worker has died, and returns at ``max_wall_s``."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from hubgrpo.cli.embedded import _watch
from hubgrpo.errors import StoreError
from hubgrpo.space.api import serve
from hubgrpo.worker.client import CoordinatorClient
from tests.support.fake_coordinator import FakeCoordinator


@pytest.fixture
def client():
    app, url = serve(FakeCoordinator(), tick_interval=0.05)
    c = CoordinatorClient(url, timeout=20)
    yield c
    c.close()
    app.close(verbose=False)


def test_every_worker_dead_before_the_end_is_an_error_naming_the_logs(client, tmp_path):
    procs = [subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"]) for _ in range(2)]
    seen = []
    t0 = time.monotonic()
    with pytest.raises(StoreError, match="every worker process exited") as err:
        _watch(client, procs, lambda status, ps: seen.append(status["finished"]), None, tmp_path / "logs")
    assert str(tmp_path / "logs") in (err.value.hint or "")
    assert seen and not any(seen)  # the status was read while it ran, and the run never finished
    assert time.monotonic() - t0 < 30


def test_a_live_worker_is_watched_until_max_wall_s(client, tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        t0 = time.monotonic()
        status = _watch(client, [proc], None, 2.5, tmp_path)
        took = time.monotonic() - t0
    finally:
        proc.kill()
        proc.wait()
    assert status["finished"] is False and status["run_id"] == "fake"
    assert 2.5 <= took < 15
