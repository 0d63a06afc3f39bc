"""`hubgrpo gc` on an ``s3://`` run repo (moto over HTTP): the history becomes one commit, dropped version tags and
every object no kept ref reaches are deleted, every kept version still loads by its tag, a restarted coordinator
merges on; a gc that fails at any of its writes loses nothing and a rerun finishes the job."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hubgrpo import layout, runrepo
from hubgrpo.coordinator.core import Coordinator
from hubgrpo.coordinator.gc import collect
from hubgrpo.errors import HubGrpoError
from tests.support.coord_helpers import FakeClock
from tests.support.merged_versions import SECRET, run_versions
from tests.support.s3_faults import Fault, proxy  # noqa: F401  (a fixture)

EXE = Path(sys.executable).with_name("hubgrpo")


def _objects(store) -> dict[str, int]:
    """Objects of the repo by kind (blobs, commits, refs)."""
    out: dict[str, int] = {}
    for key, _ in store.objects.list(""):
        kind = key.split("/")[0]
        out[kind] = out.get(kind, 0) + 1
    return out


def _adapters(store) -> dict[str, bytes]:
    return {tag: store.read(layout.ADAPTER_WEIGHTS, sha) for tag, sha in store.tags().items()}


def _check_after_gc(store, before: dict[str, bytes], kept: list[str], tmp_path, version: int) -> None:
    from hubgrpo.store.s3 import S3Store

    fresh = S3Store(store.location, cache_dir=tmp_path / f"fresh-{len(os.listdir(tmp_path))}")
    assert len(fresh.history()) == 1 and sorted(fresh.tags()) == kept
    assert _adapters(fresh) == {t: before[t] for t in kept}  # each kept version loads by its tag, unchanged
    c = Coordinator(fresh, SECRET, clock=FakeClock(2_000_000.0), workdir=tmp_path / f"c-{len(os.listdir(tmp_path))}")
    assert c.state.version == version
    run_versions(fresh, tmp_path, 1, c)  # and merges on
    assert c.state.version == version + 1


@pytest.mark.timeout(300)
def test_gc_on_s3_squashes_the_history_and_deletes_what_no_kept_ref_reaches(tmp_path, s3_bucket_url, monkeypatch):
    from hubgrpo.store import s3_gc
    from hubgrpo.store.s3 import S3Store

    store = S3Store(f"{s3_bucket_url}/run", cache_dir=tmp_path / "cache")
    store.create()
    run_versions(store, tmp_path, 6)
    before, objects = _adapters(store), _objects(store)
    monkeypatch.setattr(s3_gc, "GRACE_S", 0.0)  # the objects of this test are seconds old
    report = collect(store, 2, dry_run=True)
    assert report["dropped"] == [f"v{v:06d}" for v in range(5)] and _objects(store) == objects
    collect(store, 2, force=True)  # force: its commits are seconds old (gc refuses a run that looks live)
    after = _objects(store)
    print(f"objects before gc: {objects}; after: {after}")
    assert after["commits"] == 3 and after["refs"] == 3  # main + the 2 kept tags' commits; main + 2 tags
    assert after["blobs"] < objects["blobs"] / 2
    _check_after_gc(store, before, ["v000005", "v000006"], tmp_path, 6)
    again = _objects(store)
    collect(store, 2, force=True)  # a second gc changes nothing it should not
    assert len(store.history()) == 1 and sorted(store.tags()) == ["v000006", "v000007"]
    assert _objects(store)["commits"] <= again["commits"]


@pytest.mark.timeout(300)
def test_gc_on_s3_through_the_cli_keeps_recent_unreachable_objects_for_a_later_gc(tmp_path, s3_bucket_url):
    """The installed `hubgrpo gc`: dry run, then --yes. Objects younger than the grace period (an hour) stay, so
    that a commit in flight (blobs uploaded, manifest not yet swapped in) never loses its blobs."""
    from hubgrpo.store.s3 import S3Store

    store = S3Store(f"{s3_bucket_url}/cli", cache_dir=tmp_path / "cache")
    store.create()
    run_versions(store, tmp_path, 4)
    before, objects = _adapters(store), _objects(store)
    env = dict(os.environ)
    r = subprocess.run([str(EXE), "gc", "--repo", f"{s3_bucket_url}/cli", "--keep", "2"], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "would keep 2 versions" in r.stdout, r.stdout + r.stderr
    r = subprocess.run([str(EXE), "gc", "--repo", f"{s3_bucket_url}/cli", "--keep", "2", "--yes", "--force"], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "history 9 commits -> 1" in r.stdout
    after = _objects(store)
    assert after["refs"] == 3 and after["blobs"] == objects["blobs"]  # tags dropped; young blobs kept for now
    _check_after_gc(store, before, ["v000003", "v000004"], tmp_path, 4)


@pytest.mark.timeout(600)
def test_gc_on_s3_that_fails_at_any_write_loses_nothing_and_a_rerun_finishes(tmp_path, s3_bucket_url, proxy,
                                                                             monkeypatch):
    import re

    from hubgrpo.store import s3_gc
    from hubgrpo.store.s3 import S3Store

    monkeypatch.setattr(s3_gc, "GRACE_S", 0.0)
    direct = S3Store(f"{s3_bucket_url}/crash", cache_dir=tmp_path / "cache")
    direct.create()
    run_versions(direct, tmp_path, 4)
    snapshot = {k: direct.objects.get(k, max_bytes=1 << 30)[0] for k, _ in direct.objects.list("")}
    before = _adapters(direct)

    def restore() -> None:  # the repo as it was before gc
        keys = [k for k, _ in direct.objects.list("")]
        direct.objects.delete([k for k in keys if k not in snapshot])
        for k, body in snapshot.items():
            direct.objects.put(k, body)

    def through_proxy(name: str) -> S3Store:
        return S3Store(direct.location, endpoint_url=proxy.url, cache_dir=tmp_path / name, retry_base_s=0.01,
                       max_retries=2)

    start = len(proxy.answered)
    collect(through_proxy("clean"), 2, force=True)
    writes = [(m, re.sub(r"[0-9a-f]{40}", "[0-9a-f]{40}", re.escape(p.split("?")[0])))  # a new commit: a new sha
              for m, p, _, _ in proxy.answered[start:] if m in ("PUT", "POST", "DELETE")]
    probe = [i for i, (m, p) in enumerate(writes) if "probe" in p]
    writes = writes[probe[-1] + 2:]  # after the conditional-write probe: its two PUTs and its clean-up
    assert [m for m, _ in writes] == ["PUT", "PUT", "POST", "POST", "POST"], writes  # commit, head, 3 deletes
    for i, (method, path) in enumerate(writes):
        restore()
        proxy.faults.clear()
        earlier = writes[:i].count((method, path)) + (method == "POST")  # the probe's clean-up is a POST too
        proxy.add(Fault(method, "^" + path + r"(\?|$)", status=500, times=100, skip=earlier))
        with pytest.raises(HubGrpoError, match="500"):
            collect(through_proxy(f"fail{i}"), 2, force=True)
        proxy.faults.clear()
        survivor = S3Store(direct.location, cache_dir=tmp_path / f"after{i}")
        tags = survivor.tags()
        assert {"v000003", "v000004"} <= set(tags), (i, method, path)  # kept versions never lose their tag
        assert {t: survivor.read(layout.ADAPTER_WEIGHTS, tags[t]) for t in ("v000003", "v000004")} == \
            {t: before[t] for t in ("v000003", "v000004")}
        assert runrepo.read_state(survivor).version == 4
        collect(survivor, 2, force=True)  # the rerun finishes the job
        assert len(survivor.history()) == 1 and sorted(survivor.tags()) == ["v000003", "v000004"]
    _check_after_gc(direct, before, ["v000003", "v000004"], tmp_path, 4)
