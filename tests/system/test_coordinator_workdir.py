"""``hubgrpo coordinator`` started again on the same run (after a crash, a kill, a reboot of the job) clears what the
process before it left on disk: its workdir is one per run in hubgrpo's cache, not a fresh temporary folder per
start that nothing ever deletes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hubgrpo.coordinator.repo_init import init_repo
from hubgrpo.store.local import LocalStore
from tests.support.coord_helpers import make_config, write_adapter

EXE = Path(sys.executable).with_name("hubgrpo")


def _start(repo: Path, env: dict) -> subprocess.Popen:
    proc = subprocess.Popen([str(EXE), "coordinator", "--repo", str(repo), "--port", "0", "--quiet"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    end = time.time() + 90
    while time.time() < end:
        line = proc.stdout.readline()
        if line.startswith("coordinator for"):
            return proc
        if not line and proc.poll() is not None:
            raise AssertionError(f"exited {proc.returncode}: {proc.stderr.read()[-2000:]}")
    proc.kill()
    raise AssertionError("the coordinator did not come up in 90 s")


def _kill(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)


@pytest.mark.timeout(240)
def test_a_coordinator_restarted_on_a_run_clears_what_the_killed_one_left(tmp_path):
    repo = tmp_path / "repo"
    init_repo(LocalStore(repo), make_config(), write_adapter(tmp_path / "v0", seed=0))
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, "HUBGRPO_CACHE": str(tmp_path / "cache"), "TMPDIR": str(tmp_path / "tmp"),
           "HUBGRPO_SECRET": "workdir-test-secret", "GRADIO_ANALYTICS_ENABLED": "False"}
    first = _start(repo, env)
    try:
        (workdir,) = (tmp_path / "cache" / "coordinator").iterdir()  # one per run, named for it
        assert workdir.name.startswith("repo-")
        (dead,) = [p for p in (workdir / "versions").iterdir() if p.name.startswith("p")]
        assert any(dead.iterdir())  # the version it serves: what a killed process leaves behind
    finally:
        _kill(first)
    second = _start(repo, env)
    try:
        (live,) = [p for p in (workdir / "versions").iterdir() if p.name.startswith("p")]
        assert live != dead and not dead.exists()
        assert [p.name for p in (tmp_path / "cache" / "coordinator").iterdir()] == [workdir.name]
        assert not [p for p in (tmp_path / "tmp").iterdir() if p.name.startswith("hubgrpo-")]  # nor uploads
    finally:
        _kill(second)
