"""Rounds committed to the run repo are listed with their sizes and refused before anything is downloaded: a
`hubgrpo coordinator` process that cannot write a file over 16 MiB (RLIMIT_FSIZE) refuses a 300 MiB adapter with
its code, and the Hub emulator serves none of its bytes."""

from __future__ import annotations

import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hubgrpo import layout
from hubgrpo.coordinator.repo_init import init_repo
from hubgrpo.errors import HubGrpoError
from tests.support.coord_helpers import make_config, push_submission, write_adapter

EXE = Path(sys.executable).with_name("hubgrpo")
FSIZE = 16 << 20  # the largest file the coordinator process may write


def _no_big_files() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (FSIZE, FSIZE))


def _serve(repo: str, tmp_path: Path, env: dict) -> tuple[subprocess.Popen, str]:
    """`hubgrpo coordinator` in its own process, unable to write a file larger than FSIZE; (process, URL)."""
    log = tmp_path / "coordinator.log"
    proc = subprocess.Popen([str(EXE), "coordinator", "--repo", repo, "--port", "0"], env=env, cwd=str(tmp_path),
                            stdout=open(log, "wb"), stderr=subprocess.STDOUT, preexec_fn=_no_big_files,
                            start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        found = re.search(r"at (http://127\.0\.0\.1:\d+)", log.read_text(errors="replace"))
        if found:
            return proc, found.group(1)
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"the coordinator did not start:\n{log.read_text(errors='replace')[-3000:]}")


def _huge_adapter(mib: int):
    def mutate(folder: Path) -> None:
        with open(folder / layout.ADAPTER_WEIGHTS, "r+b") as f:
            f.truncate(mib << 20)  # sparse: valid header, then zeros
    return mutate


def _submit_huge(store, url: str, tmp_path: Path, mib: int) -> HubGrpoError:
    from hubgrpo.worker.client import CoordinatorClient

    client = CoordinatorClient(url, retries=1)
    lease = client.lease("w0")
    sha = push_submission(store, lease, tmp_path / "rounds", seed=1, mutate=_huge_adapter(mib))
    with pytest.raises(HubGrpoError) as err:
        client.submit(lease, sha)
    return err.value


def _big_files(root: Path) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and p.stat().st_blocks * 512 > FSIZE]


@pytest.mark.timeout(300)
def test_an_oversized_round_in_a_local_repo_is_refused_before_it_is_copied(tmp_path):
    from hubgrpo.store.local import LocalStore

    store = LocalStore(tmp_path / "repo")
    init_repo(store, make_config(), write_adapter(tmp_path / "v0", seed=0))
    env = dict(os.environ, HUBGRPO_CACHE=str(tmp_path / "cache"), OMP_NUM_THREADS="1")
    proc, url = _serve(str(tmp_path / "repo"), tmp_path, env)
    try:
        err = _submit_huge(store, url, tmp_path, 300)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    log = (tmp_path / "coordinator.log").read_text(errors="replace")
    assert err.code == "too_large", (err, log[-3000:])
    assert "300" in err.message or "314,572,800" in err.message or "bytes" in err.message
    assert "File too large" not in log
    assert not (store.meta / "snapshots").exists() or not _big_files(store.meta / "snapshots")
    assert not _big_files(tmp_path / "cache")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mib", [40, pytest.param(300, marks=pytest.mark.slow)])
def test_an_oversized_round_on_the_hub_is_refused_before_any_byte_is_downloaded(tmp_path, hub_emulator, mib):
    from hubgrpo.store.hub import HubStore
    from tests.conftest import TEST_TOKEN

    served = []
    resolve = hub_emulator.api.resolve

    def counting(req, t, rid, rev, path):
        resp = resolve(req, t, rid, rev, path)
        served.append((path, len(resp.body) if isinstance(resp.body, (bytes, bytearray)) else 0))
        return resp

    hub_emulator.api.resolve = counting
    store = HubStore("alice/sizes", token=TEST_TOKEN, endpoint=hub_emulator.url)
    store.create()
    init_repo(store, make_config(), write_adapter(tmp_path / "v0", seed=0))
    env = dict(os.environ, HF_ENDPOINT=hub_emulator.url, HF_TOKEN=TEST_TOKEN, HF_HOME=str(tmp_path / "hf"),
               HUBGRPO_CACHE=str(tmp_path / "cache"), OMP_NUM_THREADS="1")
    proc, url = _serve("alice/sizes", tmp_path, env)
    try:
        err = _submit_huge(store, url, tmp_path, mib)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    log = (tmp_path / "coordinator.log").read_text(errors="replace")
    assert err.code == "too_large", (err, log[-3000:])
    from_submissions = sum(n for p, n in served if p.startswith(layout.SUBMISSIONS + "/"))
    print(f"bytes the emulator served from submissions/: {from_submissions}")
    assert from_submissions == 0
    assert not _big_files(tmp_path / "hf") and not _big_files(tmp_path / "cache")


@pytest.mark.timeout(120)
def test_every_store_lists_sizes_without_downloading(store_factory):
    store = store_factory("sizes")
    sha = store.commit({"a/x.bin": b"12345", "a/b/y.bin": b"", "c.txt": b"1"}, message="files")
    assert store.file_sizes("a", sha) == {"a/x.bin": 5, "a/b/y.bin": 0}
    everything = store.file_sizes("", sha)
    assert sorted(everything) == store.list_files("", sha)  # the Hub's own first commit has .gitattributes
    assert {p: everything[p] for p in ("a/x.bin", "a/b/y.bin", "c.txt")} == {"a/x.bin": 5, "a/b/y.bin": 0, "c.txt": 1}
    assert store.file_sizes("missing") == {}


@pytest.mark.timeout(300)
def test_an_oversized_record_in_the_repo_is_never_downloaded_by_a_scan(tmp_path, hub_emulator):
    """A 40 MiB submission.json committed to the run repo (the largest record read is 8 MiB): the coordinator's
    scans (at start, then every minute) refuse it from the tree listing; the emulator serves none of it."""
    from hubgrpo.coordinator.core import Coordinator
    from hubgrpo.store.hub import HubStore
    from tests.conftest import TEST_TOKEN
    from tests.support.coord_helpers import FakeClock

    served = []
    resolve = hub_emulator.api.resolve

    def counting(req, t, rid, rev, path):
        resp = resolve(req, t, rid, rev, path)
        served.append((path, len(resp.body)))
        return resp

    hub_emulator.api.resolve = counting
    store = HubStore("alice/records", token=TEST_TOKEN, endpoint=hub_emulator.url, cache_dir=tmp_path / "hf")
    store.create()
    init_repo(store, make_config(), write_adapter(tmp_path / "v0", seed=0))
    store.commit({layout.submission_path(0, "junk-j1", layout.SUBMISSION_FILE): b"{" * (40 << 20)},
                 message="a record nobody can read")
    c = Coordinator(store, b"secret", clock=FakeClock(), workdir=tmp_path / "work")  # its first scan
    for prepared in c.scan():
        c.accept_quietly(prepared)
    from_submissions = sum(n for p, n in served if p.startswith(layout.SUBMISSIONS + "/"))
    print(f"bytes the emulator served from submissions/ in two scans: {from_submissions}")
    assert from_submissions == 0
