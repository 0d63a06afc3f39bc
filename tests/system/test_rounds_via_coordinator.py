"""``hub.submissions: coordinator``: rounds reach the coordinator through its upload route and are kept in a folder
on its own disk (``$HUBGRPO_CACHE/rounds/…``) — no commit per round, no write access for workers, and a restarted
coordinator finds the rounds uploaded but not merged. Real processes and real HTTP throughout."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hubgrpo import layout, runrepo
from hubgrpo.coordinator.repo_init import init_repo
from tests.support.coord_helpers import make_config, submission_record, trained_adapter, write_adapter, write_rollouts

ROOT = Path(__file__).resolve().parents[2]
EXE = Path(sys.executable).with_name("hubgrpo")
BOB = "hf_test_bob_token"  # a user of the Hub emulator who may read alice's public run repo, never write it


def _cli(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([str(EXE), *args], capture_output=True, text=True, timeout=timeout, cwd=str(ROOT),
                          env=env)


@pytest.mark.timeout(180)
def test_the_config_names_the_coordinator_as_the_inbox_and_workers_follow(tmp_path):
    """`hubgrpo config validate` accepts `hub.submissions: coordinator`; a near miss is refused with the fix; a
    worker of such a run that is told `--upload-via store` stops with a clear error before it leases anything."""
    tiny = str(ROOT / "configs" / "tiny.yaml")
    ok = _cli("config", "validate", tiny, "--set", "hub.submissions=coordinator")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    typo = _cli("config", "validate", tiny, "--set", "hub.submissions=coordinater")
    assert typo.returncode != 0 and "coordinater" in typo.stdout + typo.stderr
    assert "coordinator" in (typo.stdout + typo.stderr).replace("coordinater", "")
    store_path = tmp_path / "repo"
    from hubgrpo.store.local import LocalStore

    init_repo(LocalStore(store_path), make_config(**{"hub.submissions": "coordinator"}),
              write_adapter(tmp_path / "v0", seed=0))
    env = dict(os.environ, HUBGRPO_CACHE=str(tmp_path / "cache"), OMP_NUM_THREADS="1")
    told = _cli("worker", "--repo", str(store_path), "--coordinator", "http://127.0.0.1:9", "--name", "w0",
                "--upload-via", "store", "--max-rounds", "1", env=env)
    text = told.stdout + told.stderr
    assert told.returncode != 0 and "--upload-via store" in text and "hub.submissions" in text, text
    assert "unreachable" not in text  # refused before any call to the (absent) coordinator


def _round_commit(message: str) -> bool:
    """A commit that carries rounds: a worker's own, or a batch of uploads the coordinator committed."""
    return message.startswith("hubgrpo: submission") or "via the coordinator" in message


def _serve(repo: str, tmp_path: Path, env: dict, port: int, log: Path) -> subprocess.Popen:
    """`hubgrpo coordinator` in its own process on ``port``; returns once it answers."""
    import httpx

    proc = subprocess.Popen([str(EXE), "coordinator", "--repo", repo, "--port", str(port)], env=env,
                            cwd=str(tmp_path), stdout=open(log, "ab"), stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.post(f"http://127.0.0.1:{port}/hubgrpo/api/status", json={"data": []}, timeout=5).is_success:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise AssertionError(f"the coordinator did not start:\n{log.read_text(errors='replace')[-3000:]}")


def _stop(proc: subprocess.Popen) -> None:
    import signal

    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)  # a crash: nothing is flushed
    proc.wait(timeout=30)


def _round(store, lease, tmp_path: Path, seed: int) -> Path:
    """A trained round's folder, as a worker's engine leaves it."""
    folder = trained_adapter(store, lease, tmp_path / "rounds" / lease.lease_id, seed, 0.1)
    write_rollouts(folder, lease, runrepo.read_config(store))
    (folder / layout.SUBMISSION_FILE).write_bytes(submission_record(lease).to_json())
    return folder


@pytest.mark.timeout(420)
def test_a_restarted_coordinator_finds_the_rounds_uploaded_to_it(tmp_path):
    """A round uploaded to a `hubgrpo coordinator` process lands in a folder under its HUBGRPO_CACHE (no commit);
    the process is killed before the round is merged; the restarted process (same disk, a new temporary workdir)
    finds the round by its scan, and merges it with the next one."""
    import socket

    from hubgrpo.store.local import LocalStore
    from hubgrpo.worker.client import CoordinatorClient

    store = LocalStore(tmp_path / "repo")
    init_repo(store, make_config(**{"hub.submissions": "coordinator", "merge.quorum": 2}),
              write_adapter(tmp_path / "v0", seed=0))
    cache = tmp_path / "coord-cache"
    env = dict(os.environ, HUBGRPO_CACHE=str(cache), HUBGRPO_SECRET="restart-secret", OMP_NUM_THREADS="1")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path / "coordinator.log"
    url = f"http://127.0.0.1:{port}"
    proc = _serve(str(tmp_path / "repo"), tmp_path, env, port, log)
    try:
        client = CoordinatorClient(url, retries=2)
        first = client.lease("w0")
        answer = client.upload(first, _round(store, first, tmp_path, seed=1))
        assert answer["status"] == "admitted" and answer["commit"].startswith("sha256:"), answer
        kept = sorted(p.name for p in (cache / "rounds").rglob("*") if p.is_file())
        assert kept == sorted(layout.SUBMISSION_FILES), kept  # on the coordinator's disk ...
        assert len(store.history()) == 1 and store.list_files(layout.SUBMISSIONS) == []  # ... not in the repo
        _stop(proc)
        proc = _serve(str(tmp_path / "repo"), tmp_path, env, port, log)
        first_id = layout.submission_id("w0", first.lease_id)
        assert client.status()["pending"] == [first_id], log.read_text(errors="replace")[-3000:]
        second = client.lease("w1")
        answer = client.upload(second, _round(store, second, tmp_path, seed=2))
        assert answer["status"] in ("admitted", "merged"), answer
        deadline = time.monotonic() + 60
        while client.status()["checkpoint"]["version"] < 1 and time.monotonic() < deadline:
            time.sleep(0.3)  # version 1 is live, then checkpointed (its own thread): the kill comes after
    finally:
        _stop(proc)
    state = runrepo.read_state(store)
    assert state.version == 1 and set(state.merged_ids) == {first_id, layout.submission_id("w1", second.lease_id)}
    assert not [h.message for h in store.history() if _round_commit(h.message)]


@pytest.mark.timeout(600)
def test_workers_without_write_access_run_a_hub_run_under_the_commit_quota(tmp_path, monkeypatch):
    """The run repo on the Hub (emulator, quota on), rounds through the coordinator's upload route: two `hubgrpo
    worker` processes whose token cannot write the repo pick the route by themselves and finish the run; the repo
    gets no commit per round (the Hub's quota is never hit)."""
    from hubgrpo.cli.embedded import ensure_repo
    from hubgrpo.config import load_config
    from hubgrpo.coordinator.core import Coordinator
    from hubgrpo.space.api import serve
    from hubgrpo.store.hub import HubStore
    from tests.support.chaos_helpers import wait_for
    from tests.conftest import TEST_TOKEN
    from tests.support.hub_emulator import HubEmulator

    versions = 3
    cfg = load_config(ROOT / "configs" / "tiny.yaml", overrides=[
        "rounds.steps=1", f"rounds.versions={versions}", "merge.quorum=2",
        "coordinator.heartbeat_interval_s=1", "hub.submissions=coordinator"])
    with HubEmulator(users={TEST_TOKEN: "alice", BOB: "bob"}) as hub:
        store = HubStore("alice/viacoord", token=TEST_TOKEN, endpoint=hub.url)
        store.create(private=False)
        ensure_repo(store, cfg)
        at_start = hub.stats["commits_applied"]
        # room for the merges and two more (a refusal flush, a checkpoint); a commit per round would not fit
        hub.set_commit_quota(at_start + versions + 2)
        monkeypatch.setenv("HUBGRPO_CACHE", str(tmp_path / "coord-cache"))
        coord = Coordinator(store, b"via-coordinator", workdir=tmp_path / "coord")
        assert coord.inbox.in_repo is False
        assert Path(coord.inbox.location).is_relative_to(tmp_path / "coord-cache" / "rounds")
        app, url = serve(coord)
        env = {k: v for k, v in os.environ.items() if k != "HF_TOKEN"}
        env.update(OMP_NUM_THREADS="1", HF_ENDPOINT=hub.url, HF_TOKEN=BOB, HUBGRPO_CACHE=str(tmp_path / "wcache"))
        procs = [subprocess.Popen([str(EXE), "worker", "--repo", "alice/viacoord", "--coordinator", url,
                                   "--name", f"w{i}", "--threads", "1", "--quiet"], env=env, cwd=str(tmp_path),
                                  start_new_session=True, stdout=subprocess.DEVNULL,
                                  stderr=open(tmp_path / f"w{i}.log", "wb")) for i in range(2)]
        try:
            wait_for(lambda: coord.state.finished, 500, "the run to finish")
            for p in procs:
                p.wait(timeout=60)
            logs = [(tmp_path / f"w{i}.log").read_text(errors="replace")[-2000:] for i in range(2)]
            assert all(p.returncode == 0 for p in procs), logs
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
            app.close()
        stats, state, messages = hub.stats, runrepo.read_state(store), [h.message for h in store.history()]
    merged = set(state.merged_ids)
    assert state.version == versions and len(merged) >= 2 * versions, state.merged_ids
    assert {layout.parse_submission_path(p)[1] for p, _ in coord.inbox.objects.list(layout.SUBMISSIONS)} >= merged
    run_commits = stats["commits_applied"] - at_start
    assert not [m for m in messages if _round_commit(m)], messages
    print(f"{len(merged)} rounds merged into {versions} versions; {run_commits} commits of the run repo")
    assert run_commits <= versions + 2 < len(merged) + 1, (run_commits, len(merged), messages)
    assert stats["quota_429"] == 0, stats
    # every merged round is one of theirs (a worker that starts late can find all rounds taken: quorum 2, 3 versions)
    assert {r.worker for v in state.versions for r in v.merged} <= {"w0", "w1"}


@pytest.mark.timeout(240)
def test_a_coordinator_stopped_with_ctrl_c_checkpoints_its_live_versions_first(tmp_path):
    """Checkpoints an hour apart: version 1 lives at the coordinator only; Ctrl-C (SIGINT) to `hubgrpo coordinator`
    commits it before the process ends, so a stop (unlike a crash) loses no version."""
    import signal
    import socket

    from hubgrpo.store.local import LocalStore
    from hubgrpo.worker.client import CoordinatorClient

    store = LocalStore(tmp_path / "repo")
    init_repo(store, make_config(**{"hub.submissions": "coordinator", "merge.quorum": 1,
                                    "coordinator.checkpoint_every_s": 3600}), write_adapter(tmp_path / "v0", seed=0))
    env = dict(os.environ, HUBGRPO_CACHE=str(tmp_path / "cache"), OMP_NUM_THREADS="1")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = _serve(str(tmp_path / "repo"), tmp_path, env, port, tmp_path / "coordinator.log")
    try:
        client = CoordinatorClient(f"http://127.0.0.1:{port}", retries=2)
        lease = client.lease("w0")
        assert client.upload(lease, _round(store, lease, tmp_path, seed=1))["status"] in ("admitted", "merged")
        deadline = time.monotonic() + 60
        while client.status()["version"] < 1 and time.monotonic() < deadline:
            time.sleep(0.2)
        status = client.status()
        assert status["version"] == 1 and status["checkpoint"]["version"] == 0  # live only
        assert runrepo.read_state(store).version == 0
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:  # its stacks are in the log (`space.api.stop` writes them at 30 s)
            raise AssertionError("the coordinator did not stop within 60 s of Ctrl-C:\n"
                                 + (tmp_path / "coordinator.log").read_text(errors="replace")[-12000:]) from None
    finally:
        _stop(proc)
    state = runrepo.read_state(store)
    assert state.version == 1 and state.versions[1].tag == "v000001" and "v000001" in store.tags()
