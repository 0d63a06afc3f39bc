"""An anonymous visitor against a served Space (issue 35): the Space app on 127.0.0.1 over a run repo on the Hub
emulator (auth on: alice owns the run, bob is in the allowed org), attacked with raw HTTP (``tests/support/visitor_attacks.py``).

What the Space must do, case by case:

- a body declared larger than what may come before authentication (64 KiB) is refused on its headers (413, no
  body byte read), on every plain route and every Gradio route that takes a body;
- an undeclared (chunked) body is cut at the limit (413) on those routes too;
- an authenticated upload may be as large as a round of this run can be (the global adapter + the rollouts
  limit), not ``merge.max_submission_mb``;
- slow bodies (anonymous, or a user's own) are cut by a read deadline (408) and never hold another user's upload;
- tokens that cannot be Hugging Face tokens cost no lookup; a flood of well-formed bogus tokens costs a bounded
  number of ``whoami`` calls (counted at the emulator); one unknown token asked many times at once costs one;
- the plain routes take only ``application/json`` bodies (415 otherwise, so a cookie can never carry a cross-site
  call); ``verdict`` checks the lease's signature;
- the server's memory stays within 64 MiB of its idle size whatever a visitor sends (a ``hubgrpo space``
  subprocess; ``benchmarks/load/anonymous_memory.py`` measures the full-size attacks).

Each case also checks that a real user's upload still goes through.
"""

from __future__ import annotations

import secrets
import string
import threading
import time
from types import SimpleNamespace

import pytest

from hubgrpo.space.app import serve_space
from hubgrpo.space.auth import make_auth
from tests.support import visitor_attacks as va
from tests.support.space_support import ALICE, BOB, SimWorker, make_run, new_coordinator, start_emulator

ENDPOINTS = ["lease", "heartbeat", "release", "submit", "verdict", "status", "record_eval", "record_verdict",
             "round_files", "upload"]
PLAIN = [f"/hubgrpo/api/{n}" for n in ENDPOINTS]
GRADIO = ([f"/gradio_api/run/{n}" for n in ENDPOINTS] + [f"/gradio_api/call/{n}" for n in ENDPOINTS]
          + ["/gradio_api/queue/join", "/gradio_api/upload"])
PRE_AUTH = 64 << 10


def start(tmp_path, name: str) -> SimpleNamespace:
    emu = start_emulator()
    store = make_run(emu, tmp_path, name, **{"rounds.versions": 1000})
    coord = new_coordinator(store, tmp_path)
    app, url = serve_space(coord, auth=make_auth(coord), batch_wait_s=0.1, tick_interval=0.2)
    return SimpleNamespace(emu=emu, store=store, coord=coord, app=app, url=url, tmp=tmp_path,
                           whoami=va.count_whoami(emu))


def stop(space: SimpleNamespace) -> None:
    space.app.hubgrpo_uploads.close()
    space.app.close(verbose=False)
    space.emu.stop()


@pytest.fixture(scope="module")
def space(tmp_path_factory):
    """One Space for the cases that leave no state behind (the flood cases get their own)."""
    s = start(tmp_path_factory.mktemp("visitor"), "visitor")
    yield s
    stop(s)


@pytest.fixture
def fresh(tmp_path):
    s = start(tmp_path, "flood")
    yield s
    stop(s)


def real_upload(space: SimpleNamespace, worker: str = "alice-box", token: str = ALICE) -> dict:
    """A real round uploaded through the Space by a user of the run; the coordinator's answer."""
    w = SimWorker(space.url, f"{worker}-{time.monotonic_ns() % 10**6}", token, space.tmp, reader=space.store)
    try:
        return w.finish(w.lease(), reward=0.3)
    finally:
        w.close()


def refused(o: va.Outcome, status: int, code: str, *words: str) -> None:
    assert o.status == status, (o.status, o.message, o.error)
    assert o.body and o.body.get("ok") is False and o.code == code, o.body
    text = o.message.lower()
    assert all(w.lower() in text for w in words), (words, o.message)


# ------------------------------------------------------------------------------------------------ bodies


@pytest.mark.timeout(180)
def test_bodies_declared_too_large_are_refused_on_their_headers_on_every_route(space):
    """27 cases: 8 plain routes, 8 × Gradio's /run and /call, /queue/join, Gradio's file /upload, and a user's
    oversized body on a route that carries no upload."""
    before = space.whoami[0]
    for path in PLAIN + GRADIO:
        o = va.send(space.url, path, size=400 * va.MiB, body=False, early_wait_s=2.0)
        refused(o, 413, "protocol", "larger than", f"{PRE_AUTH:,}", "authorization")
        assert o.sent == 0
    with_token = va.send(space.url, "/gradio_api/run/lease", size=400 * va.MiB, body=False, early_wait_s=2.0,
                         headers={"Authorization": f"Bearer {ALICE}"})  # a user's body on a route without uploads
    refused(with_token, 413, "protocol", "larger than")
    assert space.whoami[0] - before <= 1  # alice's token: one lookup, then cached
    assert real_upload(space)["status"] == "admitted"


@pytest.mark.timeout(180)
def test_undeclared_bodies_are_cut_at_the_limit(space):
    """Chunked bodies of 24 MiB, no Content-Length, on the routes that take the largest ones."""
    size = 24 * va.MiB
    files = {"prefix": va.FILE_PREFIX, "suffix": va.FILE_SUFFIX, "content_type": va.MULTIPART}
    upload = {"prefix": va.UPLOAD_PREFIX, "suffix": va.UPLOAD_SUFFIX}
    for path, kw in [("/hubgrpo/api/status", upload), ("/gradio_api/run/upload", upload),
                     ("/gradio_api/upload", files)]:
        o = va.send(space.url, path, size=size, declared=False, **kw)
        refused(o, 413, "protocol", "larger than", f"{PRE_AUTH:,}")
        assert o.sent < size, path
    for path in ["/gradio_api/call/upload", "/gradio_api/queue/join"]:  # Gradio's queued routes: users only
        o = va.send(space.url, path, size=size, declared=False, **upload)
        refused(o, 401, "auth", "for the run's users")
        assert o.sent < size, path
    for path in ["/hubgrpo/api/upload", "/hubgrpo/api/lease"]:  # a mutating plain route asks for a token first
        o = va.send(space.url, path, size=size, declared=False, prefix=va.UPLOAD_PREFIX, suffix=va.UPLOAD_SUFFIX)
        refused(o, 401, "auth", "no token")
        assert o.sent < size, path
    assert real_upload(space)["status"] == "admitted"


@pytest.mark.timeout(120)
def test_an_authenticated_upload_is_limited_by_what_a_round_of_this_run_can_weigh(space):
    limit = space.app.hubgrpo_body_limits["upload"]
    assert 1 << 20 < limit < 16 << 20  # this run's tiny adapter + rollouts, base64: megabytes, not 512 MB
    alice = {"Authorization": f"Bearer {ALICE}"}
    for path in ["/hubgrpo/api/upload", "/gradio_api/run/upload", "/gradio_api/queue/join"]:
        o = va.send(space.url, path, size=limit + 1, body=False, headers=alice, early_wait_s=2.0)
        refused(o, 413, "protocol", "larger than", f"{limit:,}")
    o = va.send(space.url, "/hubgrpo/api/upload", size=limit + va.MiB, declared=False, headers=alice,
                prefix=va.UPLOAD_PREFIX, suffix=va.UPLOAD_SUFFIX)
    refused(o, 413, "protocol", "larger than")
    assert real_upload(space)["status"] == "admitted"


@pytest.mark.timeout(120)
def test_slow_bodies_are_cut_and_never_hold_a_users_upload(space):
    """Anonymous bodies on Gradio's /run routes and a status on the plain route, and one upload of bob's, each sending
    100 bytes a second: alice uploads meanwhile, and the slow ones are answered 408 by the read deadline. An
    anonymous upload on the plain route is refused at once (no token), before its body."""
    def slow(path: str, headers=None):
        return lambda: va.send(space.url, path, size=60_000, rate_bps=100, timeout_s=60, prefix=va.UPLOAD_PREFIX,
                               suffix=va.UPLOAD_SUFFIX, headers=headers)

    paths = ["/gradio_api/run/upload", "/gradio_api/run/upload", "/gradio_api/run/lease",
             "/gradio_api/run/heartbeat", "/gradio_api/run/status", "/hubgrpo/api/status"]
    calls = [slow(p) for p in paths] + [slow("/hubgrpo/api/upload", {"Authorization": f"Bearer {BOB}"}),
                                        slow("/hubgrpo/api/upload")]
    outcomes: list = []
    t = threading.Thread(target=lambda: outcomes.extend(va.concurrently(calls)), daemon=True)
    t.start()
    time.sleep(1.5)
    t0 = time.monotonic()
    assert real_upload(space)["status"] == "admitted"
    took = time.monotonic() - t0
    assert took < 10 and t.is_alive(), took  # alice was not held by the slow bodies, which are still sending
    t.join(60)
    assert len(outcomes) == len(calls)
    for o in outcomes[:-1]:
        refused(o, 408, "protocol", "too slow")
        assert o.seconds < 30 and o.sent < 60_000
    refused(outcomes[-1], 401, "auth", "no token")
    assert outcomes[-1].sent < 1000


# ------------------------------------------------------------------------------------------------ tokens


def bogus() -> str:
    return "hf_" + "".join(secrets.choice(string.ascii_letters) for _ in range(34))


def lease_with(url: str, token: str) -> va.Outcome:
    from hubgrpo.layout import PROTOCOL_VERSION

    body = b'{"data": ["w", null, null, %d]}' % PROTOCOL_VERSION
    return va.send(url, "/hubgrpo/api/lease", size=len(body), prefix=body, suffix=b"",
                   headers={"Authorization": f"Bearer {token}"}, timeout_s=60)


@pytest.mark.timeout(180)
def test_a_flood_of_bogus_tokens_costs_a_bounded_number_of_lookups(fresh):
    from concurrent.futures import ThreadPoolExecutor

    assert lease_with(fresh.url, ALICE).code is None  # alice works before the flood (her token is cached)
    before = fresh.whoami[0]
    with ThreadPoolExecutor(20) as pool:
        answers = list(pool.map(lambda _: lease_with(fresh.url, bogus()), range(200)))
    lookups = fresh.whoami[0] - before
    assert lookups <= 25, lookups  # the per-address limit on lookups, not one per token
    for o in answers:
        assert (o.status, o.code) in ((401, "auth"), (429, "rate")), (o.status, o.message)
    rate = [o for o in answers if o.code == "rate"]
    assert rate and all(0 < o.body["error"]["wait_s"] <= 60 for o in rate)
    assert real_upload(fresh)["status"] == "admitted"  # a known user goes on


@pytest.mark.timeout(120)
def test_strings_that_cannot_be_hub_tokens_cost_no_lookup(fresh):
    before = fresh.whoami[0]
    for token in ["x", "hf_", "hf_x", "hf_" + "a" * 5000, "hf_abc-def!ghij", "hf_ab cd ef gh", "api_" + "a" * 34,
                  "hf_" + "é" * 34, "Bearer hf_" + "a" * 34]:
        o = va.send(fresh.url, "/hubgrpo/api/lease", size=30, prefix=b'{"data": ["w", null, null, 2]}',
                    suffix=b"", headers={"Authorization": f"Bearer {token}"})
        refused(o, 401, "auth", "not a hugging face token")
    assert fresh.whoami[0] == before


@pytest.mark.timeout(120)
def test_one_unknown_token_asked_at_once_costs_one_lookup(fresh):
    slow = va.count_whoami(fresh.emu, delay_s=0.5)  # each lookup answered 0.5 s late: all 30 ask meanwhile
    token = bogus()
    answers = va.concurrently([lambda: lease_with(fresh.url, token)] * 30)
    assert slow[0] == 1, slow[0]
    assert all((o.status, o.code) == (401, "auth") for o in answers), {(o.status, o.code) for o in answers}


# ------------------------------------------------------------------------------------------------ routes


@pytest.mark.timeout(120)
def test_plain_routes_take_only_json_bodies(space):
    body = b'{"data": ["w", null, null, 2]}'
    for path in PLAIN:
        for ctype in ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None]:
            o = va.send(space.url, path, size=len(body), prefix=body, suffix=b"", content_type=ctype,
                        headers={"Authorization": f"Bearer {ALICE}"})
            refused(o, 415, "protocol", "application/json")
    ok = va.send(space.url, "/hubgrpo/api/status", size=12, prefix=b'{"data": []}', suffix=b"",
                 content_type="application/json; charset=utf-8")
    assert ok.status == 200 and ok.body["ok"] is True


@pytest.mark.timeout(120)
def test_verdict_refuses_a_forged_lease(space):
    import httpx

    alice = SimWorker(space.url, "alice-verdict", ALICE, space.tmp)
    try:
        lease = alice.lease()
    finally:
        alice.close()

    def verdict(lease_dict: dict) -> dict:
        r = httpx.post(f"{space.url}/hubgrpo/api/verdict", json={"data": [lease_dict, None]}, timeout=20,
                       headers={"Authorization": f"Bearer {ALICE}"})
        return r.json()

    for forged in (lease.model_copy(update={"lease_id": "someone-elses-round"}),
                   lease.model_copy(update={"steps": lease.steps + 1})):
        answer = verdict(forged.model_dump(mode="json"))
        assert answer["ok"] is False and answer["error"]["error"] == "LeaseError", answer
        assert "signature" in answer["error"]["message"], answer
    genuine = verdict(lease.model_dump(mode="json"))
    assert genuine["ok"] and genuine["result"]["status"] == "unknown"  # no round submitted for it yet


# ------------------------------------------------------------------------------------------------ memory


@pytest.mark.timeout(300)
def test_the_spaces_memory_stays_within_64_mib_of_idle_whatever_a_visitor_sends(tmp_path):
    """A ``hubgrpo space`` subprocess; a tenth of the issue's body sizes (60 MiB on the upload route, 40 MiB on
    Gradio's), six at once, and a bogus-token flood. ``benchmarks/load/anonymous_memory.py`` runs the full sizes."""
    import os
    import socket

    from tests.support.space_support import ALICE as OWNER

    emu = start_emulator()
    proc = None
    try:
        make_run(emu, tmp_path, "memory", **{"rounds.versions": 1000})
        env = dict(os.environ, HF_ENDPOINT=emu.url, HF_TOKEN=OWNER, HUBGRPO_SECRET="memory-test-secret",
                   OMP_NUM_THREADS="1")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        proc = va.start_space("alice/memory", port, env, tmp_path / "space.log", extra=("--quiet",))
        url = f"http://127.0.0.1:{port}"
        assert lease_with(url, OWNER).code is None
        time.sleep(2.0)
        baseline = va.rss_kib(proc.pid)
        with va.PeakSampler(proc.pid) as sampler:
            outcomes = [va.send(url, **kw) for _, kw in va.big_bodies(0.1)]
            outcomes += va.concurrently([lambda kw=kw: va.send(url, **kw) for _, kw in va.concurrent_bodies(0.1)])
            outcomes += va.concurrently([lambda: lease_with(url, bogus()) for _ in range(100)])
            time.sleep(0.5)
        grew_mib = (sampler.peak - baseline) / 1024
        assert grew_mib <= 64, f"the Space grew by {grew_mib:.0f} MiB over its idle {baseline / 1024:.0f} MiB"
        assert all(o.status in (401, 413, 429) for o in outcomes), sorted({o.status for o in outcomes}, key=str)
    finally:
        if proc is not None:
            va.stop(proc)
        emu.stop()
