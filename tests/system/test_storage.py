"""Bounded storage: submission folders leave the repo's head, the coordinator keeps no copies on its disk, and
``hubgrpo gc`` reclaims the history (Hub emulator and local folder) with every kept version loadable by its tag."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hubgrpo import layout, runrepo
from hubgrpo.coordinator.core import Coordinator
from hubgrpo.merge import load_adapter_dir
from hubgrpo.store.hub import HubStore
from hubgrpo.store.local import LocalStore
from tests.conftest import TEST_TOKEN
from tests.support.coord_helpers import FakeClock
from tests.support.hub_emulator_storage import usage
from tests.support.merged_versions import SECRET, run_versions

EXE = Path(sys.executable).with_name("hubgrpo")


def submission_folders(store, revision=None) -> set[str]:
    return {"/".join(p.split("/")[:3]) for p in store.list_files(layout.SUBMISSIONS, revision)}


def test_old_submission_folders_leave_the_head_and_the_coordinator_keeps_no_copies(tmp_path):
    store = LocalStore(tmp_path / "repo")
    c = run_versions(store, tmp_path, 6)
    state = runrepo.read_state(store)
    by_version = {v.version: {layout.submission_dir(m.base_version, m.submission_id) for m in v.merged}
                  for v in state.versions}
    assert submission_folders(store) == by_version[5] | by_version[6]  # keep_submissions: 2 (the default)
    for v in range(1, 5):  # the history still has them
        assert by_version[v] <= submission_folders(store, c.shas[v])
    assert (c.scratch / "submissions").is_dir()  # where they were fetched to be checked
    assert not any((c.scratch / "submissions").iterdir())  # admitted submissions live in memory, not on disk
    assert not any(p.is_file() for p in c.scratch.rglob("*"))  # nor the adapters read from the repo
    assert not (c.workdir / "adapters").exists() or not any((c.workdir / "adapters").rglob("*.safetensors"))
    c.cfg.coordinator.keep_submissions = None  # keep everything
    run_versions(store, tmp_path, 1, c)
    assert submission_folders(store) == by_version[5] | by_version[6] | {
        layout.submission_dir(m.base_version, m.submission_id) for m in c.state.versions[7].merged}


def _tagged_adapters(store) -> dict[str, dict]:
    return {t: load_adapter_dir(runrepo.adapter_at(store, sha, Path(os.environ["HUBGRPO_CACHE"]) / "gc-check"
                                                   / t)).weights for t, sha in store.tags().items()}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("backend", ["hub", "local"])
def test_gc_reclaims_history_and_keeps_every_kept_version_loadable_by_its_tag(backend, tmp_path, hub_emulator):
    """`hubgrpo gc --keep 3` through the installed entry point, then a restarted coordinator merges on."""
    if backend == "hub":
        store = HubStore("alice/gc", token=TEST_TOKEN, endpoint=hub_emulator.url, cache_dir=tmp_path / "hf")
        repo_arg, env = "alice/gc", dict(os.environ, HF_ENDPOINT=hub_emulator.url, HF_TOKEN=TEST_TOKEN)
    else:
        store, env = LocalStore(tmp_path / "repo"), dict(os.environ)
        repo_arg = str(tmp_path / "repo")
    run_versions(store, tmp_path, 8)
    before = _tagged_adapters(store)
    commits = len(store.history())
    size = usage(hub_emulator.state, hub_emulator.state.repos[("model", "alice/gc")]) if backend == "hub" else None
    r = subprocess.run([str(EXE), "gc", "--repo", repo_arg, "--keep", "3"], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and "would keep 3 versions" in r.stdout, r.stdout + r.stderr
    assert "looks live" in r.stdout  # the last merge is seconds old: --yes alone would refuse
    assert len(store.history()) == commits  # a dry run changes nothing
    r = subprocess.run([str(EXE), "gc", "--repo", repo_arg, "--keep", "3", "--yes", "--force"], env=env,
                       capture_output=True, text=True, timeout=120)  # the coordinator is stopped
    assert r.returncode == 0, r.stdout + r.stderr
    assert len(store.history()) == 1 and sorted(store.tags()) == ["v000006", "v000007", "v000008"]
    after = _tagged_adapters(store)
    for tag, weights in after.items():  # each kept version loads by its tag, unchanged
        assert weights.keys() == before[tag].keys() and all(torch.equal(weights[k], before[tag][k]) for k in weights)
    assert runrepo.read_state(store, store.tags()["v000007"]).version == 7
    assert not submission_folders(store, store.tags()["v000007"])  # a kept version holds its own files only
    if backend == "hub":
        now = usage(hub_emulator.state, hub_emulator.state.repos[("model", "alice/gc")])
        assert now["commits"] == 3 and now["lfs"] < size["lfs"] / 2 and now["total"] < size["total"] / 2, (size, now)
    else:
        assert len(list((tmp_path / "repo" / ".hubgrpo" / "commits").glob("*.json"))) == 3
    c = Coordinator(store, SECRET, clock=FakeClock(2_000_000.0), workdir=tmp_path / "coord-after")
    run_versions(store, tmp_path / "after", 2, c)  # the run goes on after gc
    assert c.state.version == 10 and sorted(store.tags())[-1] == "v000010"


def test_the_python_api_resolves_main_tags_and_shas_and_names_an_unknown_revision(tmp_path):
    """``load_adapter(revision=...)``: the user's own argument may be ``main`` or any tag (resolved to its commit
    before it names a cache folder); a name the repo does not have is a clear NotFound, not a path."""
    from hubgrpo.errors import NotFound
    from hubgrpo.python_api import _commit_for
    from tests.support.coord_helpers import local_coordinator

    store, _, _ = local_coordinator(tmp_path)
    head, v0 = store.head(), store.tags()["v000000"]
    assert _commit_for(store, None) == _commit_for(store, "main") == head
    assert _commit_for(store, "v000000") == "v000000" and _commit_for(store, v0) == v0
    with pytest.raises(NotFound, match="no revision '../x'"):
        _commit_for(store, "../x")
