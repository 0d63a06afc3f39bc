"""A hostile coordinator against a real worker (the mirror of ``test_adversarial``'s hostile participant).

A coordinator is just a URL a participant was given: everything it answers is untrusted. The hostile server
(``tests/support/hostile_coordinator.py``, real HTTP on 127.0.0.1) sends path-shaped and over-long shas and names,
redirects, huge and slow answers, junk errors, non-numeric and huge waits, and leases naming files outside the
run; the worker is the installed ``hubgrpo worker`` command (a subprocess, for the path and redirect cases) or the
``Worker`` loop and ``CoordinatorClient`` in process, always over real HTTP. Each case states what the worker must
do (refuse, cap, time out: with the named error), checks that nothing outside its cache is touched, and that its
token goes nowhere but to the coordinator it was given, and only in the Authorization header.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest

from hubgrpo import layout, runrepo
from hubgrpo.coordinator.repo_init import init_repo
from hubgrpo.errors import MAX_WAIT_S, CoordinatorError, HubGrpoError, InvalidPath, Refused
from hubgrpo.layout import Lease
from hubgrpo.store.local import LocalStore
from hubgrpo.worker.client import CoordinatorClient
from hubgrpo.worker.loop import Worker
from tests.support.coord_helpers import make_config, write_adapter
from tests.support.hostile_coordinator import (SHA, TOKEN, HostileCoordinator, Recorder, answer, gradio_config, huge,
                                               lease_dict, redirect, refusal, refuse, sequence, trickle,
                                               token_stayed_home)

USERS_FOLDERS = ("some_dir", "photos", "thesis", "backups")


@pytest.fixture
def run_repo(tmp_path) -> LocalStore:
    store = LocalStore(tmp_path / "repo")
    init_repo(store, make_config(), write_adapter(tmp_path / "v0", seed=0))
    return store


@pytest.fixture
def victim(tmp_path) -> Path:
    """The user's own folders beside the worker's cache (tmp_path/cache): nothing may touch them."""
    for name in USERS_FOLDERS:
        (tmp_path / "victim" / name).mkdir(parents=True)
        (tmp_path / "victim" / name / "keep.txt").write_text(name)
    return tmp_path / "victim"


def intact(victim: Path) -> bool:
    return sorted(p.name for p in victim.iterdir()) == sorted(USERS_FOLDERS) and all(
        (victim / n / "keep.txt").read_text() == n for n in USERS_FOLDERS)


class NoEngine:
    """A hostile lease must never reach training."""

    def run_round(self, *args, **kwargs):
        raise AssertionError("a hostile lease reached training")


def worker(store, url: str, tmp_path: Path, *, sleeps: list | None = None, **client_kw) -> Worker:
    client = CoordinatorClient(url, token=TOKEN, **{"retries": 0, "timeout": 5, **client_kw})
    return Worker(store, client, name="w1", engine=NoEngine(), workdir=tmp_path / "cache" / "worker" / "w1",
                  sleep=(sleeps.append if sleeps is not None else time.sleep), progress=False, max_rounds=1)


def worker_process(store: LocalStore, url: str, cache: Path, timeout: float = 60) -> tuple[int | None, str]:
    """``hubgrpo worker`` (the installed command) against ``url``: (exit code or None if it had to be killed,
    its output)."""
    exe = Path(sys.executable).with_name("hubgrpo")
    env = dict(os.environ, HF_TOKEN=TOKEN, HUBGRPO_CACHE=str(cache), OMP_NUM_THREADS="1")
    env.pop("HUBGRPO_PARENT_PID", None)
    proc = subprocess.Popen([str(exe), "worker", "--repo", str(store.root), "--coordinator", url, "--name", "w1",
                             "--max-rounds", "1", "--quiet"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return None, proc.communicate()[0]


# ------------------------------------------------------------------------------------------------ paths


@pytest.mark.timeout(120)
def test_a_path_shaped_base_sha_is_refused_by_the_worker_and_the_users_folders_survive(tmp_path, run_repo, victim):
    """Defect 1: `base_sha` `../…/some_dir` made `adapter_at` take the user's folder for a cached adapter and
    `prune_revisions` delete its siblings. The worker stops with `bad_lease`, naming the field."""
    cache = tmp_path / "cache"
    key = "".join(c if c.isalnum() else "_" for c in run_repo.location)[-80:]
    sha = "../../../../../victim/some_dir"  # from <cache>/worker/<name>/adapters/<repo key>/
    (cache / "worker" / "w1" / "adapters" / key / run_repo.head()).mkdir(parents=True)  # an earlier round's
    assert (cache / "worker" / "w1" / "adapters" / key / sha).resolve(strict=True) == victim / "some_dir"  # real
    with HostileCoordinator(lease=answer(lease_dict(base_sha=sha)), **{"*": answer(None)}) as coord:
        code, out = worker_process(run_repo, coord.url, cache)
    assert intact(victim)
    assert code == 1, out[-3000:]
    assert "base_sha" in out and "not a commit id" in out and "Traceback" not in out, out[-3000:]
    assert [r.path for r in coord.requests][:1] == ["/hubgrpo/api/lease"]
    token_stayed_home(coord)


BAD_LEASES = {
    "base_sha-path": {"base_sha": "../../x/some_dir"},
    "base_sha-absolute": {"base_sha": "/etc"},
    "base_sha-upper-hex": {"base_sha": "AB" * 20},
    "base_sha-41-hex": {"base_sha": "a" * 41},
    "base_sha-over-long": {"base_sha": "a" * 200},
    "base_sha-branch": {"base_sha": "main"},
    "base_sha-empty": {"base_sha": ""},
    "lease_id-path": {"lease_id": "../../x"},
    "lease_id-slash": {"lease_id": "x/y"},
    "lease_id-over-long": {"lease_id": "a" * 65},
    "worker-path": {"worker": "../w1"},
    "run_id-path": {"run_id": "../../run"},
    "worker-another-workers-name": {"worker": "w1-L"},  # rounds/w1-L-L000001 is also worker w1's lease L-L000001
    "uploads-outside-the-run": {"uploads": {"../../outside": "https://bucket.example/x"}},
    "uploads-file-url": {"uploads": {name: "file:///etc/passwd" for name in layout.SUBMISSION_FILES}},
    # sizes past the run's own config (hubgrpo.worker.lease_bounds): generate for ever, fill the memory
    "params-not-a-lease-param": {"params": {"max_completion_length": 10**9}},
    "params-learning-rate-above-the-run's": {"params": {"learning_rate": 10.0}},
    "params-batch-above-the-run's": {"params": {"per_device_train_batch_size": 10**6}},
    "steps-past-balance-rounds": {"steps": 1_000_000},
    "prompt_indices-past-the-steps": {"prompt_indices": list(range(100_000))},
}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("fields", BAD_LEASES.values(), ids=BAD_LEASES.keys())
def test_a_lease_with_path_shaped_or_over_long_names_stops_the_worker(tmp_path, run_repo, victim, fields):
    """Every lease field that becomes a path or a revision on the worker is checked before anything is written."""
    def outside() -> list[str]:  # everything but the worker's cache and the run repo
        return sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")
                      if not {"cache", "repo"} & set(p.relative_to(tmp_path).parts))

    before = outside()
    with HostileCoordinator(lease=answer(lease_dict(**fields)), **{"*": answer(None)}) as coord:
        with pytest.raises(CoordinatorError) as e:
            worker(run_repo, coord.url, tmp_path).run()
    assert e.value.code == "bad_lease" and next(iter(fields)) in e.value.message, e.value
    assert intact(victim)
    assert outside() == before
    token_stayed_home(coord)


RENEWED_AS_ANOTHER = {"lease_id": "L000002", "base_sha": "b" * 40, "base_version": 3, "worker": "w2",
                      "prompt_indices": [7, 8], "params": {"learning_rate": 1e-9}}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("field", RENEWED_AS_ANOTHER, ids=RENEWED_AS_ANOTHER.keys())
def test_a_heartbeat_that_answers_another_round_is_refused_and_the_old_lease_kept(tmp_path, field):
    """A renewal may move the deadline and re-sign (and re-issue upload URLs), nothing else: a new id or version
    would leave the worker's bookkeeping (the adapter it keeps from pruning, the round's folder) on the old one."""
    wire = lease_dict()
    lease, later = Lease.model_validate(wire), wire["deadline"] + 900
    renewed = dict(wire, deadline=later, signature="1" * 64, uploads={})
    hostile = sequence(answer(renewed), answer(dict(renewed, **{field: RENEWED_AS_ANOTHER[field]})))
    with HostileCoordinator(heartbeat=hostile, **{"*": answer(None)}) as coord:
        client = CoordinatorClient(coord.url, token=TOKEN, retries=0, timeout=5)
        assert client.heartbeat(lease).deadline == later  # an honest renewal goes through
        with pytest.raises(CoordinatorError) as e:
            client.heartbeat(lease)
    assert e.value.code == "bad_lease" and field in e.value.message and "L000001" in e.value.message, e.value
    token_stayed_home(coord)


@pytest.mark.timeout(30)
def test_a_path_shaped_version_sha_in_the_status_is_never_a_rebase_source(tmp_path, run_repo, victim):
    """Defect 1, the rebase path: `status()["version_sha"]` reached `adapter_at` the same way (now the status's
    `version_id` names the adapter to download). The round stays where it is; nothing outside the cache is read or
    deleted."""
    from hubgrpo.worker.rebase import CoordinatorSource

    cache = tmp_path / "cache" / "adapters"
    key = "".join(c if c.isalnum() else "_" for c in run_repo.location)[-80:]
    sha = "../../../victim/some_dir"
    (cache / key / run_repo.head()).mkdir(parents=True)  # the adapter of an earlier round
    assert (cache / key / sha).resolve(strict=True) == victim / "some_dir"
    with HostileCoordinator(status=answer({"version": 3, "version_id": sha})) as coord:
        client = CoordinatorClient(coord.url, token=TOKEN, retries=0, timeout=5)
        assert CoordinatorSource(client, cache, 1 << 20, poll_s=0)(1, 0) is None
        coord.on("status", answer({"version": 10**30, "version_id": run_repo.head()}))
        assert CoordinatorSource(client, cache, 1 << 20, poll_s=0)(1, 0) is None
    assert intact(victim)
    token_stayed_home(coord)


def test_the_worker_never_deletes_outside_its_cache(tmp_path, run_repo, victim):
    """`adapter_at` and `fetch_dir` take only commit ids; `prune_revisions` and `remove_tree` delete only inside the
    root they are given, and never through a symlink."""
    cache = tmp_path / "cache"
    for bad in ("../../victim/some_dir", "v1", "main", "A" * 40):
        with pytest.raises(InvalidPath, match="not a commit id"):
            runrepo.adapter_at(run_repo, bad, cache)
        with pytest.raises(InvalidPath, match="not a commit id"):
            runrepo.fetch_dir(run_repo, {}, bad, cache / "x")
    with pytest.raises(InvalidPath, match="outside"):
        runrepo.prune_revisions(victim, keep=1, root=cache)
    revisions = cache / "adapters" / "key"
    for name in ("a" * 40, "b" * 40, "c" * 40):
        (revisions / name).mkdir(parents=True)
    (revisions / ("d" * 40)).symlink_to(victim / "photos", target_is_directory=True)
    runrepo.prune_revisions(revisions, keep=1, root=cache)
    assert len([p for p in revisions.iterdir() if not p.is_symlink()]) == 1  # a symlink is never followed
    with pytest.raises(InvalidPath, match="outside"):
        runrepo.remove_tree(victim / "thesis", root=cache)
    (cache / "link").symlink_to(victim / "backups", target_is_directory=True)
    with pytest.raises(InvalidPath, match="symlink"):
        runrepo.remove_tree(cache / "link", root=cache)
    assert intact(victim)


# ------------------------------------------------------------------------------------------------ the token


@pytest.mark.timeout(30)
def test_the_token_travels_only_in_the_authorization_header(tmp_path):
    """Defect 2: the client put the token in every call's JSON body (which a 307 re-sends anywhere)."""
    lease = lease_dict()
    with HostileCoordinator(lease=answer(lease), heartbeat=answer(lease), release=answer(None),
                            submit=answer({"status": "admitted"}), status=answer({"version": 0}),
                            record_eval=answer({"status": "recorded"})) as coord:
        c = CoordinatorClient(coord.url, token=TOKEN, retries=0, timeout=5)
        got = c.lease("w1")
        c.heartbeat(got)
        c.submit(got, SHA)
        c.status()
        c.record_eval(0, 0.5, 4)
        c.release(got)
    assert len(coord.requests) == 6
    assert all(r.headers.get("authorization") == f"Bearer {TOKEN}" for r in coord.requests)
    token_stayed_home(coord)


@pytest.mark.timeout(120)
def test_a_redirect_to_http_elsewhere_stops_the_installed_worker_and_the_token_never_leaves(tmp_path, run_repo):
    """Defect 2: a 307 from the coordinator to another origin re-sent the call, token included. The installed
    worker stops at once with `redirect`, naming the status and the target's origin; the target hears nothing.
    (0.0.0.0 reaches this machine, but the worker counts it as another, non-loopback host.)"""
    with Recorder() as target, \
            HostileCoordinator(**{"*": redirect(307, f"http://0.0.0.0:{target.port}/hubgrpo/api/lease")}) as coord:
        code, out = worker_process(run_repo, coord.url, tmp_path / "cache", timeout=40)
    assert code == 1, out[-3000:]
    assert "HTTP 307" in out and f"http://0.0.0.0:{target.port}" in out and "Traceback" not in out, out[-3000:]
    assert len(coord.requests) == 1
    token_stayed_home(coord, target)


REDIRECTS = {"302-to-another-loopback-origin": (302, "http://127.0.0.1:{port}/hubgrpo/api/lease"),
             "308-to-https-elsewhere": (308, "https://0.0.0.0:{port}/hubgrpo/api/lease"),
             "301-relative": (301, "/elsewhere/lease")}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("status,location", REDIRECTS.values(), ids=REDIRECTS.keys())
def test_no_redirect_is_ever_followed(tmp_path, run_repo, status, location):
    """Not to another origin, not to https, not even to the same origin: the worker stops with `redirect`."""
    with Recorder() as target, HostileCoordinator(**{"*": redirect(status, location.format(port=target.port))}) \
            as coord:
        with pytest.raises(CoordinatorError) as e:
            worker(run_repo, coord.url, tmp_path).run()
    assert e.value.code == "redirect" and f"HTTP {status}" in e.value.message, e.value
    assert len(coord.requests) == 1
    token_stayed_home(coord, target)


@pytest.mark.timeout(30)
def test_gradio_transport_sends_the_token_only_to_the_coordinators_origin(tmp_path):
    """gradio_client builds every later URL from the app's own `/config` (`api_prefix`): a hostile app could point
    them, token header included, at any host. The token goes only to the origin the worker was given."""
    with Recorder() as target, HostileCoordinator(config=gradio_config(f"http://0.0.0.0:{target.port}/")) as coord:
        c = CoordinatorClient(coord.url, token=TOKEN, transport="gradio", retries=0, timeout=5)
        with pytest.raises(CoordinatorError) as e:
            c.lease("w1")
        c.close()
    assert e.value.code == "redirect" and "0.0.0.0" in e.value.message, e.value
    token_stayed_home(coord, target)


# ------------------------------------------------------------------------------------------------ answers


HUGE = {"lease-declared": ("lease", True), "lease-chunked": ("lease", False), "status-chunked": ("status", False)}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("endpoint,declared", HUGE.values(), ids=HUGE.keys())
def test_a_huge_answer_is_cut_off_and_memory_stays_bounded(tmp_path, run_repo, endpoint, declared):
    """A 200 MiB answer: the client stops reading past its cap (`too_large`, naming the cap) and the worker stops."""
    with HostileCoordinator(**{endpoint: huge(200 << 20, declared=declared), "*": answer(None)}) as coord:
        w = worker(run_repo, coord.url, tmp_path)
        tracemalloc.start()
        try:
            with pytest.raises(CoordinatorError) as e:
                w.run() if endpoint == "lease" else w.client.status()
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert e.value.code == "too_large" and "MiB" in e.value.message, e.value
    assert peak < 48 << 20, f"peak {peak / 2**20:.0f} MiB while refusing a 200 MiB answer"
    token_stayed_home(coord)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("headers_too", [False, True], ids=["body", "headers"])
def test_a_trickling_answer_times_out_as_a_whole(tmp_path, headers_too):
    """httpx's timeout bounds each read; a coordinator sending a byte every 0.2 s never trips it. Each attempt has
    an overall deadline: the call gives up (`unreachable`) soon after `timeout`."""
    with HostileCoordinator(lease=trickle(interval=0.2, for_s=20, headers_too=headers_too)) as coord:
        c = CoordinatorClient(coord.url, token=TOKEN, retries=0, timeout=2)
        t0 = time.monotonic()
        with pytest.raises(CoordinatorError) as e:
            c.lease("w1")
        took = time.monotonic() - t0
    assert e.value.code == "unreachable" and took < 6, (e.value, took)
    token_stayed_home(coord)


WAITS = [refusal("budget", wait_s="soon"), refusal("budget", wait_s=1e12), refusal("budget", wait_s=-5),
         refusal("budget", wait_s=math.inf), refusal("budget", wait_s=math.nan), refusal("budget", wait_s=[1]),
         refusal("rate", hint="wait_s=1e12"), refusal("rate", hint="wait_s=nan"), refusal("rate", hint="wait_s=-1"),
         refusal("rate_limited", wait_s="abc", error="RateLimited"),
         refusal("rate_limited", wait_s=1e300, error="RateLimited")]


@pytest.mark.timeout(30)
def test_non_numeric_and_huge_waits_are_capped_wherever_the_worker_sleeps(tmp_path, run_repo):
    """Defect 15: a hint `wait_s=1e12` made a worker sleep for ever; a non-numeric `wait_s` was a ValueError
    traceback. Every wait a coordinator suggests is a finite number in [0, MAX_WAIT_S], whatever it sent."""
    sleeps: list[float] = []
    lease = lease_dict()
    leases = sequence(*[refuse(w) for w in WAITS], refuse(refusal("finished")))
    submits = sequence(refuse(refusal("rate_limited", wait_s=1e12, error="RateLimited")),
                       refuse(refusal("rate", wait_s="x")), answer({"status": "checking", "wait_s": 1e12}))
    with HostileCoordinator(lease=leases, submit=submits, verdict=answer({"status": "admitted"})) as coord:
        w = worker(run_repo, coord.url, tmp_path, sleeps=sleeps, poll_sleep=sleeps.append)
        assert w.run() == []  # every refusal waited out, then "finished"
        assert w._submit(Lease.model_validate(lease), SHA)["status"] == "admitted"
    assert len(sleeps) == len(WAITS) + 3, sleeps
    assert all(math.isfinite(s) and 0 <= s <= MAX_WAIT_S for s in sleeps), sleeps
    token_stayed_home(coord)


JUNK_ERRORS = {"a-string": "junk", "a-list": ["junk"], "unhashable-class": {"error": ["Refused"]},
               "unknown-class": {"error": "SystemExit", "message": "bye"},
               "huge-message": {"error": "Refused", "code": "x" * 10_000, "message": "m" * 1_000_000,
                                "hint": "h" * 1_000_000},
               "wrong-types": {"error": "LeaseError", "message": 5, "hint": {"a": 1}, "code": ["c"]},
               "terminal-escapes": {"error": "Refused", "code": "rate", "message": "\x1b[2J\x1b[31mall fine\r"},
               "non-numeric-wait": {"error": "RateLimited", "message": "slow down", "wait_s": "soon"}}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("error", JUNK_ERRORS.values(), ids=JUNK_ERRORS.keys())
def test_a_junk_error_becomes_a_bounded_typed_error(error):
    """Defect 15: `errors.from_dict` raised on hostile input. Whatever the error object, the worker gets a
    HubGrpoError with a bounded message and hint, no control characters, and a finite wait."""
    with HostileCoordinator(lease=refuse(error)) as coord:
        with pytest.raises(HubGrpoError) as e:
            CoordinatorClient(coord.url, token=TOKEN, retries=0, timeout=5).lease("w1")
    err = e.value
    assert len(err.message) <= 2000 and len(err.hint or "") <= 2000 and len(err.code) <= 64, err
    assert not any(ord(ch) < 32 and ch != "\n" for ch in str(err)), repr(str(err))
    wait = err.wait_s if err.wait_s is not None else 0.0
    assert math.isfinite(wait) and 0 <= wait <= MAX_WAIT_S


# ------------------------------------------------------------------------------------------------ uploads


@pytest.mark.timeout(60)
def test_upload_urls_get_no_token_no_redirect_and_a_bounded_answer(tmp_path, monkeypatch):
    """Presigned upload URLs (lease.uploads) come from the coordinator: the PUT carries no Authorization header, a
    redirect is not followed, and an answer of 200 MiB is not read into memory."""
    from hubgrpo.errors import StoreError
    from hubgrpo.worker.delivery import deliver

    monkeypatch.setenv("HF_TOKEN", TOKEN)
    folder = tmp_path / "round"
    folder.mkdir()
    for name in layout.SUBMISSION_FILES:
        (folder / name).write_bytes(b"x" * 100)
    with Recorder() as target, HostileCoordinator(**{"*": redirect(307, f"{target.url}/stolen")}) as bucket:
        lease = Lease.model_validate(lease_dict(uploads={n: f"{bucket.url}/inbox/{n}" for n in layout.SUBMISSION_FILES}))
        with pytest.raises(StoreError, match="307"):
            deliver("s3://inbox", lease, folder, sleep=lambda s: None)
        bucket.on("*", huge(200 << 20, declared=False, status=400))
        tracemalloc.start()
        try:
            with pytest.raises(StoreError):
                deliver("s3://inbox", lease, folder, sleep=lambda s: None)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert peak < 48 << 20, f"peak {peak / 2**20:.0f} MiB"
    assert bucket.requests and not any(r.carries(TOKEN) or "authorization" in r.headers for r in bucket.requests)
    assert target.requests == []


# ------------------------------------------------------------------------------------------------ evaluator


@pytest.mark.timeout(30)
def test_the_evaluator_survives_a_junk_status(tmp_path, run_repo):
    """An evaluator asks the coordinator which versions to score: junk versions are skipped, not a traceback."""
    from hubgrpo.worker.evaluator import Evaluator

    junk = {"finished": True, "versions": [{"version": "../x"}, "junk", {"version": 10**30}, {"version": None}]}
    with HostileCoordinator(status=answer(junk)) as coord:
        client = CoordinatorClient(coord.url, token=TOKEN, retries=0, timeout=5)
        assert Evaluator(run_repo, client, workdir=tmp_path / "cache" / "eval").run(once=True) == []
    token_stayed_home(coord)


# ------------------------------------------------------------------------------------------------ the repo's config


@pytest.mark.timeout(30)
def test_a_placeholder_planted_in_the_repo_config_is_never_expanded_by_the_worker(tmp_path, run_repo, monkeypatch):
    """Defect 10 from the worker's side: a `${HF_TOKEN}` written into the repo's hubgrpo.yaml must not become the
    worker's token (the fix is `runrepo.read_config`'s): the worker keeps it literal or refuses the config."""
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    text = run_repo.read(layout.CONFIG_FILE).decode().replace("kwargs: {}", "kwargs: {note: '${HF_TOKEN}'}", 1)
    assert "${HF_TOKEN}" in text
    run_repo.commit({layout.CONFIG_FILE: text.encode()}, message="a planted placeholder")
    with HostileCoordinator(**{"*": answer(None)}) as coord:
        try:
            w = worker(run_repo, coord.url, tmp_path)
        except HubGrpoError as e:  # refused: fine, as long as it says why
            assert "HF_TOKEN" in str(e) and TOKEN not in str(e)
        else:
            assert TOKEN not in w.cfg.model_dump_json()
    assert coord.requests == []


def test_evicting_the_hf_cache_never_deletes_through_a_link_out_of_it(tmp_path, victim):
    """`store.cache.evict` deletes a snapshot entry and the blob it links to: only inside the HF cache, so an entry
    that leads elsewhere (a planted or stale link) costs the user nothing."""
    from types import SimpleNamespace

    from hubgrpo.store.cache import evict

    snapshots = tmp_path / "hf" / "models--alice--run" / "snapshots" / SHA
    blobs = tmp_path / "hf" / "models--alice--run" / "blobs"
    snapshots.mkdir(parents=True)
    blobs.mkdir(parents=True)
    (blobs / "b1").write_bytes(b"adapter")
    (snapshots / layout.ADAPTER_WEIGHTS).symlink_to(blobs / "b1")
    (snapshots / layout.ADAPTER_CONFIG).symlink_to(victim / "thesis" / "keep.txt")
    store = SimpleNamespace(repo_id="alice/run", repo_type="model", cache_dir=str(tmp_path / "hf"))
    assert evict(store, list(layout.ADAPTER_FILES), SHA) == len(b"adapter")
    assert not (blobs / "b1").exists() and intact(victim)


@pytest.mark.timeout(60)
def test_a_remote_run_repo_never_picks_a_folder_of_the_workers_machine_as_its_inbox(tmp_path, hub_emulator):
    """``hub.submissions`` comes from the run repo's config: for a remote run (a Hub repo, a coordinator elsewhere)
    a local folder there is refused before anything is leased or written; on this machine it stays allowed."""
    from hubgrpo.errors import ConfigError
    from hubgrpo.store.hub import HubStore
    from hubgrpo.worker.delivery import check_inbox_is_ours
    from tests.conftest import TEST_TOKEN

    target = tmp_path / "users-folder"
    store = HubStore("alice/boxed", token=TEST_TOKEN, endpoint=hub_emulator.url, cache_dir=tmp_path / "hf")
    init_repo(store, make_config(**{"hub.submissions": str(target)}), write_adapter(tmp_path / "v0", seed=0))
    w = Worker(store, CoordinatorClient("https://coordinator.invalid", retries=0, timeout=1), name="w1",
               engine=NoEngine(), workdir=tmp_path / "cache", progress=False, max_rounds=1)
    with pytest.raises(ConfigError, match="folder of this machine"):
        w.run()
    assert not target.exists()
    check_inbox_is_ours(str(target), store, "http://127.0.0.1:7860")  # coordinator here: a run on this machine
    check_inbox_is_ours(str(target), LocalStore(tmp_path / "repo2"), "https://coordinator.invalid")
    check_inbox_is_ours("s3://bucket/rounds", store, "https://coordinator.invalid")
