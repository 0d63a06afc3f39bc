"""S3Store beyond the contract: faults between the store and a real S3 server (lost answers, 503 SlowDown, 409,
412, timeouts, a racing writer), a bucket that lies, and what ``open_store`` / a missing boto3 say."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import pytest

from hubgrpo.errors import CommitConflict, ConfigError, InvalidPath, StoreError
from tests.support.s3_faults import Fault, proxy  # noqa: F401  (a fixture)

REF = r"/\.hubgrpo/refs/heads/main$"


@pytest.fixture
def stores(s3_bucket_url, proxy, tmp_path):
    """(a store whose requests go through the fault proxy, a second client of the same repo talking directly)."""
    from hubgrpo.store.s3 import S3Store

    url = f"{s3_bucket_url}/repo"
    direct = S3Store(url, cache_dir=tmp_path / "direct")
    direct.create()
    faulty = S3Store(url, endpoint_url=proxy.url, cache_dir=tmp_path / "faulty", timeout_s=2.0, retry_base_s=0.01)
    return faulty, direct


def _markers(store) -> list[str]:
    return [c.marker for c in store.history()]


@pytest.mark.timeout(60)
def test_a_lost_answer_to_a_swap_that_landed_commits_once(stores, proxy):
    faulty, direct = stores
    base = direct.commit({"a.txt": b"0"}, message="base")
    fault = proxy.add(Fault("PUT", REF, drop_after=True))
    sha = faulty.commit({"a.txt": b"1"}, message="lost answer", parent=base)
    assert fault.hits == 1
    assert direct.head() == sha and direct.read("a.txt") == b"1"
    assert [c.message for c in direct.history()] == ["lost answer", "base"]  # once, not twice
    # the same without a parent: the retry must not re-apply the commit on top of itself
    proxy.add(Fault("PUT", REF, drop_after=True))
    sha2 = faulty.commit({"b.txt": b"2"}, message="lost again")
    assert direct.head() == sha2 and [c.message for c in direct.history()][:2] == ["lost again", "lost answer"]
    assert len(set(_markers(direct))) == 3


@pytest.mark.timeout(60)
def test_a_lost_swap_answer_then_an_outage_of_the_head_still_commits_once(stores, proxy):
    faulty, direct = stores
    base = direct.commit({"a.txt": b"0"}, message="base")
    outage = Fault("GET", REF, status=503, times=8)  # longer than the retries of one head read
    proxy.add(Fault("PUT", REF, drop_after=True, before=lambda: proxy.add(outage)))
    sha = faulty.commit({"a.txt": b"1"}, message="lost, then blind", parent=base)
    assert outage.hits == 8 and direct.head() == sha
    assert [c.message for c in direct.history()] == ["lost, then blind", "base"]


@pytest.mark.timeout(60)
def test_a_swap_whose_answer_comes_after_the_timeout_lands_once(stores, proxy):
    faulty, direct = stores
    base = direct.commit({"a.txt": b"0"}, message="base")
    fault = proxy.add(Fault("PUT", REF, delay_s=3.0))  # longer than the client's 2 s read timeout
    sha = faulty.commit({"a.txt": b"1"}, message="slow swap", parent=base)
    assert fault.hits == 1 and direct.head() == sha
    assert [c.message for c in direct.history()] == ["slow swap", "base"]


@pytest.mark.timeout(60)
def test_a_dropped_swap_that_did_not_land_is_sent_again(stores, proxy):
    faulty, direct = stores
    base = direct.commit({"a.txt": b"0"}, message="base")
    fault = proxy.add(Fault("PUT", REF, drop_before=True))
    sha = faulty.commit({"a.txt": b"1"}, message="second try", parent=base)
    assert fault.hits == 1 and direct.head() == sha
    swaps = [p for m, p in proxy.seen if m == "PUT" and p.endswith("/refs/heads/main")]
    assert len(swaps) == 2 and [c.message for c in direct.history()] == ["second try", "base"]


@pytest.mark.timeout(60)
def test_503_slowdown_and_409_are_retried(stores, proxy):
    faulty, direct = stores
    slow_reads = proxy.add(Fault("GET", REF, status=503, times=2))
    slow_blob = proxy.add(Fault("PUT", r"/blobs/", status=503, times=2))
    busy = proxy.add(Fault("PUT", REF, status=409, times=2))
    sha = faulty.commit({"a.txt": b"1", "b.txt": b"2"}, message="through faults")
    assert (slow_reads.hits, slow_blob.hits, busy.hits) == (2, 2, 2)
    assert direct.head() == sha and direct.read("b.txt") == b"2"
    assert len(direct.history()) == 1
    proxy.add(Fault("GET", r"/blobs/", status=503, times=3))
    assert faulty.read("a.txt") == b"1"


@pytest.mark.timeout(60)
def test_a_racing_writer_makes_a_cas_commit_conflict_and_a_plain_one_reapply(stores, proxy):
    faulty, direct = stores
    base = direct.commit({"state.json": b"0"}, message="base")
    won = []
    proxy.add(Fault("PUT", REF, before=lambda: won.append(direct.commit({"state.json": b"other"},
                                                                        message="the racer", parent=base))))
    with pytest.raises(CommitConflict):
        faulty.commit({"state.json": b"mine"}, message="loses the race", parent=base)
    assert direct.head() == won[0] and direct.read("state.json") == b"other"
    proxy.add(Fault("PUT", REF, before=lambda: direct.commit({"racer.txt": b"r"}, message="racer 2")))
    sha = faulty.commit({"mine.txt": b"m"}, message="re-applied")
    assert direct.head() == sha and direct.read("racer.txt") == b"r" and direct.read("mine.txt") == b"m"
    assert [c.message for c in direct.history()] == ["re-applied", "racer 2", "the racer", "base"]


@pytest.mark.timeout(60)
def test_an_injected_412_on_the_swap_is_a_conflict_and_changes_nothing(stores, proxy):
    faulty, direct = stores
    base = direct.commit({"a.txt": b"0"}, message="base")
    proxy.add(Fault("PUT", REF, status=412))
    with pytest.raises(CommitConflict):
        faulty.commit({"a.txt": b"1"}, message="refused", parent=base)
    assert direct.head() == base and direct.read("a.txt") == b"0"


@pytest.mark.timeout(60)
def test_an_outage_longer_than_the_retries_is_an_error_not_a_commit(stores, proxy):
    from hubgrpo.errors import StoreUnavailable

    faulty, direct = stores
    base = direct.commit({"a.txt": b"0"}, message="base")
    proxy.add(Fault("PUT", REF, status=503, times=100))
    with pytest.raises(StoreUnavailable):
        faulty.commit({"a.txt": b"1"}, message="never lands", parent=base)
    assert direct.head() == base


@pytest.mark.timeout(60)
def test_a_lost_answer_to_a_tag_is_recognised(stores, proxy):
    faulty, direct = stores
    sha = direct.commit({"a.txt": b"0"}, message="v0")
    proxy.add(Fault("PUT", r"/refs/tags/v000000$", drop_after=True))
    faulty.tag("v000000", sha)  # not "already exists": that tag is ours
    assert direct.tags() == {"v000000": sha}
    with pytest.raises(StoreError) as err:
        faulty.tag("v000000", sha)
    assert err.value.code == "exists"


@pytest.mark.timeout(60)
def test_blobs_are_downloaded_once_and_old_revisions_stay_readable(stores, proxy):
    faulty, direct = stores
    h1 = direct.commit({"w.bin": b"x" * 1000, "c.json": b"{}"}, message="one")
    direct.commit({"c.json": b"{\"a\": 1}"}, message="two")
    assert faulty.read("w.bin", h1) == b"x" * 1000
    assert faulty.read("w.bin") == b"x" * 1000  # same blob at the head: served from the cache
    assert faulty.read("c.json", h1) == b"{}"
    gets = [p for m, p in proxy.seen if m == "GET" and "/blobs/" in p]
    assert len(gets) == 2, gets


def _tamper(s3_bucket_url, key: str, body: bytes) -> None:
    import boto3

    bucket = s3_bucket_url[len("s3://"):]
    boto3.client("s3").put_object(Bucket=bucket, Key=f"repo/.hubgrpo/{key}", Body=body)


@pytest.mark.timeout(60)
def test_a_bucket_that_lies_is_caught(stores, s3_bucket_url, tmp_path):
    from hubgrpo.store.s3 import S3Store

    _, direct = stores
    sha = direct.commit({"a.txt": b"hello"}, message="honest")
    blob = hashlib.sha256(b"hello").hexdigest()
    _tamper(s3_bucket_url, f"blobs/{blob}", b"jello")  # same size, other bytes
    fresh = S3Store(direct.location, cache_dir=tmp_path / "fresh")
    with pytest.raises(StoreError, match="does not match its hash"):
        fresh.read("a.txt")
    manifest = json.loads(fresh.objects.get(f"commits/{sha}.json", max_bytes=1 << 20)[0])
    manifest["message"] = "rewritten"
    _tamper(s3_bucket_url, f"commits/{sha}.json", json.dumps(manifest).encode())
    with pytest.raises(StoreError, match="does not hash to its name"):
        S3Store(direct.location, cache_dir=tmp_path / "f2").history()
    bomb = b"[" * 100_000 + b"]" * 100_000
    evil = hashlib.sha1(bomb).hexdigest()
    _tamper(s3_bucket_url, f"commits/{evil}.json", bomb)
    _tamper(s3_bucket_url, "refs/heads/main", json.dumps({"commit": evil}).encode())
    with pytest.raises(StoreError) as err:
        S3Store(direct.location, cache_dir=tmp_path / "f3").list_files()
    assert err.value.code == "corrupt"
    from hubgrpo.store.manifest import encode

    sneaky, data = encode({"../../etc/passwd": ("0" * 64, 1)}, None, "m", "x", 1.0)
    _tamper(s3_bucket_url, f"commits/{sneaky}.json", data)
    _tamper(s3_bucket_url, "refs/heads/main", json.dumps({"commit": sneaky}).encode())
    with pytest.raises(InvalidPath):
        S3Store(direct.location, cache_dir=tmp_path / "f4").list_files()
    _tamper(s3_bucket_url, "refs/heads/main", b"{\"commit\": \"" + b"a" * 5000 + b"\"}")
    with pytest.raises(StoreError, match="bytes, more than"):
        S3Store(direct.location, cache_dir=tmp_path / "f5").head()


def test_s3_urls_are_checked():
    from hubgrpo.store import open_store

    for bad in ("s3://", "s3://A_B/run", "s3://ab/../x", "s3://bucket/a//b"):
        with pytest.raises(ConfigError, match="s3://"):
            open_store(bad)
    store = open_store("s3://my-bucket/runs/run1/")
    assert store.location == "s3://my-bucket/runs/run1" and store.objects.prefix == "runs/run1/.hubgrpo/"


def test_without_boto3_the_error_says_what_to_install():
    code = ("import sys; sys.modules['boto3'] = None\n"
            "from hubgrpo.store import open_store\n"
            "from hubgrpo.errors import ConfigError\n"
            "try:\n    open_store('s3://bucket/run')\nexcept ConfigError as e:\n    print(e)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "boto3" in r.stdout and "pip install 'hubgrpo[s3]'" in r.stdout
