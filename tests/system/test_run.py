"""End to end: `hubgrpo run` with the tiny model — 2 worker processes over HTTP, local store and Hub emulator."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hubgrpo import runrepo
from hubgrpo.cli.main import main
from hubgrpo.store.local import LocalStore
from tests.support.chaos_helpers import submitted_ids, wait_for, wait_for_line

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "configs" / "tiny.yaml"
FAST = ["--set", "rounds.steps=2", "--set", "rounds.versions=3", "--set", "merge.quorum=2",
        "--set", "coordinator.heartbeat_interval_s=1"]


def _loads_with_peft(folder_or_repo: str, revision: str | None = None) -> None:
    """The adapter at a version loads with PeftModel.from_pretrained on the tiny base model."""
    from peft import PeftModel

    from hubgrpo.worker.models import load_model

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
    assert [v.eval_reward is not None for v in state.versions] == [True] * 4  # the evaluator scored every version
    assert "held-out" in out
    shas = runrepo.version_shas(store)
    assert sorted(shas) == [0, 1, 2, 3]
    for v, sha in shas.items():
        _loads_with_peft(str(runrepo.adapter_at(store, sha, tmp_path / "cache")))
    _loads_with_peft(str(repo))  # the browsable checkout of the head
    assert "final adapter" in out and (repo / "reward.png").exists()
    # a local directory has no hourly commit quota: the Hub's budget (60/hour) is lifted unless the config sets one
    assert runrepo.read_config(store).coordinator.commit_budget_per_hour == 1_000_000


def _start_coordinator(repo: Path, port: int, env: dict) -> subprocess.Popen:
    code = ("from hubgrpo.coordinator.core import Coordinator; from hubgrpo.space.api import serve; "
            "from hubgrpo.store.local import LocalStore; import time, pathlib; "
            f"c = Coordinator(LocalStore({str(repo)!r}), b'secret', workdir=pathlib.Path({str(repo)!r} + '-w')); "
            f"app, url = serve(c, port={port}); time.sleep(3600)")
    return subprocess.Popen([sys.executable, "-c", code], env=env, start_new_session=True)


def _worker(repo: Path, url: str, name: str, env: dict, rounds: int | None = None, **popen) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "hubgrpo.cli", "worker", "--repo", str(repo), "--coordinator", url,
           "--name", name, "--threads", "1", "--quiet"]
    if rounds:
        cmd += ["--max-rounds", str(rounds)]
    return subprocess.Popen(cmd, env=env, start_new_session=True, **popen)


@pytest.mark.timeout(600)
def test_killed_worker_and_restarted_coordinator_lose_nothing(tmp_path):
    from hubgrpo.worker.client import CoordinatorClient
    from hubgrpo.config import load_config
    from hubgrpo.cli.embedded import ensure_repo
    from hubgrpo.space.api import free_port

    repo = tmp_path / "run"
    cfg = load_config(TINY, overrides=["rounds.steps=3", "rounds.versions=3", "merge.quorum=2",
                                       "coordinator.lease_timeout_s=4", "coordinator.heartbeat_interval_s=1"])
    store = LocalStore(repo)
    ensure_repo(store, cfg)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    client = CoordinatorClient(url, retries=1, sleep=lambda s: None)
    procs = [_start_coordinator(repo, port, env)]
    try:
        log = tmp_path / "victim.log"
        victim = _worker(repo, url, "victim", env, stderr=open(log, "wb"))
        procs.append(victim)
        # killed after the first step of its first round, two steps before it could push: its lease must expire
        # and its prompts return
        assert " v0 " in wait_for_line(log, "step 1/3", 120)
        os.killpg(victim.pid, signal.SIGKILL)
        wait_for(lambda: client.status()["prompts_returned"] > 0, 30, "the expired lease's prompts to return")
        procs += [_worker(repo, url, f"good{i}", env) for i in range(2)]
        wait_for(lambda: client.status()["prompts_returned"] == 0, 60, "the returned prompts to be re-leased")
        wait_for(lambda: runrepo.read_state(store).version >= 1, 300, "version 1")
        os.killpg(procs[0].pid, signal.SIGKILL)  # the coordinator dies mid-run ...
        procs[0].wait()
        procs.append(_start_coordinator(repo, port, env))  # ... and comes back on the same address
        wait_for(lambda: runrepo.read_state(store).finished, 400, "the run to finish")
        state = runrepo.read_state(store)
        assert state.version == 3
        assert len(state.merged_ids) == len(set(state.merged_ids))
        refused = {r.submission_id for r in state.refused}
        lost = submitted_ids(store) - set(state.merged_ids) - refused
        assert all(s.startswith("good") for s in lost)  # only rounds pushed after the last merge may be left
        assert not any(s.startswith("victim-") for s in submitted_ids(store))  # killed before it pushed
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


@pytest.mark.timeout(600)
def test_cli_run_on_hub_emulator_then_status_and_push(tmp_path, hub_emulator, monkeypatch, capsys):
    from hubgrpo.store.hub import HubStore
    from tests.conftest import TEST_TOKEN

    monkeypatch.setenv("HF_ENDPOINT", hub_emulator.url)
    monkeypatch.setenv("HF_TOKEN", TEST_TOKEN)
    monkeypatch.chdir(tmp_path)  # the reward plot of a Hub run goes to ./runs/<project>/
    assert main(["run", str(TINY), "--workers", "2", "--repo", "alice/tinyrun", *FAST]) == 0
    store = HubStore("alice/tinyrun", token=TEST_TOKEN, endpoint=hub_emulator.url)
    state = runrepo.read_state(store)
    assert state.version == 3 and len(set(state.merged_ids)) == len(state.merged_ids)
    assert sorted(runrepo.version_shas(store)) == [0, 3]  # 1 and 2 lived at the coordinator; the final is checkpointed
    stored = runrepo.read_config(store)  # fitted to the Hub's quota as `hubgrpo init` would
    assert stored.coordinator.commit_budget_per_hour == 60 and stored.coordinator.checkpoint_every_s == 120
    assert stored.hub.submissions == "coordinator"
    assert not [h.message for h in store.history() if h.message.startswith("hubgrpo: submission")]  # none per round
    _loads_with_peft(str(runrepo.adapter_at(store, store.tags()["v000003"], tmp_path / "c")))
    capsys.readouterr()
    assert main(["status", "--repo", "alice/tinyrun"]) == 0
    out = capsys.readouterr().out
    contributors = {r.worker for v in state.versions for r in v.merged}  # one worker may take every round
    assert contributors <= {"worker0", "worker1"} and all(name in out for name in contributors), out
    assert "leaderboard" in out and "last checkpoint: version 3 (v000003" in out
    assert main(["push", "--repo", "alice/tinyrun", "--to", "alice/tiny-adapter"]) == 0
    pushed = HubStore("alice/tiny-adapter", token=TEST_TOKEN, endpoint=hub_emulator.url)
    card = pushed.read("README.md").decode()
    assert "library_name: peft" in card and "hubgrpo" in card and TEST_TOKEN not in card
    assert pushed.read("adapter_model.safetensors") == store.read("adapter_model.safetensors", store.tags()["v000003"])
    # init refuses to overwrite a run that has versions
    assert main(["init", str(TINY), "--repo", "alice/tinyrun"]) != 0
    assert "already holds a hubgrpo run" in capsys.readouterr().err


def _children(pid: int) -> list[int]:
    """PIDs whose parent is ``pid`` (from /proc)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
def test_a_stopped_run_leaves_no_worker_behind(tmp_path, how):
    """SIGTERM unwinds `hubgrpo run` like Ctrl-C (its workers and evaluator are stopped) and commits a last
    checkpoint: with checkpoints an hour apart, the versions made before the signal are in the run repo. After a
    SIGKILL of the run, its orphaned workers and evaluator notice at their next call to the dead coordinator and
    exit."""
    cmd = [sys.executable, "-m", "hubgrpo.cli", "run", str(TINY), "--workers", "2", "--repo", str(tmp_path / "run"),
           "--set", "rounds.steps=2", "--set", "rounds.versions=50", "--set", "coordinator.checkpoint_every_s=3600"]
    run = subprocess.Popen(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"), stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    workers: list[int] = []
    try:
        wait_for(lambda: len(_children(run.pid)) == 3, 60, "the 2 worker processes and the evaluator")
        workers = _children(run.pid)
        store = LocalStore(tmp_path / "run")
        wait_for(lambda: len(submitted_ids(store)) >= 2, 120, "two submissions")
        run.send_signal(signal.SIGTERM if how == "sigterm" else signal.SIGKILL)
        run.wait(timeout=60)
        assert wait_for(lambda: not any(_alive(p) for p in workers), 90, "the workers to exit")
        if how == "sigterm":
            assert runrepo.read_state(store).version >= 1, "the versions before SIGTERM were lost"
    finally:
        if run.poll() is None:
            run.kill()
        for p in workers:
            if _alive(p):
                os.kill(p, signal.SIGKILL)


def test_run_status_line_is_printed_only_when_it_changes(capsys):
    from hubgrpo.cli.run_cmd import _live_printer

    show = _live_printer()
    status = {"version": 1, "target_versions": 3, "versions": [{"reward": 0.5}], "pending": [], "leases": ["a"]}
    for _ in range(3):
        show(status, [])
    show(dict(status, version=2), [])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 2 and "version 1/3" in lines[0] and "version 2/3" in lines[1]


@pytest.mark.timeout(600)
def test_cli_run_on_an_s3_repo(tmp_path, s3_bucket_url, capsys, monkeypatch):
    """`hubgrpo run --repo s3://…`: coordinator and 2 worker processes on an S3 bucket (moto on loopback)."""
    from hubgrpo.store.s3 import S3Store

    monkeypatch.chdir(tmp_path)  # the reward plot of a remote run goes to ./runs/<project>/
    repo = f"{s3_bucket_url}/tinyrun"
    assert main(["run", str(TINY), "--workers", "2", "--repo", repo, *FAST]) == 0, capsys.readouterr().out
    store = S3Store(repo, cache_dir=tmp_path / "s3-cache")
    state = runrepo.read_state(store)
    assert state.version == 3 and state.finished
    assert len(state.merged_ids) == len(set(state.merged_ids)) >= 3
    assert sorted(runrepo.version_shas(store)) == [0, 1, 2, 3]
    keep = 2  # coordinator.keep_submissions' default: the folders of the last 2 versions stay at the head
    recent = {m.submission_id for v in state.versions if v.version > state.version - keep for m in v.merged}
    old = set(state.merged_ids) - recent
    at_head = submitted_ids(store)
    assert recent and recent <= at_head, "the last versions' merged rounds are submission folders in the bucket"
    assert old and not old & at_head, "older merged rounds left the head (keep_submissions)"
    _loads_with_peft(str(runrepo.adapter_at(store, store.tags()["v000003"], tmp_path / "c")))
    messages = [c.message for c in store.history()]
    assert len(messages) == len(set(messages)), "a commit was made twice"
    exe = Path(sys.executable).with_name("hubgrpo")  # the installed command reads the same bucket
    r = subprocess.run([str(exe), "status", "--repo", repo], capture_output=True, text=True, timeout=120)
    contributors = {m.worker for v in state.versions for m in v.merged}  # one worker may take every round
    assert r.returncode == 0 and "leaderboard" in r.stdout, r.stderr[-2000:]
    assert contributors <= {"worker0", "worker1"} and all(name in r.stdout for name in contributors), r.stdout


@pytest.mark.timeout(600)
def test_a_pipelined_ffa_run_with_rebase_through_the_installed_command(tmp_path):
    """A config with worker.pipeline (as configs/addition-mixed.yaml) and the default merge (ffa + rebase): the
    workers of hubgrpo run, started without --pipeline, read it from the run and deliver each round while they
    train the next (their rounds say so); the run finishes with every round merged once, no round is refused for
    its rebase, and a round counted from a later version than its lease's (moved mid-round) is still filed under
    its lease's version."""
    repo, cache = tmp_path / "run", tmp_path / "cache"
    exe = Path(sys.executable).with_name("hubgrpo")
    env = dict(os.environ, HUBGRPO_CACHE=str(cache))
    sets = ["worker.pipeline=true", "rounds.steps=3", "rounds.versions=6", "merge.quorum=1", "merge.method=ffa",
            "merge.rebase=true", "coordinator.heartbeat_interval_s=1"]
    r = subprocess.run([str(exe), "run", str(TINY), "--workers", "2", "--repo", str(repo), "--no-eval",
                        *[x for s in sets for x in ("--set", s)]], capture_output=True, text=True, timeout=560, env=env)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    state = runrepo.read_state(LocalStore(repo))
    assert state.finished and state.version == 6
    assert len(state.merged_ids) == len(set(state.merged_ids))
    assert not [x for x in state.refused if x.code == "bad_rebase"]
    filed = {p.name: int(p.parent.name) for p in (repo / "submissions").glob("*/*")} if (repo / "submissions").exists() \
        else {}
    for m in (m for v in state.versions for m in v.merged if m.submission_id in filed):
        assert m.base_version >= filed[m.submission_id]
    rounds = [json.loads(line) for f in sorted((cache / "worker").glob("*/rounds.jsonl"))
              for line in f.read_text().splitlines()]
    assert rounds and any(x.get("pipelined") for x in rounds), rounds[:2]
