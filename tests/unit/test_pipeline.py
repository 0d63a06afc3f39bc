"""A pipelined worker (hubgrpo.worker.pipeline): each round is delivered while the next trains, the next lease is
asked ahead; every round still counts, a worker never holds more than two live leases, a stop raised in the
background stops the worker, and ``max_rounds`` leaves no lease behind."""

from __future__ import annotations

import threading
import time

import pytest

from hubgrpo.coordinator.core import Coordinator
from hubgrpo.coordinator.repo_init import init_repo
from hubgrpo.errors import LeaseError, RateLimited, Refused
from hubgrpo.store.local import LocalStore
from hubgrpo.worker.loop import Worker
from tests.support.coord_helpers import make_config, write_adapter
from tests.support.scripted_worker import FakeEngine, ScriptedClient, refusal

SECRET = b"pipeline-secret"


class CountingClient(ScriptedClient):
    """Records the worker's live leases each time it asks for one (the one asked included)."""

    def __init__(self, coord, script):
        super().__init__(coord, script)
        self.held: list[int] = []

    def lease(self, worker, user=None):
        lease = super().lease(worker, user)
        self.held.append(sum(1 for x in self.coord.active.values() if x.worker == worker))
        return lease


def _run(tmp_path, script=None, **config):
    store = LocalStore(tmp_path / "repo")
    init_repo(store, make_config(**{"merge.quorum": 1, **config}), write_adapter(tmp_path / "v0", 0))
    coord = Coordinator(store, SECRET, workdir=tmp_path / "coord")
    client = CountingClient(coord, script or {})
    return store, coord, client


@pytest.mark.timeout(60)
def test_a_pipelined_worker_delivers_every_round_and_holds_at_most_two_leases(tmp_path):
    store, coord, client = _run(tmp_path, **{"rounds.versions": 6})
    worker = Worker(store, client, name="w1", engine=FakeEngine(), sleep=lambda s: None, progress=False,
                    workdir=tmp_path / "w1", pipeline=True)
    results = worker.run()
    assert coord.state.version == 6
    merged = [r for r in results if r["status"] in ("merged", "admitted")]
    assert len(merged) >= 6 and all(r.get("pipelined") for r in merged)
    assert max(client.held) == 2, client.held  # it did lease ahead, and never past two
    assert not [x for x in coord.active.values() if x.worker == "w1"]  # nothing left behind
    assert worker.in_use == []  # every adapter protected from pruning while in use was let go
    assert len(list((tmp_path / "w1" / "adapters").iterdir())) <= 3  # the cache stays bounded
    for r in merged:
        assert r["upload_s"] >= 0 and r["lease_s"] >= 0 and "round_s" in r


@pytest.mark.timeout(60)
def test_max_rounds_counts_leases_and_a_lease_fetched_ahead_is_not_left_behind(tmp_path):
    store, coord, client = _run(tmp_path, **{"rounds.versions": 50})
    worker = Worker(store, client, name="w1", engine=FakeEngine(), sleep=lambda s: None, progress=False,
                    workdir=tmp_path / "w1", pipeline=True, max_rounds=3)
    results = worker.run()
    assert len(results) == 3 and coord.state.version == 3
    assert not [x for x in coord.active.values() if x.worker == "w1"]


@pytest.mark.timeout(60)
def test_a_stop_raised_while_delivering_in_the_background_stops_the_worker(tmp_path):
    store, coord, client = _run(tmp_path, {"submit": [None, refusal("auth", None)]}, **{"rounds.versions": 50})
    worker = Worker(store, client, name="w1", engine=FakeEngine(), sleep=lambda s: None, progress=False,
                    workdir=tmp_path / "w1", pipeline=True)
    with pytest.raises(Refused) as ei:
        worker.run()
    assert ei.value.code == "auth"
    assert [r["status"] for r in worker.results] == ["merged"]
    # the round refused at its submit keeps its lease (as in sequence); the round trained after it went back
    assert len([x for x in coord.active.values() if x.worker == "w1"]) <= 1


@pytest.mark.timeout(60)
def test_one_lease_per_worker_runs_the_rounds_in_sequence(tmp_path, caplog):
    store, coord, client = _run(tmp_path, **{"rounds.versions": 3, "coordinator.leases_per_worker": 1})
    worker = Worker(store, client, name="w1", engine=FakeEngine(), sleep=lambda s: None, progress=False,
                    workdir=tmp_path / "w1", pipeline=True)
    results = worker.run()
    assert coord.state.version == 3 and max(client.held) == 1
    assert not any(r.get("pipelined") for r in results)
    assert "leases_per_worker >= 2" in caplog.text and "rounds run in sequence" in caplog.text  # says why


@pytest.mark.timeout(60)
def test_the_run_config_turns_pipelining_on_and_the_worker_flag_wins_over_it(tmp_path):
    store, coord, client = _run(tmp_path, **{"rounds.versions": 3, "worker.pipeline": "true"})
    results = Worker(store, client, name="w1", engine=FakeEngine(), sleep=lambda s: None, progress=False,
                     workdir=tmp_path / "w1").run()  # no flag: the config's worker.pipeline
    merged = [r for r in results if r["status"] in ("merged", "admitted")]
    assert len(merged) >= 3 and all(r.get("pipelined") for r in merged) and max(client.held) == 2
    store, coord, client = _run(tmp_path / "off", **{"rounds.versions": 3, "worker.pipeline": "true"})
    results = Worker(store, client, name="w1", engine=FakeEngine(), sleep=lambda s: None, progress=False,
                     workdir=tmp_path / "off" / "w1", pipeline=False).run()  # --no-pipeline
    assert coord.state.version == 3 and max(client.held) == 1
    assert results and not any(r.get("pipelined") for r in results)


class SlowEngine(FakeEngine):
    def run_round(self, *a, **k):
        time.sleep(1.3)  # past the 1-s keep-alive of a lease fetched ahead
        return super().run_round(*a, **k)


class AheadExpires(CountingClient):
    """A coordinator that refuses every keep-alive of a lease fetched ahead (a restart, or a hostile one)."""

    def heartbeat(self, lease):
        if threading.current_thread().name == "hubgrpo-handoff":
            self.coord.release(lease)
            raise LeaseError("lease expired", code="expired")
        return super().heartbeat(lease)


@pytest.mark.timeout(120)
def test_a_lease_fetched_ahead_then_refused_lets_its_adapter_be_pruned(tmp_path):
    store, coord, _ = _run(tmp_path, **{"rounds.versions": 5, "coordinator.heartbeat_interval_s": 1})
    client = AheadExpires(coord, {})
    worker = Worker(store, client, name="w1", engine=SlowEngine(), sleep=lambda s: None, progress=False,
                    workdir=tmp_path / "w1", pipeline=True)
    worker.run()
    assert coord.state.version == 5
    assert worker.in_use == []  # no adapter stays protected by a lease that is gone
    assert len(list((tmp_path / "w1" / "adapters").iterdir())) <= 3  # so the cache stays bounded


class SlowSubmitClient(CountingClient):
    """The first submit takes ``delay`` seconds (a slow upload or a long verdict); every lease is recorded."""

    def __init__(self, coord, script, delay: float):
        super().__init__(coord, script)
        self.delay, self.leases = delay, []

    def lease(self, worker, user=None):
        lease = super().lease(worker, user)
        self.leases.append(lease)
        return lease

    def submit(self, lease, commit):
        if self.delay:
            delay, self.delay = self.delay, 0.0
            time.sleep(delay)
        return super().submit(lease, commit)


@pytest.mark.timeout(60)
def test_a_round_waiting_for_a_slow_delivery_stays_live_and_its_prompts_are_not_leased_again(tmp_path):
    store, coord, _ = _run(tmp_path, **{"rounds.versions": 5, "coordinator.heartbeat_interval_s": 0.2})
    client = SlowSubmitClient(coord, {}, delay=2.0)  # ten heartbeat intervals: the live window is two
    worker = Worker(store, client, name="w1", engine=FakeEngine(), sleep=lambda s: None, progress=False,
                    workdir=tmp_path / "w1", pipeline=True)
    results = worker.run()
    assert coord.state.version == 5 and all(r["status"] in ("merged", "admitted") for r in results)
    prompts = [i for lease in client.leases for i in lease.prompt_indices]
    assert len(prompts) == len(set(prompts)), "a live round's prompts were leased again"


class AheadRefusingClient(CountingClient):
    """The first leases asked ahead (from the handoff's thread) are refused with these errors."""

    def __init__(self, coord, errors):
        super().__init__(coord, {})
        self.errors = errors

    def lease(self, worker, user=None):
        if threading.current_thread().name == "hubgrpo-handoff" and self.errors:
            raise self.errors.pop(0)
        return super().lease(worker, user)


@pytest.mark.timeout(60)
def test_a_lease_asked_ahead_and_refused_is_not_waited_for_and_max_rounds_still_holds(tmp_path):
    store, coord, _ = _run(tmp_path, **{"rounds.versions": 50})
    client = AheadRefusingClient(coord, [refusal("rate", 50.0), RateLimited("429", wait_s=50.0)])
    slept: list[float] = []
    worker = Worker(store, client, name="w1", engine=FakeEngine(), sleep=slept.append, progress=False,
                    workdir=tmp_path / "w1", pipeline=True, max_rounds=4)
    results = worker.run()
    assert len(results) == 4 and coord.state.version == 4
    assert 50.0 not in slept and not client.errors  # refused ahead, twice, and never waited for
    assert not [x for x in coord.active.values() if x.worker == "w1"]


@pytest.mark.timeout(60)
def test_a_run_that_admits_no_stale_round_runs_in_sequence(tmp_path):
    store, coord, client = _run(tmp_path, **{"rounds.versions": 4, "merge.max_staleness": 0,
                                             "merge.staleness_per_worker": 0})
    worker = Worker(store, client, name="w1", engine=FakeEngine(), sleep=lambda s: None, progress=False,
                    workdir=tmp_path / "w1", pipeline=True)
    results = worker.run()
    assert [r["status"] for r in results].count("merged") == 4 and max(client.held) == 1


@pytest.mark.timeout(60)
def test_ctrl_c_while_waiting_for_a_delivery_still_abandons_it_and_keeps_its_answer():
    """Ctrl-C lands while the worker waits for the round being delivered (``Piped.join``): ``close`` must still
    abandon that handoff, so it asks for no lease ahead once the delivery is done, and its answer is kept."""
    from hubgrpo.worker.piped import Piped
    from hubgrpo.worker.pipeline import Handoff

    class Leaving:  # what ``Piped`` touches of a worker on its way out
        def __init__(self):
            self.collected, self.released, self.in_use = [], [], []

        def collect(self, answer):
            self.collected.append(answer)

        def _release(self, lease):
            self.released.append(lease)

    delivering, fetched = threading.Event(), []
    handoff = Handoff(lambda: (delivering.wait(10), {"status": "merged"})[1], lambda: fetched.append(1),
                      release=lambda lease: None)
    w = Leaving()
    p = Piped(w)
    p.handoff = handoff

    def interrupted(timeout=None):
        raise KeyboardInterrupt  # as a signal does inside the wait

    handoff.join = interrupted
    with pytest.raises(KeyboardInterrupt):
        p.join()
    del handoff.join  # the real one again
    delivering.set()
    p.close()
    assert w.collected == [{"status": "merged", "pipelined": True}] and fetched == []
