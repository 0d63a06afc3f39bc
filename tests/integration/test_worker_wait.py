"""`hubgrpo worker --wait S`: a worker started before its run waits for the coordinator and the run repo, and
gives up after S seconds with an error that names what did not come up."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from hubgrpo.coordinator.core import Coordinator
from hubgrpo.coordinator.repo_init import init_repo
from hubgrpo.errors import CoordinatorError, NotFound
from hubgrpo.space.api import serve
from hubgrpo.space.wire import free_port
from hubgrpo.store.local import LocalStore
from hubgrpo.worker.startup import wait_for_run
from tests.support.coord_helpers import make_config, write_adapter

SECRET = b"wait-secret"


@pytest.mark.timeout(60)
def test_a_worker_waits_for_a_run_that_comes_up_after_it(tmp_path):
    """The repo is made and the coordinator served 1.5 s after the wait began, on the port the worker was given."""
    store, port = LocalStore(tmp_path / "repo"), free_port()
    started = {}

    def bring_up():
        time.sleep(1.5)
        init_repo(store, make_config(project_name="waited"), write_adapter(tmp_path / "v0", 0))
        started["app"], _ = serve(Coordinator(store, SECRET, workdir=tmp_path / "c"), port=port, tick_interval=0.1)

    thread = threading.Thread(target=bring_up)
    t0 = time.monotonic()
    thread.start()
    try:
        cfg, url = wait_for_run(store, f"http://127.0.0.1:{port}", 30)
        waited = time.monotonic() - t0
    finally:
        thread.join()
        if "app" in started:
            started["app"].close()
    assert cfg.project_name == "waited" and url == f"http://127.0.0.1:{port}"
    assert 1.5 <= waited < 20


@pytest.mark.timeout(60)
def test_the_wait_ends_with_an_error_naming_what_did_not_come_up(tmp_path):
    store = LocalStore(tmp_path / "repo")
    t0 = time.monotonic()
    with pytest.raises(CoordinatorError) as err:
        wait_for_run(store, f"http://127.0.0.1:{free_port()}", 1.0)
    assert err.value.code == "unreachable" and "did not answer within --wait 1 s" in str(err.value)
    assert "--wait" in (err.value.hint or "") and time.monotonic() - t0 < 15
    with pytest.raises(NotFound) as missing:  # no coordinator URL given: the repo is what is waited for
        wait_for_run(store, None, 0.6)
    assert "held no run within --wait 0.6 s" in str(missing.value) and "hubgrpo init" in (missing.value.hint or "")


@pytest.mark.timeout(120)
def test_the_installed_worker_command_gives_up_after_its_wait(tmp_path):
    """The real entry point: `hubgrpo worker --wait 2` with nothing to wait for exits non-zero within its wait (plus
    its imports) and says why, instead of retrying for a minute."""
    exe = [sys.executable, "-m", "hubgrpo.cli", "worker", "--repo", str(tmp_path / "repo"), "--wait", "2",
           "--coordinator", f"http://127.0.0.1:{free_port()}"]
    t0 = time.monotonic()
    r = subprocess.run(exe, capture_output=True, text=True, timeout=110)
    assert r.returncode != 0 and "did not answer within --wait 2 s" in r.stdout + r.stderr
    assert time.monotonic() - t0 < 100
