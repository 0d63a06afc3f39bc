"""End to end: `hubgrpo run` with the tiny model — 2 worker processes over HTTP, local store and Hub emulator."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hubgrpo import layout, runrepo
from hubgrpo.cli import main
from hubgrpo.store.local import LocalStore

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "tiny.yaml"
FAST = ["--set", "params.steps_per_round=2", "--set", "params.versions=3", "--set", "merge.quorum=2",
        "--set", "coordinator.heartbeat_interval_s=1"]


def _loads_with_peft(folder_or_repo: str, revision: str | None = None) -> None:
    """The adapter at a version loads with PeftModel.from_pretrained on the tiny base model."""
    from peft import PeftModel

    from hubgrpo.models import load_model

    model, _ = load_model("builtin:tiny", device="cpu")
    peft_model = PeftModel.from_pretrained(model, folder_or_repo, revision=revision)
    assert any("lora_B" in n for n, _ in peft_model.named_parameters())


@pytest.mark.timeout(600)
def test_cli_run_two_workers_three_versions_local(tmp_path, capsys):
    repo = tmp_path / "run"
    rc = main(["run", str(TINY), "--workers", "2", "--repo", str(repo), *FAST])
    out = capsys.readouterr().out
    assert rc == 0, out
    store = LocalStore(repo)
    state = runrepo.read_state(store)
    assert state.version == 3 and state.finished
    assert len(state.merged_ids) == len(set(state.merged_ids)) >= 3
    assert {m.worker for v in state.versions for m in v.merged} <= {"worker0", "worker1"}
    shas = runrepo.version_shas(store)
    assert sorted(shas) == [0, 1, 2, 3]
    for v, sha in shas.items():
        _loads_with_peft(str(runrepo.adapter_at(store, sha, tmp_path / "cache")))
    _loads_with_peft(str(repo))  # the browsable checkout of the head
    assert "final adapter" in out and (repo / "reward.png").exists()


def _start_coordinator(repo: Path, port_file: Path, env: dict) -> subprocess.Popen:
    code = ("import sys; from hubgrpo.coordinator import Coordinator; from hubgrpo.server import serve; "
            "from hubgrpo.store.local import LocalStore; import time, pathlib; "
            f"c = Coordinator(LocalStore({str(repo)!r}), b'secret', workdir=pathlib.Path({str(repo)!r} + '-w')); "
            f"app, url = serve(c); pathlib.Path({str(port_file)!r}).write_text(url); time.sleep(3600)")
    return subprocess.Popen([sys.executable, "-c", code], env=env, start_new_session=True)


def _wait_url(port_file: Path, timeout: float = 60) -> str:
    end = time.time() + timeout
    while time.time() < end:
        if port_file.exists() and port_file.read_text():
            return port_file.read_text()
        time.sleep(0.2)
    raise AssertionError("coordinator did not start")


def _worker(repo: Path, url: str, name: str, env: dict, rounds: int | None = None) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "hubgrpo.cli", "worker", "--repo", str(repo), "--coordinator", url,
           "--name", name, "--threads", "1", "--quiet"]
    if rounds:
        cmd += ["--max-rounds", str(rounds)]
    return subprocess.Popen(cmd, env=env, start_new_session=True)


@pytest.mark.timeout(600)
def test_killed_worker_and_restarted_coordinator_lose_nothing(tmp_path):
    from hubgrpo.config import load_config
    from hubgrpo.run import ensure_repo

    repo = tmp_path / "run"
    cfg = load_config(TINY, overrides=["params.steps_per_round=2", "params.versions=3", "merge.quorum=2",
                                       "coordinator.lease_timeout_s=4", "coordinator.heartbeat_interval_s=1"])
    store = LocalStore(repo)
    ensure_repo(store, cfg)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    coord = _start_coordinator(repo, tmp_path / "url1", env)
    procs = [coord]
    try:
        url = _wait_url(tmp_path / "url1")
        victim = _worker(repo, url, "victim", env)
        procs.append(victim)
        time.sleep(8)  # it holds a lease (model load + first steps)
        os.killpg(victim.pid, signal.SIGKILL)
        os.killpg(coord.pid, signal.SIGKILL)  # and the coordinator dies too
        coord2 = _start_coordinator(repo, tmp_path / "url2", env)
        procs.append(coord2)
        url2 = _wait_url(tmp_path / "url2")
        good = [_worker(repo, url2, f"good{i}", env) for i in range(2)]
        procs += good
        end = time.time() + 400
        while time.time() < end and not runrepo.read_state(store).finished:
            time.sleep(1)
        state = runrepo.read_state(store)
        assert state.finished and state.version == 3
        assert len(state.merged_ids) == len(set(state.merged_ids))
        assert all(not sid.startswith("victim-") or sid in state.merged_ids
                   for sid in _submitted_ids(store))
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def _submitted_ids(store) -> set[str]:
    out = set()
    for path in store.list_files(layout.SUBMISSIONS):
        parsed = layout.parse_submission_path(path)
        if parsed:
            out.add(parsed[1])
    return out
