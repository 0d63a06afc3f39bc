"""The Store contract, run against every backend (``store_factory``: "local", "hub" and "s3").

Everything a caller of ``hubgrpo.store.base.Store`` may rely on is asserted here; backend-only behaviour lives in
``test_store_<backend>.py``. On the Hub a new repo already has an initial commit (and maybe ``.gitattributes``),
so tests list under a prefix and never assume ``head()`` is None.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from hubgrpo.errors import CommitConflict, InvalidPath, NotFound, StoreError
from tests.conftest import TEST_TOKEN

ROOT = Path(__file__).resolve().parents[2]

# Run in a fresh interpreter: argv = spec json, mode, worker id, commits. Retries only what cannot duplicate a
# commit: RepoBusy/RateLimited (the head did not move) and, in "counter" mode, CommitConflict (re-read, redo).
WORKER = r"""
import json, random, sys, time
from hubgrpo.errors import CommitConflict, RateLimited, RepoBusy
spec, mode, wid, n = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
if spec["kind"] == "local":
    from hubgrpo.store.local import LocalStore
    store = LocalStore(spec["root"])
elif spec["kind"] == "s3":
    from hubgrpo.store.s3 import S3Store
    store = S3Store(spec["url"], cache_dir=spec["cache"], retry_base_s=0.05)
else:
    from hubgrpo.store.hub import HubStore
    store = HubStore(spec["repo_id"], token=spec["token"], endpoint=spec["endpoint"])
retried = 0
for j in range(n):
    while True:
        try:
            if mode == "disjoint":
                store.commit({f"w/{wid:02d}/{j:02d}.txt": f"{wid}-{j}".encode()}, message=f"w{wid}-{j}")
            else:
                head = store.head()
                value = int(store.read("counter.txt", head))
                store.commit({"counter.txt": str(value + 1).encode()}, message=f"inc {wid}-{j}", parent=head)
            break
        except (RepoBusy, RateLimited, CommitConflict) as e:
            if isinstance(e, CommitConflict) and mode == "disjoint":
                raise
            retried += 1
            time.sleep(random.uniform(0.001, 0.02))
print(retried)
"""


def _spec(make, name: str) -> str:
    """How a subprocess opens the same repo as ``make(name)``."""
    if make.kind == "local":
        return json.dumps({"kind": "local", "root": make(name).location})
    if make.kind == "s3":
        return json.dumps({"kind": "s3", "url": make(name).location, "cache": str(make(name).cache_dir)})
    return json.dumps({"kind": "hub", "repo_id": f"alice/{name}", "token": TEST_TOKEN,
                       "endpoint": make.emulator.url})


def _run_workers(make, name: str, mode: str, workers: int, commits: int, timeout: float) -> list[int]:
    """Start ``workers`` processes at once and wait for all; returns the retries each one needed."""
    spec = _spec(make, name)
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, spec, mode, str(w), str(commits)], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for w in range(workers)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=timeout)
        assert p.returncode == 0, f"worker failed ({p.returncode}):\n{err[-3000:]}"
        outs.append(int(out.strip()))
    return outs


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ---------------------------------------------------------------------------------------------- files


@pytest.mark.timeout(90)
def test_round_trip_small_and_20mb_file(store_factory, tmp_path):
    store = store_factory()
    big = os.urandom(20 << 20)
    src = tmp_path / "upload" / "big.bin"
    src.parent.mkdir()
    src.write_bytes(big)
    sha = store.commit({"notes/a.txt": b"hello", "big/adapter.bin": src}, message="two files")
    assert store.head() == sha
    assert store.read("notes/a.txt") == b"hello"
    assert _sha(store.read("big/adapter.bin")) == _sha(big)
    assert _sha(store.read("big/adapter.bin", revision=sha)) == _sha(big)
    local = store.local_path("big/adapter.bin", revision=sha)
    assert local.name == "adapter.bin" and _sha(local.read_bytes()) == _sha(big)
    assert store.list_files("big") == ["big/adapter.bin"]
    assert store.list_files("notes/") == ["notes/a.txt"]
    assert store.exists_file("notes/a.txt") and not store.exists_file("notes/b.txt")
    assert store.list_files("no/such/folder") == []


@pytest.mark.timeout(30)
def test_commit_without_change_returns_head(store_factory):
    store = store_factory()
    first = store.commit({"a.txt": b"1"}, message="first")
    n = len(store.history())
    assert store.commit({"a.txt": b"1"}, message="same content") == first
    assert store.head() == first and len(store.history()) == n


@pytest.mark.timeout(30)
def test_empty_message_refused(store_factory):
    store = store_factory()
    before = store.head()
    for message in ("", "   "):
        with pytest.raises(StoreError):
            store.commit({"a.txt": b"1"}, message=message)
    assert store.head() == before


# ---------------------------------------------------------------------------------------------- atomicity


@pytest.mark.timeout(30)
def test_invalid_paths_rejected_and_nothing_committed(store_factory):
    store = store_factory()
    base = store.commit({"keep.txt": b"k"}, message="base")
    for bad in ("../escape.txt", "a/../../b", "/abs/path", "a\\b.txt", "a//b", "a/./b", "a/", ""):
        with pytest.raises(InvalidPath):
            store.commit({"ok/1.txt": b"1", bad: b"x", "ok/2.txt": b"2"}, message=f"bad {bad!r}")
        with pytest.raises(InvalidPath):
            store.read(bad)
    with pytest.raises(InvalidPath):
        store.commit({"ok/1.txt": b"1"}, ["../keep.txt"], message="bad delete")
    assert store.head() == base
    assert store.list_files("ok") == [] and store.read("keep.txt") == b"k"


@pytest.mark.timeout(30)
def test_failed_delete_discards_the_whole_commit(store_factory):
    store = store_factory()
    base = store.commit({"keep.txt": b"k"}, message="base")
    with pytest.raises(NotFound):
        store.commit({"new/1.txt": b"1", "new/2.txt": b"2"}, ["missing.txt"], message="delete a missing file")
    assert store.head() == base and store.list_files("new") == []


@pytest.mark.timeout(90)
def test_reader_never_sees_half_a_commit(store_factory):
    """Each commit adds batch/<i>/f0..f4 and sets cur/f0..f4 to i; any head shows all of a commit or none."""
    store, reader_store = store_factory(), store_factory()  # two clients of one repo
    width, commits = 5, 20
    stop, heads, errors, passes = threading.Event(), set(), [], [0]

    def reader():
        while not stop.is_set():
            passes[0] += 1
            head = reader_store.head()
            batches: dict[str, int] = {}
            for p in reader_store.list_files("batch", head):
                batches[p.split("/")[1]] = batches.get(p.split("/")[1], 0) + 1
            heads.add(head)
            if any(c != width for c in batches.values()):
                errors.append(f"{head}: partial batch {batches}")
            if batches:
                cur = {reader_store.read(f"cur/f{k}", head) for k in range(width)}
                if cur != {str(len(batches) - 1).encode()}:
                    errors.append(f"{head}: {len(batches)} batches but cur = {cur}")

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    try:
        for i in range(commits):
            adds = {f"batch/{i:03d}/f{k}": os.urandom(64) for k in range(width)}
            adds.update({f"cur/f{k}": str(i).encode() for k in range(width)})
            store.commit(adds, message=f"batch {i}")
            if i % 5 == 4:  # on a loaded machine the reader may starve: let it read a head after this commit
                seen, deadline = passes[0], time.monotonic() + 10
                while passes[0] < seen + 2 and time.monotonic() < deadline and thread.is_alive():
                    time.sleep(0.01)
    finally:
        stop.set()
        thread.join(30)
    assert not errors, errors[:5]
    assert len(heads) >= 3, "the reader should have observed several heads"
    assert len(store.list_files("batch")) == width * commits


# ---------------------------------------------------------------------------------------------- compare-and-swap


@pytest.mark.timeout(30)
def test_compare_and_swap_conflict_leaves_repo_unchanged(store_factory):
    store = store_factory()
    h1 = store.commit({"state.json": b"1"}, message="one")
    h2 = store.commit({"state.json": b"2"}, message="two", parent=h1)
    with pytest.raises(CommitConflict):
        store.commit({"state.json": b"3", "other.txt": b"x"}, message="stale", parent=h1)
    assert store.head() == h2
    assert store.read("state.json") == b"2" and not store.exists_file("other.txt")
    assert store.commit({"state.json": b"3"}, message="three", parent=h2) == store.head()
    h4 = store.commit({"state.json": b"4"}, message="short parent", parent=store.head()[:12])
    assert store.head() == h4 and store.read("state.json") == b"4"


@pytest.mark.timeout(180)
def test_16_processes_commit_disjoint_paths(store_factory):
    store = store_factory("many")
    _run_workers(store_factory, "many", "disjoint", workers=16, commits=10, timeout=170)
    files = store.list_files("w")
    assert len(files) == 160
    for w in (0, 7, 15):
        for j in range(10):
            assert store.read(f"w/{w:02d}/{j:02d}.txt") == f"{w}-{j}".encode()
    messages = [c.message for c in store.history() if c.message.startswith("w")]
    assert len(messages) == 160 and len(set(messages)) == 160, "a commit was lost or duplicated"


@pytest.mark.timeout(180)
def test_8_writers_increment_a_counter_with_cas(store_factory):
    store = store_factory("counter")
    store.commit({"counter.txt": b"0"}, message="counter starts at 0")
    _run_workers(store_factory, "counter", "counter", workers=8, commits=6, timeout=170)
    assert store.read("counter.txt") == b"48"
    incs = [c for c in store.history() if c.message.startswith("inc ")]
    assert len(incs) == 48 and len({c.message for c in incs}) == 48


@pytest.mark.timeout(60)
def test_threads_share_one_store(store_factory):
    store = store_factory()
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            for j in range(5):
                _commit_retrying_busy(store, {f"t/{t}/{j}.txt": f"{t}.{j}".encode()}, f"thread {t}.{j}")
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(50)
    assert not errors, errors
    assert len(store.list_files("t")) == 30 and store.read("t/5/4.txt") == b"5.4"


def _commit_retrying_busy(store, adds, message):
    from hubgrpo.errors import RateLimited, RepoBusy

    for _ in range(200):
        try:
            return store.commit(adds, message=message)
        except (RepoBusy, RateLimited):
            threading.Event().wait(0.01)
    raise AssertionError("repo stayed busy")


# ---------------------------------------------------------------------------------------------- revisions


@pytest.mark.timeout(30)
def test_pinned_revision_keeps_old_content(store_factory):
    store = store_factory()
    h1 = store.commit({"adapter/w.bin": b"old", "adapter/c.json": b"{}", "gone.txt": b"g"}, message="v0")
    store.commit({"adapter/w.bin": b"new"}, ["gone.txt"], message="v1")
    store.commit({"extra.txt": b"e"}, message="v2")
    assert store.read("adapter/w.bin") == b"new"
    assert store.read("adapter/w.bin", revision=h1) == b"old"
    assert store.local_path("adapter/w.bin", revision=h1).read_bytes() == b"old"
    assert store.read("gone.txt", revision=h1) == b"g"
    with pytest.raises(NotFound):
        store.read("gone.txt")
    assert store.list_files("adapter", revision=h1) == ["adapter/c.json", "adapter/w.bin"]
    assert "gone.txt" in store.list_files(revision=h1) and "extra.txt" not in store.list_files(revision=h1)
    assert "gone.txt" not in store.list_files() and "extra.txt" in store.list_files()


@pytest.mark.timeout(30)
def test_history_newest_first(store_factory):
    store = store_factory()
    shas = [store.commit({"h.txt": str(i).encode()}, message=f"message {i}") for i in range(3)]
    hist = store.history(limit=3)
    assert [c.message for c in hist] == ["message 2", "message 1", "message 0"]
    assert [c.sha for c in hist] == shas[::-1] and hist[0].sha == store.head()
    assert hist[0].parents[0] == shas[1] and hist[1].parents[0] == shas[0]
    assert hist[0].created_at >= hist[1].created_at >= hist[2].created_at
    markers = [c.marker for c in hist]  # the id after MARKER_PREFIX in the commit description: a uuid4
    assert all(uuid.UUID(m).version == 4 for m in markers) and len(set(markers)) == 3
    assert len(store.history(limit=1)) == 1 and len(store.history()) >= 3


@pytest.mark.timeout(30)
def test_tags(store_factory):
    store = store_factory()
    h1 = store.commit({"v.txt": b"0"}, message="v0")
    store.tag("v000000", h1)
    h2 = store.commit({"v.txt": b"1"}, message="v1")
    store.tag("v000001", h2)
    assert {k: v for k, v in store.tags().items() if k.startswith("v0")} == {"v000000": h1, "v000001": h2}
    with pytest.raises(StoreError) as err:
        store.tag("v000000", h2)
    assert err.value.code == "exists"
    store.tag("v000000", h2, exist_ok=True)  # no error; an existing tag is not moved
    assert store.tags()["v000000"] == h1
    assert store.read("v.txt", revision="v000000") == b"0"
    with pytest.raises(NotFound):
        store.tag("v000009", "0" * 40)
    assert "v000009" not in store.tags()


@pytest.mark.timeout(30)
def test_not_found(store_factory):
    store = store_factory()
    head = store.commit({"a.txt": b"a"}, message="a")
    with pytest.raises(NotFound, match="missing.txt"):
        store.read("missing.txt")
    with pytest.raises(NotFound):
        store.read("a.txt", revision="0123456789abcdef0123456789abcdef01234567")
    with pytest.raises(NotFound):
        store.read("a.txt", revision="no-such-tag")
    with pytest.raises(NotFound):
        store.local_path("missing.txt")
    with pytest.raises(NotFound):
        store.commit({}, ["missing.txt"], message="delete a missing file")
    assert store.head() == head


@pytest.mark.timeout(30)
def test_delete_folder(store_factory):
    store = store_factory()
    store.commit({"d/x": b"1", "d/sub/y": b"2", "dd/z": b"3", "keep.txt": b"4"}, message="tree")
    store.commit({}, ["d/"], message="delete d/")
    assert store.list_files("d") == []
    assert store.read("dd/z") == b"3" and store.read("keep.txt") == b"4"
    store.commit({"d/new": b"5"}, ["keep.txt"], message="re-add d, delete a file")
    assert store.list_files("d") == ["d/new"] and not store.exists_file("keep.txt")


@pytest.mark.timeout(30)
def test_create_and_exists(store_factory):
    store = store_factory("created")
    assert store.exists()
    store.create(exist_ok=True)
    with pytest.raises(StoreError) as err:
        store.create(exist_ok=False)
    assert err.value.code == "exists"
    assert store_factory("created").exists()
