"""A pipelined worker (hubgrpo.worker.pipeline): each round is delivered while the next trains, the next lease is
asked ahead; every round still counts, a worker never holds more than two live leases, a stop raised in the
background stops the worker, and ``max_rounds`` leaves no lease behind."""

from __future__ import annotations

import pytest

from hubgrpo.coordinator.core import Coordinator
from hubgrpo.coordinator.repo_init import init_repo
from hubgrpo.errors import Refused
from hubgrpo.store.local import LocalStore
from hubgrpo.worker.loop import Worker
from tests.coord_helpers import make_config, write_adapter
from tests.test_worker_loop import FakeEngine, ScriptedClient, refusal

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
    store, coord, client = _run(tmp_path, **{"params.versions": 6})
    worker = Worker(store, client, name="w1", engine=FakeEngine(), sleep=lambda s: None, progress=False,
                    workdir=tmp_path / "w1", pipeline=True)
    results = worker.run()
    assert coord.state.version == 6
    merged = [r for r in results if r["status"] in ("merged", "admitted")]
    assert len(merged) >= 6 and all(r.get("pipelined") for r in merged)
    assert max(client.held) == 2, client.held  # it did lease ahead, and never past two
    assert not [x for x in coord.active.values() if x.worker == "w1"]  # nothing left behind
    for r in merged:
        assert r["upload_s"] >= 0 and r["lease_s"] >= 0 and "round_s" in r


@pytest.mark.timeout(60)
def test_max_rounds_counts_leases_and_a_lease_fetched_ahead_is_not_left_behind(tmp_path):
    store, coord, client = _run(tmp_path, **{"params.versions": 50})
    worker = Worker(store, client, name="w1", engine=FakeEngine(), sleep=lambda s: None, progress=False,
                    workdir=tmp_path / "w1", pipeline=True, max_rounds=3)
    results = worker.run()
    assert len(results) == 3 and coord.state.version == 3
    assert not [x for x in coord.active.values() if x.worker == "w1"]


@pytest.mark.timeout(60)
def test_a_stop_raised_while_delivering_in_the_background_stops_the_worker(tmp_path):
    store, coord, client = _run(tmp_path, {"submit": [None, refusal("auth", None)]}, **{"params.versions": 50})
    worker = Worker(store, client, name="w1", engine=FakeEngine(), sleep=lambda s: None, progress=False,
                    workdir=tmp_path / "w1", pipeline=True)
    with pytest.raises(Refused) as ei:
        worker.run()
    assert ei.value.code == "auth"
    assert [r["status"] for r in worker.results] == ["merged"]
    # the round refused at its submit keeps its lease (as in sequence); the round trained after it went back
    assert len([x for x in coord.active.values() if x.worker == "w1"]) <= 1


@pytest.mark.timeout(60)
def test_one_lease_per_worker_runs_the_rounds_in_sequence(tmp_path):
    store, coord, client = _run(tmp_path, **{"params.versions": 3, "coordinator.leases_per_worker": 1})
    worker = Worker(store, client, name="w1", engine=FakeEngine(), sleep=lambda s: None, progress=False,
                    workdir=tmp_path / "w1", pipeline=True)
    results = worker.run()
    assert coord.state.version == 3 and max(client.held) == 1
    assert not any(r.get("pipelined") for r in results)
