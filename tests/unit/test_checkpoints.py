"""Versions off the commit path: a merge makes a live version (served by id, never committed by itself); the run
repo receives checkpoints every ``checkpoint_interval`` seconds, inside the commit budget, tagged and loadable; a
restarted coordinator resumes from the last checkpoint and refuses rounds based on the versions it lost.

In-process coordinator on a local folder that counts commits against an hourly quota, as the Hub does; the
served route and the chaos of kills are in tests/integration/test_checkpoint_restart.py."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from hubgrpo import layout, runrepo
from hubgrpo.coordinator import checkpoint
from hubgrpo.coordinator.core import Coordinator
from hubgrpo.coordinator.repo_init import init_repo
from hubgrpo.errors import InvalidSubmission, NotFound
from hubgrpo.store.local import LocalStore
from tests.support.coord_helpers import FakeClock, make_config, submission_record, trained_adapter, write_adapter, write_rollouts

pytestmark = pytest.mark.timeout(120)
SECRET = b"test-secret"


class QuotaStore(LocalStore):
    """A local folder whose commits count against an hourly quota (the Hub's), so checkpoints follow the budget."""

    hourly_commit_quota = 128


class InProcess:
    """What the adapter route serves, in process (``CoordinatorClient.adapter``'s contract)."""

    def __init__(self, c):
        self.c = c

    def adapter(self, version, adapter_id, cache, max_bytes):
        dest = Path(cache) / adapter_id
        if not dest.is_dir():
            shutil.copytree(self.c.version_dir(version, adapter_id), dest)
        return dest


def _setup(tmp_path, **overrides):
    cfg = make_config(**{"merge.quorum": 1, "merge.max_staleness": 8, "rounds.versions": 50, **overrides})
    store, clock = QuotaStore(tmp_path / "repo"), FakeClock()
    init_repo(store, cfg, write_adapter(tmp_path / "v0", seed=0, b_scale=0.0), clock=clock)
    return store, Coordinator(store, SECRET, clock=clock, workdir=tmp_path / "work"), clock


def _round(store, c, lease, tmp: Path, seed: int) -> str:
    """A trained round of ``lease`` (its base from the coordinator, as a worker gets it), committed; the commit."""
    sub_id = layout.submission_id(lease.worker, lease.lease_id)
    folder = trained_adapter(InProcess(c), lease, tmp / "rounds" / sub_id, seed, 0.1)
    (folder / layout.SUBMISSION_FILE).write_bytes(submission_record(lease).to_json())
    write_rollouts(folder, lease, c.cfg)
    if c.cfg.hub.submissions:  # a folder inbox: the round costs no commit
        from hubgrpo.worker.delivery import deliver

        return deliver(c.cfg.hub.submissions, lease, folder)
    adds = {layout.submission_path(lease.base_version, sub_id, f.name): f for f in folder.iterdir()}
    return store.commit(adds, message=f"hubgrpo: submission {sub_id}")


def _versions(store, c, tmp, n: int, clock, step_s: float = 1.0) -> None:
    for i in range(n):
        lease = c.lease(f"w{i % 3}")
        clock.advance(step_s)
        c.submit(lease, _round(store, c, lease, tmp, seed=100 + c.state.version))


def _merges(store) -> list[str]:
    """The checkpoint commits (init is ``hubgrpo: init …``)."""
    return [h.message for h in store.history() if h.message.startswith("hubgrpo: version ")]


def test_versions_live_between_checkpoints_which_come_at_the_budgets_interval(tmp_path):
    store, c, clock = _setup(tmp_path)  # budget 60 → a checkpoint every 7200 / 60 = 120 s
    assert checkpoint.interval_s(c) == 120.0
    clock.advance(200)  # the first checkpoint is due as soon as a version comes
    _versions(store, c, tmp_path, 1, clock)
    assert c.checkpoint.version == 1 and len(_merges(store)) == 1
    _versions(store, c, tmp_path, 5, clock)  # 5 versions in 5 s: live only
    assert c.state.version == 6 and c.checkpoint.version == 1 and len(_merges(store)) == 1
    for v in range(2, 7):  # each served by its id, never by another
        folder = c.version_dir(v, c.ids[v])
        assert layout.adapter_id((folder / layout.ADAPTER_WEIGHTS).read_bytes(),
                                 (folder / layout.ADAPTER_CONFIG).read_bytes()) == c.ids[v]
        with pytest.raises(NotFound):
            c.version_dir(v, c.ids[v - 1])
    clock.advance(120)
    c.tick()
    assert c.checkpoint.version == 6 and len(_merges(store)) == 2
    state = runrepo.read_state(store)
    assert [v.tag for v in state.versions] == ["v000000", "v000001", None, None, None, None, "v000006"]
    assert all(v.adapter_id for v in state.versions) and state.versions[6].adapter_id == c.ids[6]
    folder = runrepo.adapter_at(store, store.tags()["v000006"], tmp_path / "tag")
    assert (folder / layout.ADAPTER_WEIGHTS).read_bytes() == (c.version_dir(6, c.ids[6]) /
                                                             layout.ADAPTER_WEIGHTS).read_bytes()
    assert c.status()["checkpoint"]["version"] == 6 and c.status()["version_id"] == c.ids[6]


def test_checkpoints_wait_for_room_in_the_budget_even_the_finished_runs(tmp_path):
    store, c, clock = _setup(tmp_path, **{"coordinator.commit_budget_per_hour": 3, "hub.submissions": tmp_path / "inbox",
                                          "coordinator.checkpoint_every_s": 10, "rounds.versions": 8})
    for _ in range(3):  # init made 1 commit: two checkpoints fit, the third waits for the hour to pass
        clock.advance(11)
        _versions(store, c, tmp_path, 1, clock)
    assert len(_merges(store)) == 2 and c.checkpoint.version == 2 and c.state.version == 3
    clock.advance(3600 - 30)
    c.tick()
    assert c.checkpoint.version == 3 and len(_merges(store)) == 3
    _versions(store, c, tmp_path, 5, clock, step_s=0.1)  # to the last version, within 10 s of the checkpoint
    assert c.state.finished and c.checkpoint.version == 3  # due (finished), but the budget is full: it waits
    clock.advance(31)  # the first checkpoint leaves the rolling hour
    c.tick()
    assert c.checkpoint.version == 8 and runrepo.read_state(store).finished


def test_a_restart_resumes_from_the_checkpoint_and_refuses_rounds_on_the_versions_it_lost(tmp_path):
    store, c, clock = _setup(tmp_path)
    clock.advance(200)
    _versions(store, c, tmp_path, 1, clock)  # checkpoint v1
    _versions(store, c, tmp_path, 3, clock)  # v2..v4 live
    on_lost, on_kept = c.lease("late"), None
    assert on_lost.base_version == 4
    c2 = Coordinator(store, SECRET, clock=clock, workdir=tmp_path / "work2")  # the first one died
    assert c2.state.version == 1 and c2.checkpoint.version == 1 and c2.ids[1] == c.ids[1]
    with pytest.raises(InvalidSubmission) as err:
        c2.submit(on_lost, _round(store, c, on_lost, tmp_path, seed=7))
    assert err.value.code == "stale" and "restarted" in err.value.message
    _versions(store, c2, tmp_path, 3, clock)  # v2..v4 again: other adapters, other ids
    assert c2.state.version == 4 and c2.ids[4] != c.ids[4]
    on_kept = c2.lease("fresh")
    assert c2.submit(on_kept, _round(store, c2, on_kept, tmp_path, seed=8))["status"] == "merged"
    with pytest.raises(NotFound):  # the lost version's id is served by nobody
        c2.version_dir(4, c.ids[4])
