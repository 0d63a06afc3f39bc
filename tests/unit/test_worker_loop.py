"""The worker loop survives everything short of a bad config: refusals with a wait, a store that keeps failing,
a coordinator that stops answering — and a round committed but never submitted is found by the coordinator's
periodic repo scan."""

from __future__ import annotations

import os

import pytest

from hubgrpo.coordinator.core import Coordinator
from hubgrpo.coordinator.repo_init import init_repo
from hubgrpo.errors import ConfigError, CoordinatorError, StoreUnavailable
from hubgrpo.store.local import LocalStore
from hubgrpo.worker.loop import Worker
from tests.support.coord_helpers import make_config, write_adapter
from tests.support.scripted_worker import FakeEngine, ScriptedClient, refusal

SECRET = b"loop-secret"


class FlakyStore(LocalStore):
    """A store whose commits fail (503) while ``failures`` > 0."""

    failures = 0

    def commit(self, *args, **kwargs):
        if self.failures > 0:
            self.failures -= 1
            raise StoreUnavailable("the store answered 503")
        return super().commit(*args, **kwargs)


@pytest.mark.timeout(60)
def test_the_loop_waits_out_refusals_survives_outages_and_the_scan_finds_the_lost_round(tmp_path):
    store = FlakyStore(tmp_path / "repo")
    init_repo(store, make_config(**{"merge.quorum": 1, "rounds.versions": 3}), write_adapter(tmp_path / "v0", 0))
    coord = Coordinator(store, SECRET, workdir=tmp_path / "coord")
    unreachable = [CoordinatorError("connection refused", code="unreachable") for _ in range(9)]
    client = ScriptedClient(coord, {
        "lease": [refusal("rate", 3.0), refusal("lease_cap", 5.0), refusal("unknown_code", None)],
        "submit": [refusal("rate", 2.0), None] + unreachable,  # round 1: one rate wait; round 3: unreachable
    })
    slept: list[float] = []
    worker = Worker(store, client, name="w1", engine=FakeEngine(), sleep=slept.append, max_rounds=3,
                    progress=False, workdir=tmp_path / "w1")
    original_round = worker.round

    def round_(lease):
        if len(worker.results) == 1:
            store.failures = 11  # every try of round 2's commit fails (10 retries + the last attempt)
        return original_round(lease)

    worker.round = round_
    results = worker.run()
    assert [r["status"] for r in results] == ["merged", "error", "error"]
    assert results[1]["code"] == "unavailable" and results[2]["code"] == "unreachable"
    assert 3.0 in slept and 5.0 in slept and 2.0 in slept  # the waits the coordinator asked for
    # round 3 was committed, never submitted: the running coordinator's scan finds and admits it
    assert coord.state.version == 1 and not coord.pending
    coord.last_scan_at = -1e18
    coord.tick()  # the scan admits it ...
    assert len(coord.pending) == 1, "the scan did not find the committed round"
    coord.tick()  # ... and the next tick merges it
    assert coord.state.version == 2


@pytest.mark.timeout(60)
@pytest.mark.parametrize("pipeline", [False, True])
def test_a_failed_download_leaves_no_version_protected_from_pruning(tmp_path, pipeline):
    store = LocalStore(tmp_path / "repo")
    init_repo(store, make_config(**{"merge.quorum": 1, "rounds.versions": 3}), write_adapter(tmp_path / "v0", 0))
    coord = Coordinator(store, SECRET, workdir=tmp_path / "coord")
    cut = [CoordinatorError("connection reset", code="unreachable") for _ in range(2)]
    worker = Worker(store, ScriptedClient(coord, {"adapter": cut}), name="w1", engine=FakeEngine(),
                    sleep=lambda s: None, progress=False, workdir=tmp_path / "w1", pipeline=pipeline)
    results = worker.run()
    assert coord.state.version == 3 and sum(r["status"] == "error" for r in results) >= 1
    assert worker.in_use == []  # every version may be pruned again once its round is over


def test_the_loop_stops_on_what_it_cannot_wait_out(tmp_path):
    store = LocalStore(tmp_path / "repo")
    init_repo(store, make_config(), write_adapter(tmp_path / "v0", 0))
    coord = Coordinator(store, SECRET, workdir=tmp_path / "coord")
    for err in (refusal("auth", None), CoordinatorError("refusing to send your Hub token", code="config")):
        worker = Worker(store, ScriptedClient(coord, {"lease": [err]}), name="w2", engine=FakeEngine(),
                        sleep=lambda s: None, max_rounds=1, progress=False, workdir=tmp_path / "w2")
        with pytest.raises(type(err)):
            worker.run()
    with pytest.raises(ConfigError, match="allow-reward"):
        cfg = make_config()
        evil = cfg.model_copy(update={"rewards": [cfg.rewards[0].model_copy(update={"function": "os:system"})]})
        repo = LocalStore(tmp_path / "evil")
        init_repo(repo, evil, write_adapter(tmp_path / "v0e", 0))
        Worker(repo, ScriptedClient(coord, {}), name="w3", engine=FakeEngine(), progress=False)


def test_a_process_whose_run_is_gone_stops_at_its_first_failed_call_not_after_the_retries(monkeypatch):
    """`hubgrpo worker` / `evaluate` started by a `hubgrpo run` that was SIGKILLed: the client's backoff sleep notices
    within a second (CoordinatorError 'orphaned') instead of retrying an unreachable coordinator for ~70 s."""
    import time

    from hubgrpo.space.api import free_port
    from hubgrpo.worker.client import CoordinatorClient
    from hubgrpo.worker.orphans import orphan_aware_sleep

    client = CoordinatorClient(f"http://127.0.0.1:{free_port()}", timeout=2, sleep=orphan_aware_sleep)
    monkeypatch.setenv("HUBGRPO_PARENT_PID", str(os.getppid()))  # our parent is alive: a plain sleep
    t0 = time.monotonic()
    orphan_aware_sleep(1.5)
    assert 1.4 < time.monotonic() - t0 < 5
    monkeypatch.setenv("HUBGRPO_PARENT_PID", str(os.getpid()))  # never our own parent: the run is gone
    t0 = time.monotonic()
    with pytest.raises(CoordinatorError) as err:
        client.status()
    assert err.value.code == "orphaned" and time.monotonic() - t0 < 10


@pytest.mark.timeout(60)
def test_a_worker_whose_run_is_gone_stops_its_round_at_the_next_step(tmp_path):
    """A heartbeat that finds the `hubgrpo run` gone (CoordinatorError 'orphaned', from the client's backoff sleep)
    stops the round at its next step: nothing is committed or submitted, and the worker stops."""
    import time

    class SlowEngine(FakeEngine):
        steps = 0

        def run_round(self, adapter_dir, lease, out, on_step=None, rebase=None):
            for step in range(1, 101):  # 100 steps of 0.05 s: ~5 s unless stopped
                time.sleep(0.05)
                self.steps = step
                on_step(step, {})
            return super().run_round(adapter_dir, lease, out)

    class OrphanedClient(ScriptedClient):
        def heartbeat(self, lease):
            raise CoordinatorError("the `hubgrpo run` that started this process is gone", code="orphaned")

    store = LocalStore(tmp_path / "repo")
    cfg = make_config(**{"merge.quorum": 1, "coordinator.heartbeat_interval_s": 0.1})
    init_repo(store, cfg, write_adapter(tmp_path / "v0", 0))
    coord = Coordinator(store, SECRET, workdir=tmp_path / "coord")
    engine = SlowEngine()
    worker = Worker(store, OrphanedClient(coord, {}), name="w1", engine=engine, sleep=lambda s: None,
                    progress=False, workdir=tmp_path / "w1")
    with pytest.raises(CoordinatorError) as err:
        worker.run()
    assert err.value.code == "orphaned" and 1 <= engine.steps < 20
    assert not [p for p in store.list_files() if p.startswith("submissions/")]
