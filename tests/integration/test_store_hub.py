"""HubStore specifics over the real client and real HTTP: error mapping, retries, lost answers, chaos.

The shared behaviour of every Store is in test_store_contract.py; here each Hub fault kind is injected with the
emulator's ``fail_next``/``set_faults`` and the store's ``sleep`` is a recorder, so no test waits for real backoff.
"""

from __future__ import annotations

import random
import threading
import time

import pytest

from hubgrpo.errors import (
    AuthError,
    CommitConflict,
    InvalidPath,
    NotFound,
    RateLimited,
    RepoBusy,
    StoreError,
    StoreUnavailable,
)
from hubgrpo.store.hub import HubStore, retry_delay
from tests.conftest import TEST_TOKEN
from tests.support.hub_emulator import HubEmulator


@pytest.fixture
def sleeps():
    return []


@pytest.fixture
def make(hub_emulator, tmp_path, sleeps):
    """make(name, **kw) → a created HubStore on the emulator whose sleeps are recorded, not slept."""
    hub_emulator.set_faults(timeout_s=0.05)

    def _make(name: str = "run", **kw) -> HubStore:
        kw.setdefault("sleep", sleeps.append)
        store = HubStore(f"alice/{name}", token=TEST_TOKEN, endpoint=hub_emulator.url, cache_dir=tmp_path / "hf",
                         **kw)
        store.create(exist_ok=True)
        return store

    return _make


def _ours(store: HubStore, prefix: str) -> list:
    return [c for c in store.history() if c.message.startswith(prefix)]


# ------------------------------------------------------------------------------------------- retry policy


def test_retry_delay_policy():
    rng = random.Random(0)
    busy, down = RepoBusy("busy"), StoreUnavailable("down")
    for attempt in range(1, 8):
        for err in (busy, down):
            d = retry_delay(err, attempt, base_s=1.0, cap_s=30.0, rng=rng)
            assert 0.5 * min(30.0, 2 ** (attempt - 1)) <= d <= min(30.0, 2 ** (attempt - 1))
    assert 7.0 <= retry_delay(RateLimited("slow", wait_s=7), 1, rng=rng) <= 7.7
    for final in (CommitConflict("c"), NotFound("n"), AuthError("a"), StoreError("s")):
        assert retry_delay(final, 1, rng=rng) is None


# ------------------------------------------------------------------------------------------- fault kinds


@pytest.mark.timeout(30)
def test_busy_409_is_retried_with_jittered_backoff(make, hub_emulator, sleeps):
    store = make()
    hub_emulator.fail_next("409", 2)
    sha = store.commit({"a.txt": b"a"}, message="after two busy answers")
    assert store.head() == sha and len(_ours(store, "after two")) == 1
    assert len(sleeps) == 2 and 0.5 <= sleeps[0] <= 1.0 and 1.0 <= sleeps[1] <= 2.0
    assert hub_emulator.stats["faults"] == {"409": 2}


@pytest.mark.timeout(30)
def test_busy_409_gives_up_after_max_retries(make, hub_emulator, sleeps):
    store = make(max_retries=2)
    before = store.head()
    hub_emulator.fail_next("409", 5)
    with pytest.raises(RepoBusy, match="another commit") as info:
        store.commit({"a.txt": b"a"}, message="never")
    assert "head has not moved" in info.value.hint
    assert len(sleeps) == 2 and store.head() == before


@pytest.mark.timeout(30)
def test_429_waits_what_the_server_says(make, hub_emulator, sleeps):
    store = make()
    hub_emulator.set_faults(ratelimit_reset_s=7, timeout_s=0.05)
    hub_emulator.fail_next("429")
    store.commit({"a.txt": b"a"}, message="after a 429")
    assert len(sleeps) == 1 and 7.0 <= sleeps[0] <= 7.7
    impatient = make(max_retries=0)
    hub_emulator.fail_next("429")
    with pytest.raises(RateLimited) as info:
        impatient.commit({"b.txt": b"b"}, message="no retry")
    assert info.value.wait_s == 7.0 and "429" in info.value.message and info.value.hint


@pytest.mark.timeout(30)
def test_rate_limit_longer_than_max_wait_is_raised_not_slept(make, hub_emulator, sleeps):
    store = make(max_wait_s=5)
    hub_emulator.set_faults(ratelimit_reset_s=3600, timeout_s=0.05)
    hub_emulator.fail_next("429")
    with pytest.raises(RateLimited) as info:
        store.commit({"a.txt": b"a"}, message="quota")
    assert info.value.wait_s == 3600 and sleeps == []


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", ["500", "timeout"])
def test_unapplied_failure_is_retried_once_without_duplicate(make, hub_emulator, sleeps, kind):
    store = make()
    hub_emulator.fail_next(kind)
    sha = store.commit({"a.txt": kind.encode()}, message=f"through a {kind}")
    assert store.head() == sha and store.read("a.txt") == kind.encode()
    assert len(_ours(store, "through a")) == 1 and hub_emulator.stats["commits_applied"] == 1
    assert len(sleeps) == 1


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", ["lost-500", "lost-reset"])
def test_lost_answer_is_found_by_marker_not_committed_twice(make, hub_emulator, sleeps, kind):
    store = make()
    hub_emulator.fail_next(kind)
    sha = store.commit({"a.txt": b"a"}, message="answer lost")
    assert store.head() == sha
    ours = _ours(store, "answer lost")
    assert [c.sha for c in ours] == [sha] and ours[0].marker
    assert hub_emulator.stats["commits_applied"] == 1 and hub_emulator.stats["faults"] == {"lost": 1}


@pytest.mark.timeout(30)
def test_commit_landing_after_its_client_gave_up_is_not_duplicated(make, hub_emulator, sleeps):
    """The first try lands only after the retry was sent: the retry is pinned to the head seen, so it gets a 412
    instead of committing a duplicate, and the marker search then finds the late commit."""
    store = make()
    h0 = store.head()
    hub_emulator.fail_next("late")
    sha = store.commit({"a.txt": b"a"}, message="lands late")
    assert [c.sha for c in _ours(store, "lands late")] == [sha] and store.head() == sha
    assert store.history(limit=1)[0].parents == (h0,)
    assert hub_emulator.stats["commits_applied"] == 1 and hub_emulator.stats["faults"] == {"late": 1}


@pytest.mark.timeout(30)
def test_cas_commit_whose_answer_was_lost_is_success(make, hub_emulator):
    store = make()
    h1 = store.commit({"state.json": b"1"}, message="one")
    hub_emulator.fail_next("lost")
    h2 = store.commit({"state.json": b"2"}, message="two", parent=h1)
    assert store.head() == h2 != h1
    top = store.history(limit=1)[0]
    assert top.sha == h2 and top.parents == (h1,) and store.read("state.json") == b"2"


@pytest.mark.timeout(30)
def test_uncertain_failure_then_real_conflict_is_still_a_conflict(make, hub_emulator):
    store = make()
    h1 = store.commit({"s": b"1"}, message="one")
    h2 = store.commit({"s": b"2"}, message="two")
    hub_emulator.fail_next("500")
    with pytest.raises(CommitConflict, match="head moved"):
        store.commit({"s": b"3"}, message="stale after a 500", parent=h1)
    assert store.head() == h2


@pytest.mark.timeout(30)
def test_unavailable_after_bounded_retries(make, hub_emulator, sleeps):
    store = make(max_retries=3)
    before = store.head()
    hub_emulator.fail_next("500", 10)
    with pytest.raises(StoreUnavailable, match="500") as info:
        store.commit({"a.txt": b"a"}, message="hub down")
    assert "safe to retry" in info.value.hint
    assert len(sleeps) == 3 and sleeps[2] > sleeps[0]  # exponential
    assert store.head() == before and hub_emulator.stats["commits_applied"] == 0


@pytest.mark.timeout(30)
def test_tag_whose_answer_was_lost(make, hub_emulator):
    store = make()
    sha = store.commit({"v": b"0"}, message="v0")
    hub_emulator.fail_next("lost", paths=("tag",))
    store.tag("v000000", sha)
    assert store.tags()["v000000"] == sha


# ------------------------------------------------------------------------------------------- mapping


@pytest.mark.timeout(30)
def test_auth_and_not_found_mapping(make, hub_emulator):
    store = make()
    with pytest.raises(AuthError, match="401"):
        HubStore("alice/run", token="hf_wrong", endpoint=hub_emulator.url).head()
    with pytest.raises(AuthError, match="403"):
        HubStore("bob/run", token=TEST_TOKEN, endpoint=hub_emulator.url).create()
    with pytest.raises(NotFound, match="does not exist"):
        HubStore("alice/none", token=TEST_TOKEN, endpoint=hub_emulator.url).head()
    assert not HubStore("alice/none", token=TEST_TOKEN, endpoint=hub_emulator.url).exists()
    with pytest.raises(NotFound, match="revision"):
        store.list_files(revision="f" * 40)
    with pytest.raises(InvalidPath):
        store.list_files("../x")
    with pytest.raises(CommitConflict):
        store.commit({"a": b"a"}, message="bad parent", parent="not-a-sha")


@pytest.mark.timeout(30)
def test_bad_arguments_are_refused_before_any_request(make, hub_emulator, tmp_path):
    store = make()
    before = hub_emulator.stats["requests"]
    for adds, message in (({"a": "text"}, "str value"), ({"a": tmp_path / "missing.bin"}, "no file"),
                          ({"a": b"a"}, " ")):
        with pytest.raises(StoreError):
            store.commit(adds, message=message)
    for name in ("", "v/1", "main", "a" * 40, "-x"):
        with pytest.raises(StoreError, match="invalid tag name"):
            store.tag(name, "0" * 40)
    assert hub_emulator.stats["requests"] == before


@pytest.mark.timeout(30)
def test_env_endpoint_and_token(monkeypatch, hub_emulator, tmp_path):
    monkeypatch.setenv("HF_ENDPOINT", hub_emulator.url)
    monkeypatch.setenv("HF_TOKEN", TEST_TOKEN)
    store = HubStore("alice/from-env", cache_dir=tmp_path)
    store.create()
    assert store.endpoint == hub_emulator.url and store.location == f"{hub_emulator.url}/alice/from-env"
    sha = store.commit({"x": b"y"}, message="via env")
    assert store.read("x", sha) == b"y"


@pytest.mark.timeout(30)
def test_read_at_sha_is_served_from_cache(make, hub_emulator):
    store = make()
    sha = store.commit({"w.bin": b"weights"}, message="w")
    assert store.read("w.bin", sha) == b"weights"
    before = hub_emulator.stats["requests"]
    assert store.read("w.bin", sha) == b"weights" and store.local_path("w.bin", sha).is_file()
    assert hub_emulator.stats["requests"] == before
    store.read("w.bin")  # at head: resolves the head first
    assert hub_emulator.stats["requests"] > before


@pytest.mark.timeout(30)
def test_history_across_pages(tmp_path):
    with HubEmulator({TEST_TOKEN: "alice"}, commits_page_size=2, tree_page_size=2) as emu:
        store = HubStore("alice/paged", token=TEST_TOKEN, endpoint=emu.url, cache_dir=tmp_path)
        store.create()
        shas = [store.commit({f"f/{i}": b"x"}, message=f"c{i}") for i in range(5)]
        hist = store.history(limit=3)
        assert [c.sha for c in hist] == shas[:1:-1] and hist[2].parents == (shas[1],)
        full = store.history()
        assert [c.sha for c in full[:5]] == shas[::-1] and full[-1].message == "initial commit"
        assert full[-1].parents == () and full[-1].marker is None
        assert store.list_files("f") == [f"f/{i}" for i in range(5)]


# ------------------------------------------------------------------------------------------- chaos


@pytest.mark.timeout(60)
def test_chaos_60_commits_4_threads_no_loss_no_duplicate(hub_emulator, tmp_path):
    """10 % faults of every kind (plus two forced lost answers) on the commit endpoint, 409s from real overlap."""
    hub_emulator.set_faults(rate=0.1, seed=7, ratelimit_reset_s=1, timeout_s=0.02)
    hub_emulator.fail_next("lost-500")
    hub_emulator.fail_next("lost-reset")
    hub_emulator.set_latency(0.003)
    store = HubStore("alice/chaos", token=TEST_TOKEN, endpoint=hub_emulator.url, cache_dir=tmp_path,
                     sleep=lambda s: time.sleep(min(s, 0.01)), max_retries=40)
    store.create()
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            for j in range(15):
                store.commit({f"chaos/{t}/{j:02d}.txt": f"{t}.{j}".encode()}, message=f"chaos {t}.{j}")
        except BaseException as e:  # asserted below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(50)
    hub_emulator.set_faults(rate=0.0)
    assert not errors, errors
    expected = sorted(f"chaos/{t}/{j:02d}.txt" for t in range(4) for j in range(15))
    assert store.list_files("chaos") == expected
    messages = [c.message for c in store.history() if c.message.startswith("chaos ")]
    assert len(messages) == 60 and len(set(messages)) == 60
    stats = hub_emulator.stats
    assert stats["commits_applied"] == 60 and stats["faults"]["lost"] >= 2 and sum(stats["faults"].values()) >= 5


def test_the_emulators_hourly_commit_quota_is_the_hubs_429_and_rolls(make, hub_emulator):
    """Past ``set_commit_quota`` commits in a rolling hour the emulator answers the Hub's 429 for commits; the store
    maps it to ``RateLimited`` (nothing applied) and commits again once the oldest commit left the hour."""
    from hubgrpo.errors import RateLimited
    from tests.support.hub_emulator_api import QUOTA_MESSAGE

    now = [1000.0]
    hub_emulator.set_commit_quota(2, clock=lambda: now[0])
    store = make(max_retries=0)
    for i in range(2):
        store.commit({f"f{i}.txt": b"x"}, message=f"c{i}")
        now[0] += 60
    head = store.head()
    with pytest.raises(RateLimited, match="hourly quotas for action: commit"):
        store.commit({"f2.txt": b"x"}, message="over the quota")
    assert store.head() == head and hub_emulator.stats["quota_429"] == 1 and "hourly" in QUOTA_MESSAGE
    now[0] += 3600 - 120 + 1  # the first commit is now older than an hour
    store.commit({"f2.txt": b"x"}, message="room again")
    assert store.head() != head
