"""Versions off the commit path: a merge makes a live version (served by id, never committed by itself); the run
repo receives checkpoints every ``checkpoint_interval`` seconds, inside the commit budget, tagged and loadable; a
restarted coordinator resumes from the last checkpoint and refuses rounds based on the versions it lost.

In-process coordinator on a local folder that counts commits against an hourly quota, as the Hub does; the
served route and the chaos of kills are in tests/integration/test_checkpoint_restart.py."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch

from hubgrpo import layout, runrepo
from hubgrpo.coordinator import checkpoint
from hubgrpo.coordinator.admission import staleness_limit
from hubgrpo.coordinator.core import Coordinator
from hubgrpo.errors import InvalidSubmission, NotFound
from hubgrpo.merge import load_adapter_dir
from tests.support.checkpoint_run import SECRET, committed_round, setup_run

pytestmark = pytest.mark.timeout(120)


def _versions(store, c, tmp, n: int, clock, step_s: float = 1.0) -> None:
    for i in range(n):
        lease = c.lease(f"w{i % 3}")
        clock.advance(step_s)
        c.submit(lease, committed_round(store, c, lease, tmp, seed=100 + c.state.version))


def _merge(store, c, tmp, clock, seed: int, worker: str | None = None) -> None:
    """One round of ``worker`` (default: one of three by ``seed``) a second after the last, submitted."""
    lease = c.lease(worker or f"w{seed % 3}")
    clock.advance(1.0)
    c.submit(lease, committed_round(store, c, lease, tmp, seed=seed))


def _merges(store) -> list[str]:
    """The checkpoint commits (init is ``hubgrpo: init …``)."""
    return [h.message for h in store.history() if h.message.startswith("hubgrpo: version ")]


def test_versions_live_between_checkpoints_which_come_at_the_budgets_interval(tmp_path):
    store, c, clock = setup_run(tmp_path)  # budget 60 → a checkpoint every 7200 / 60 = 120 s
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
    store, c, clock = setup_run(tmp_path, **{"coordinator.commit_budget_per_hour": 3,
                                             "hub.submissions": tmp_path / "inbox",
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
    store, c, clock = setup_run(tmp_path)
    clock.advance(200)
    _versions(store, c, tmp_path, 1, clock)  # checkpoint v1
    _versions(store, c, tmp_path, 3, clock)  # v2..v4 live
    on_lost, on_kept = c.lease("late"), None
    assert on_lost.base_version == 4
    c2 = Coordinator(store, SECRET, clock=clock, workdir=tmp_path / "work2")  # the first one died
    assert c2.state.version == 1 and c2.checkpoint.version == 1 and c2.ids[1] == c.ids[1]
    with pytest.raises(InvalidSubmission) as err:
        c2.submit(on_lost, committed_round(store, c, on_lost, tmp_path, seed=7))
    assert err.value.code == "stale" and "restarted" in err.value.message
    _versions(store, c2, tmp_path, 3, clock)  # v2..v4 again: other adapters, other ids
    assert c2.state.version == 4 and c2.ids[4] != c.ids[4]
    on_kept = c2.lease("fresh")
    assert c2.submit(on_kept, committed_round(store, c2, on_kept, tmp_path, seed=8))["status"] == "merged"
    with pytest.raises(NotFound):  # the lost version's id is served by nobody
        c2.version_dir(4, c.ids[4])


def test_a_coordinator_on_the_same_workdir_clears_what_an_earlier_one_left(tmp_path):
    """Every `hubgrpo run` of a project uses one workdir: the version folders of processes that are gone go at
    start (19 GB had piled up on one machine), a live coordinator's never (two runs of one project at once, even
    after a third restarts beside them), never another file, never through a link; the run goes on from its tags."""
    store, c, clock = setup_run(tmp_path, **{"coordinator.checkpoint_every_s": 86400})
    _versions(store, c, tmp_path, 4, clock)
    base = tmp_path / "work" / "versions"
    first = c.versions.root
    assert first.parent == base and len([p for p in first.iterdir() if p.name != ".lock"]) >= 2
    old = [base / ("7-" + "b" * 40), base / (".tmp-" + "0" * 32)]  # what releases before wrote in the root
    for folder in old:
        folder.mkdir()
        (folder / "adapter_model.safetensors").write_bytes(b"w")
        os.utime(folder, (time.time() - 7200,) * 2)  # untouched for two hours: its coordinator is gone
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("mine")
    links = ["9-" + "a" * 40, "p123-0123456789ab"]  # named like the cache's folders, old and new
    for name in links:
        (base / name).symlink_to(victim, target_is_directory=True)
    (base / "notes").mkdir()  # not a name of the cache's
    (base / ".new-p1-0123456789ab").mkdir()  # a process that died between mkdir and lock: never deleted
    beside = Coordinator(store, SECRET, clock=clock, workdir=tmp_path / "work")  # while the first one lives
    assert beside.versions.cleared == len(old) and first.is_dir()
    assert all(c.versions.path(v) is not None for v in c.versions.versions())  # the live run's folders stay
    from hubgrpo.coordinator import workdir

    workdir.release(first, c.versions._owner)  # the first one died (the OS drops its lock, deletes nothing)
    c2 = Coordinator(store, SECRET, clock=clock, workdir=tmp_path / "work")
    assert c2.versions.cleared == 1 and not first.exists()
    assert all(beside.versions.path(v) is not None for v in beside.versions.versions())  # still live: kept
    mine = {beside.versions.root.name, c2.versions.root.name}
    assert {p.name for p in base.iterdir()} == {"notes", ".new-p1-0123456789ab", *links, *mine}
    assert (victim / "keep.txt").read_text() == "mine"
    lease = c2.lease("again")  # v0 (the checkpoint) comes back from its tag
    assert c2.submit(lease, committed_round(store, c2, lease, tmp_path, seed=9))["status"] == "merged"


def test_a_coordinator_that_ends_deletes_its_own_folder_and_nothing_else(tmp_path, monkeypatch):
    """``Coordinator.close`` (after the last checkpoint of `hubgrpo run`, `coordinator`, `space`): its versions and
    scratch go, a live neighbour's stay; a folder it could not lock (``.new-``: no flock) goes too."""
    from hubgrpo.coordinator import workdir

    store, c, clock = setup_run(tmp_path)
    _versions(store, c, tmp_path, 2, clock)
    beside = Coordinator(store, SECRET, clock=clock, workdir=tmp_path / "work")
    mine, theirs = c.versions.root, beside.versions.root
    assert mine.is_dir() and c.scratch.parent == mine
    c.close()
    assert not mine.exists() and (theirs / workdir.LOCK).is_file()  # the neighbour lives on
    monkeypatch.setattr(workdir, "_try_lock", lambda fd: False)  # a file system without flock
    unlocked = Coordinator(store, SECRET, clock=clock, workdir=tmp_path / "work")
    assert unlocked.versions.root.name.startswith(".new-") and unlocked.versions.root.is_dir()
    unlocked.close()
    assert not unlocked.versions.root.exists() and theirs.is_dir()


@pytest.mark.timeout(180)
def test_the_eval_gate_never_starts_a_merge_from_a_version_the_coordinator_no_longer_has(tmp_path):
    """With ``merge.eval_gate`` a merge starts from the best-scored version after a bad score; that version may be a
    live one that was never checkpointed and has left the version cache since: the merge must still go through."""
    store, c, clock = setup_run(tmp_path, **{"merge.eval_gate": 0.05, "coordinator.checkpoint_every_s": 86400})
    _merge(store, c, tmp_path, clock, seed=1)
    c.record_eval(1, 0.9, 8)  # v1 scored well; it is live only (the checkpoint is still v0)
    keep = c.cfg.merge.lease_age_limit() + 2
    for i in range(keep + 2):
        _merge(store, c, tmp_path, clock, seed=10 + i)
    assert c.versions.path(1) is None and 1 not in c.shas  # evicted, never checkpointed
    latest = c.state.version
    c.record_eval(latest, 0.1, 8)  # the newest scored badly: the gate wants to start from v1
    assert c.flush()  # a checkpoint holds both scores
    c = Coordinator(store, SECRET, clock=clock, workdir=tmp_path / "restarted")  # a restart: nothing cached
    _merge(store, c, tmp_path, clock, seed=99)  # version 1 is not available any more
    assert c.state.version == latest + 1


@pytest.mark.timeout(180)
def test_the_in_memory_adapters_stay_bounded_when_every_read_is_a_hit(tmp_path):
    store, c, clock = setup_run(tmp_path, **{"coordinator.checkpoint_every_s": 86400})
    limit = staleness_limit(c)
    for i in range(limit + 6):
        _merge(store, c, tmp_path, clock, seed=10 + i)
    assert len(c.adapters) <= limit + 2, (f"{len(c.adapters)} adapters in memory after {c.state.version} "
                                           f"versions (staleness limit {limit}): one more per version, for ever")


def test_after_a_lost_checkpoint_cas_the_next_merge_starts_from_the_winners_adapter(tmp_path):
    """A coordinator that loses a checkpoint's compare-and-swap to another one reloads the other's state; its next
    merge starts from the other's adapter of that version, never from its own lost one (same version number,
    another adapter id). Two coordinators on one folder."""
    store, a, clock = setup_run(tmp_path, **{"coordinator.checkpoint_every_s": 86400})
    b = Coordinator(store, SECRET, clock=clock, workdir=tmp_path / "work-b")  # a second coordinator (split brain)
    _merge(store, a, tmp_path / "a", clock, seed=101, worker="w0")
    _merge(store, a, tmp_path / "a", clock, seed=102, worker="w0")  # A: live v1, v2; its checkpoint is still v0
    _merge(store, b, tmp_path / "b", clock, seed=501, worker="w0")  # B: live v1' (another adapter)
    assert a.state.version == 2 and b.state.version == 1 and a.ids[1] != b.ids[1]
    assert b.flush()  # B checkpoints v1' first
    assert not a.flush()  # A loses the CAS and reloads B's checkpoint
    assert a.state.version == 1 and a.ids[1] == b.ids[1]
    winner = load_adapter_dir(b.version_dir(1, b.ids[1])).weights
    used = a.global_adapter().weights  # what A's next merge starts from (and measures rounds on v1' against)
    differ = [k for k in winner if not torch.equal(winner[k], used[k])]
    assert not differ, (f"A merges on top of its own lost v1, not the checkpointed v1' it reloaded "
                        f"({len(differ)} tensors differ, e.g. {differ[:2]})")


def test_a_live_coordinator_process_keeps_its_folders_and_its_death_frees_them(tmp_path):
    """The owner's lock across real processes: while a process lives nothing of it is cleared; once it is killed
    (no clean exit) the next coordinator clears what it left."""
    import subprocess
    import sys

    from hubgrpo.coordinator.versions import VersionCache

    base = tmp_path / "versions"
    code = (
        "import sys, time, pathlib; from hubgrpo.coordinator.versions import VersionCache; "
        f"v = VersionCache(pathlib.Path({str(base)!r})); "
        "v.put(3, {'adapter_model.safetensors': b'w', 'adapter_config.json': b'{}'}); print(v.root, flush=True); "
        "time.sleep(60)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        theirs = Path(proc.stdout.readline().strip())
        beside = VersionCache(base)
        assert beside.cleared == 0 and [p.name[:2] for p in theirs.iterdir() if p.name != ".lock"] == ["3-"]
        beside.close()
    finally:
        proc.kill()
        proc.wait(timeout=30)
    after = VersionCache(base)
    assert after.cleared == 1 and not theirs.exists()  # the killed process's folder (the closed one went at close)
    assert not beside.root.exists()
    assert [p.name for p in base.iterdir()] == [after.root.name]


def test_an_older_releases_folders_stay_while_they_change(tmp_path):
    """Folders an older release wrote in the root (no lock to ask) go only once none changed for an hour."""
    from hubgrpo.coordinator.versions import VersionCache

    base = tmp_path / "versions"
    recent, stale = base / ("3-" + "c" * 40), base / ("2-" + "d" * 40)
    for folder in (recent, stale):
        folder.mkdir(parents=True)
    os.utime(stale, (time.time() - 7200,) * 2)
    assert VersionCache(base).cleared == 0 and recent.is_dir() and stale.is_dir()  # one changed a moment ago
    os.utime(recent, (time.time() - 4000,) * 2)
    assert VersionCache(base).cleared == 2 and not recent.exists() and not stale.exists()


def test_a_runs_own_workdir_stays_in_the_cache_and_differs_per_run(tmp_path, monkeypatch):
    from hubgrpo.coordinator.workdir import for_store

    monkeypatch.setenv("HUBGRPO_CACHE", str(tmp_path / "cache"))
    root = (tmp_path / "cache" / "coordinator").resolve()
    hostile = ["alice/run1", "alice/run-1", "alice/run.1", "../../etc", "/", "", "a/..", "s3://b/x/../../y",
               "https://hub.example/alice/run1", "x" * 5000, "run\u202e1", "bad\udcffname", "con", "a\x00b"]
    places = [for_store(s) for s in hostile]
    for place in places:
        assert place.parent.resolve() == root and len(place.name) <= 60 and place.name.isascii(), place
    assert len(set(places)) == len(hostile)  # two runs never share one
    assert for_store("alice/run1") == for_store("alice/run1")  # a restart finds its predecessor's
    (tmp_path / "runs").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "runs")
    spellings = [tmp_path / "runs" / "r1", tmp_path / "runs" / "x" / ".." / "r1", tmp_path / "link" / "r1"]
    assert len({for_store(str(s)) for s in spellings}) == 1  # a local run, however its path is spelled
    assert for_store(str(tmp_path / "runs" / "r2")) != for_store(str(spellings[0]))
    assert for_store("/a\x00b").parent.resolve() == root  # a path the OS refuses still gets a folder
