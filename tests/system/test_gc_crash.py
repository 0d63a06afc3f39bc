"""`hubgrpo gc` on the Hub loses nothing whatever call fails (issue 35, defect 7), and it does not run beside a live
coordinator unless forced; a forced one does not stall the run: the coordinator reloads (defect 8).

Real HTTP to the Hub emulator throughout. The crash loop counts gc's Hub calls in a clean run, then for every call
``i`` runs gc again on a copy of the same repo with request ``i`` failing and the emulator down from there on (a gc
that crashed at that call; a mutating call also once with its answer lost after it was applied), and checks that a
coordinator starts on the repo, that every kept version loads by its tag, unchanged, and that a rerun of gc ends
exactly where a clean gc ends."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hubgrpo import layout, runrepo
from hubgrpo.coordinator.core import Coordinator
from hubgrpo.coordinator.gc import collect
from hubgrpo.coordinator.repo_init import init_repo
from hubgrpo.errors import HubGrpoError
from hubgrpo.store.hub import HubStore
from tests.conftest import TEST_TOKEN
from tests.support.coord_helpers import FakeClock, base_adapter_dir, make_config, push_submission, write_adapter
from tests.support.hub_emulator_storage import usage
from tests.support.merged_versions import run_versions

SECRET = b"gc-crash-secret"
EXE = str(Path(sys.executable).with_name("hubgrpo"))
VERSIONS, KEEP = 5, 3
WRITES = ("POST", "PUT", "DELETE")


@pytest.fixture
def quick_retries(monkeypatch):
    """huggingface_hub retries downloads and preuploads on 5xx by itself (1 s, 2 s, 4 s, 8 s, 8 s): once, at once,
    in these tests (a down server would cost 23 s per call)."""
    from huggingface_hub.utils import _http

    backoff = _http._http_backoff_base

    def quick(*args, **kwargs):
        return backoff(*args, **{**kwargs, "base_wait_time": 0.0, "max_wait_time": 0.0, "max_retries": 1})

    monkeypatch.setattr(_http, "_http_backoff_base", quick)


def hub_store(emu, name: str, cache: Path, *, retries: int = 8) -> HubStore:
    return HubStore(name, token=TEST_TOKEN, endpoint=emu.url, cache_dir=cache, max_retries=retries, retry_base_s=0.0,
                    sleep=lambda s: None)


def snapshot(emu, name: str) -> dict:
    """What a gc leaves, read from the emulator's state: each tag's files (path → blob id), the branches, the main
    branch's files and length, and the commits and LFS bytes the repo keeps."""
    state = emu.state
    with state.lock:
        repo = state.repos[("model", name)]
        head = repo.commits[repo.branches["main"]]
        out = {"tags": {t: dict(repo.commits[s].tree) for t, s in repo.tags.items()}, "branches": sorted(repo.branches),
               "main": dict(head.tree), "history": len(list(repo.history(head)))}
    u = usage(state, state.repos[("model", name)])
    return {**out, "commits": u["commits"], "lfs": u["lfs"]}


def gc(store, **kw) -> dict:
    return collect(store, KEEP, force=True, **kw)


def kept_adapters(store, tags) -> dict:
    return {t: {f: store.read(f, t) for f in layout.ADAPTER_FILES} for t in tags}


@pytest.fixture
def source(tmp_path, hub_emulator):
    """A run repo 'alice/src' with VERSIONS merged versions; what a clean gc of a copy makes of it; its calls."""
    emu = hub_emulator
    src = hub_store(emu, "alice/src", tmp_path / "hf-src")
    run_versions(src, tmp_path, VERSIONS)
    kept = sorted(src.tags())[-KEEP:]
    before = kept_adapters(src, kept)
    emu.state.copy_repo("model", "alice/src", "alice/clean")
    calls = emu.record_calls()
    report = gc(hub_store(emu, "alice/clean", tmp_path / "hf-clean"))
    calls = list(calls)
    clean = snapshot(emu, "alice/clean")
    assert sorted(clean["tags"]) == kept == report["kept"] and clean["history"] == 1
    assert clean["branches"] == ["main"] and clean["commits"] == KEEP
    return {"kept": kept, "before": before, "calls": calls, "clean": clean}


def check_restart(emu, name: str, tmp: Path, kept: list[str], before: dict) -> HubStore:
    """A coordinator starts on the repo and leases a version whose checkpoint exists (its tag's adapter is the
    leased one); every kept version loads by its tag."""
    store = hub_store(emu, name, tmp / "hf-after")
    c = Coordinator(store, SECRET, clock=FakeClock(2_000_000.0), workdir=tmp / "coord")
    assert c.state.version == VERSIONS
    lease = c.lease("w-restart")
    sha = c.shas[lease.base_version]
    assert store.tags()[layout.version_tag(lease.base_version)] == sha
    assert layout.ADAPTER_WEIGHTS in store.list_files("", sha)
    base_adapter_dir(store, lease, tmp / "leased")  # the tag's adapter has the lease's adapter id
    assert kept_adapters(store, kept) == before
    return store


def crash_at(emu, i: int, kind: str, tmp_path: Path, calls: list, tries: int = 3) -> tuple[str, Path]:
    """A copy of the source repo on which gc crashed at call ``i``: (its name, its folder). A gc that stopped
    before call ``i`` for another reason (on a loaded machine a request of the emulator can fail on its own, and
    gc makes a single try here) is tried again on a fresh copy, at most ``tries`` times."""
    for attempt in range(tries):
        name, tmp = f"alice/crash-{i}-{kind}-{attempt}", tmp_path / f"crash-{i}-{kind}-{attempt}"
        emu.state.copy_repo("model", "alice/src", name)
        faults = sum(emu.stats["faults"].values())
        emu.fail_at(i, kind, down=True)
        try:
            with pytest.raises(HubGrpoError):
                gc(hub_store(emu, name, tmp / "hf", retries=1))
        finally:
            emu.clear_faults()
        if sum(emu.stats["faults"].values()) > faults:
            return name, tmp
    raise AssertionError(f"call {i} ({calls[i - 1]}) was never made in {tries} runs of gc")


@pytest.mark.timeout(600)
def test_gc_survives_a_crash_at_every_hub_call_and_a_rerun_finishes_the_job(source, tmp_path, hub_emulator,
                                                                             quick_retries):
    emu, calls, clean = hub_emulator, source["calls"], source["clean"]
    cases = [(i, kind) for i, (method, _) in enumerate(calls, 1) for kind in ("500", "lost")
             if kind == "500" or method in WRITES]
    cli_case = next(c for c in cases if c[1] == "lost" and calls[c[0] - 1] == ("DELETE", "tag"))
    print(f"gc makes {len(calls)} Hub calls in a clean run; {len(cases)} crash cases")
    for i, kind in cases:
        name, tmp = crash_at(emu, i, kind, tmp_path, calls)
        store = check_restart(emu, name, tmp, source["kept"], source["before"])
        if (i, kind) == cli_case:  # the operator's rerun, through the installed entry point
            env = dict(os.environ, HF_ENDPOINT=emu.url, HF_TOKEN=TEST_TOKEN)
            r = subprocess.run([EXE, "gc", "--repo", name, "--keep", str(KEEP), "--yes", "--force"], env=env,
                               capture_output=True, text=True, timeout=120)
            assert r.returncode == 0, r.stdout + r.stderr
        else:
            gc(store)
        assert snapshot(emu, name) == clean, f"crash at call {i} {calls[i - 1]} ({kind}): the rerun differs"


@pytest.mark.timeout(300)
def test_gc_retries_transient_hub_errors_at_every_call(source, tmp_path, hub_emulator, quick_retries):
    """One 5xx, 429, 409 or lost answer at any call but a download (those are retried by huggingface_hub and
    ``HubStore`` alike, as everywhere): gc retries it and ends where a clean gc ends, in one run."""
    emu, calls = hub_emulator, source["calls"]
    emu.set_faults(ratelimit_reset_s=0)
    for i, (method, endpoint) in enumerate(calls, 1):
        if endpoint == "resolve":
            continue
        kinds = ["lost", "500", "409"] if method in WRITES else ["500", "429"]
        kind = kinds[i % len(kinds)]
        name = f"alice/transient-{i}"
        emu.state.copy_repo("model", "alice/src", name)
        emu.fail_at(i, kind)
        try:
            gc(hub_store(emu, name, tmp_path / f"hf-{i}", retries=3))
        finally:
            emu.clear_faults()
            emu.set_faults(ratelimit_reset_s=0)
        assert snapshot(emu, name) == source["clean"], f"{kind} at call {i} ({method} {endpoint})"


def test_gc_heals_a_repo_an_older_gc_broke(tmp_path, hub_emulator):
    """Today's repos broken by the old gc: the current version's tag deleted, the main branch one 'hubgrpo gc'
    commit, a stale scratch branch. The coordinator starts (it tags the gc commit) and gc reruns."""
    emu = hub_emulator
    store = hub_store(emu, "alice/old", tmp_path / "hf")
    run_versions(store, tmp_path, 3)
    store.api.super_squash_history("alice/old", branch="main", token=TEST_TOKEN,
                                   commit_message="hubgrpo gc: version 3 (history squashed, 2 versions kept)")
    store.api.create_branch("alice/old", branch="hubgrpo-gc", revision=store.head(), token=TEST_TOKEN)
    store.api.delete_tag("alice/old", tag="v000003", token=TEST_TOKEN)
    c = Coordinator(store, SECRET, clock=FakeClock(2_000_000.0), workdir=tmp_path / "coord")
    assert store.tags()["v000003"] == store.head() == c.shas[3]
    report = collect(store, 2, force=True)
    assert report["kept"] == ["v000002", "v000003"] and sorted(store.tags()) == report["kept"]
    assert snapshot(emu, "alice/old")["branches"] == ["main"]


@pytest.mark.timeout(300)
def test_gc_deletes_no_lfs_file_an_older_commit_of_another_branch_still_needs(tmp_path, hub_emulator):
    """A branch gc does not rewrite (someone's experiment) keeps its history: an LFS file only its older commit
    holds stays stored (gc lists only the refs' heads, so with such a branch it deletes no LFS file)."""
    from huggingface_hub import CommitOperationAdd

    emu = hub_emulator
    store = hub_store(emu, "alice/branchy", tmp_path / "hf")
    run_versions(store, tmp_path, 3)
    v1 = store.tags()["v000001"]
    store.api.create_branch("alice/branchy", branch="experiment", revision=v1, token=TEST_TOKEN)
    store.api.create_commit("alice/branchy", [CommitOperationAdd(layout.ADAPTER_WEIGHTS, b"not the v1 adapter")],
                            commit_message="experiment", revision="experiment", token=TEST_TOKEN)
    needed = next(f.lfs.sha256 for f in store.api.list_repo_tree("alice/branchy", revision=v1, token=TEST_TOKEN)
                  if f.path == layout.ADAPTER_WEIGHTS)
    collect(store, 2, force=True)
    assert sorted(store.tags()) == ["v000002", "v000003"]
    assert needed in {f.file_oid for f in store.api.list_lfs_files("alice/branchy", token=TEST_TOKEN)}


# ------------------------------------------------------------------------------------------------ live coordinator


@pytest.mark.timeout(240)
def test_gc_refuses_beside_a_live_coordinator_and_a_forced_gc_does_not_stall_it(tmp_path, hub_emulator):
    """A served coordinator merges and checkpoints three versions; `hubgrpo gc` refuses (its last commit is seconds
    old); with --force it rewrites the history under the coordinator, which notices at its next scan and holds
    commits that exist again (its versions' shas, the parent of its next checkpoint), and the next round merges
    and is checkpointed on the rewritten history."""
    from hubgrpo.space.api import serve
    from hubgrpo.worker.client import CoordinatorClient
    from tests.support.space_support import wait_for_checkpoint

    emu = hub_emulator
    store = hub_store(emu, "alice/live", tmp_path / "hf")
    init_repo(store, make_config(**{"merge.quorum": 1, "rounds.versions": 100, "coordinator.scan_interval_s": 0.5,
                                    "coordinator.checkpoint_every_s": 0}),  # a tag per version: gc has some to drop
              write_adapter(tmp_path / "v0", seed=0))
    app, url = serve(Coordinator(store, SECRET, workdir=tmp_path / "coord"), tick_interval=0.2)
    try:
        client = CoordinatorClient(url, retries=1)
        for i in range(3):
            lease = client.lease(f"w{i}")
            client.submit(lease, push_submission(store, lease, tmp_path / "rounds", seed=i + 1))
            wait_for_checkpoint(client, i + 1)  # the next round's base is read from its tag
        env = dict(os.environ, HF_ENDPOINT=emu.url, HF_TOKEN=TEST_TOKEN)
        argv = [EXE, "gc", "--repo", "alice/live", "--keep", "2", "--yes"]
        commits = len(store.history())
        r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
        said = r.stdout + r.stderr
        assert r.returncode != 0 and "live" in said and "--force" in said, said
        assert len(store.history()) == commits and len(store.tags()) == 4  # refused: nothing changed
        r = subprocess.run(argv + ["--force"], env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        assert len(store.history()) == 1 and sorted(store.tags()) == ["v000002", "v000003"]
        tags, deadline = store.tags(), time.time() + 30
        while True:  # the coordinator reloads at its next scan; until then it holds commits gc deleted
            status = client.status()
            if status["version_sha"] == tags["v000003"] and status["checkpoint"]["sha"] == store.head():
                break
            assert time.time() < deadline, f"the coordinator still holds {status['version_sha']}, which gc deleted"
            time.sleep(0.3)
        lease = client.lease("late")
        assert lease.base_version == 3
        client.submit(lease, push_submission(store, lease, tmp_path / "rounds", seed=9))
        assert wait_for_checkpoint(client, 4)["version"] == 4
        assert runrepo.read_state(store, store.tags()["v000004"]).version == 4
        assert tags["v000003"] in {c.sha for c in store.history()}  # checkpointed on the rewritten history
    finally:
        app.close(verbose=False)
