"""The plain HTTP routes (``POST /hubgrpo/api/<name>``, ``hubgrpo.space.routes``) and submissions checked in the
background (``hubgrpo.space.admission_queue``): a real app on 127.0.0.1 over a fake coordinator, raw HTTP and the
worker's client."""

from __future__ import annotations

import json
import logging
import threading
import time

import httpx
import pytest

from hubgrpo.coordinator.core import Coordinator
from hubgrpo.coordinator.repo_init import init_repo
from hubgrpo.errors import InvalidSubmission, LeaseError, Refused
from hubgrpo.layout import PROTOCOL_VERSION
from hubgrpo.space.api import serve
from hubgrpo.space.app import serve_space
from hubgrpo.space.auth import make_auth
from hubgrpo.store.local import LocalStore
from hubgrpo.worker.client import CoordinatorClient
from tests.support.coord_helpers import make_config, push_submission, write_adapter
from tests.support.fake_coordinator import FakeCoordinator, RecordingTransport
from tests.support.space_support import ALICE, BOB, MALLORY, make_run, new_coordinator, start_emulator

SHA = "ab" * 20


class SlowChecks(FakeCoordinator):
    """A fake coordinator whose submissions take ``check_s`` to check (outside the lock, as the real one reads and
    checks them), and that can hold a check until ``release`` is set."""

    def __init__(self, check_s: float = 0.0, **kw):
        super().__init__(**kw)
        self.check_s, self.release_checks = check_s, threading.Event()
        self.release_checks.set()

    def submit(self, lease, commit):
        self.release_checks.wait(30)
        time.sleep(self.check_s)
        return super().submit(lease, commit)


@pytest.fixture
def served():
    apps = []

    def start(coord=None, **kw):
        coord = coord or FakeCoordinator()
        app, url = serve(coord, tick_interval=0.05, **kw)
        apps.append(app)
        return coord, url

    yield start
    for app in apps:
        app.close(verbose=False)


def post(url: str, name: str, *args, **kw) -> httpx.Response:
    return httpx.post(f"{url}/hubgrpo/api/{name}", json={"data": list(args)}, timeout=20, **kw)


@pytest.mark.timeout(30)
def test_plain_routes_answer_envelopes_and_submit_answers_before_the_check(served):
    coord, url = served(SlowChecks(check_s=0.0, quorum=3))
    coord.release_checks.clear()  # the check waits until the test lets it go
    lease = post(url, "lease", "w1", None, None, PROTOCOL_VERSION).json()["result"]
    assert lease["worker"] == "w1" and lease["signature"]
    t0 = time.monotonic()
    first = post(url, "submit", lease, SHA, None).json()
    assert time.monotonic() - t0 < 5 and first["ok"]
    sub_id = f"w1-{lease['lease_id']}"
    assert first["result"]["status"] == "checking" and first["result"]["submission_id"] == sub_id
    assert 0 < first["result"]["wait_s"] <= 30
    again = post(url, "submit", lease, SHA, None).json()["result"]  # a retried submit joins the queued round
    assert again["status"] == "checking" and again["queued"] == 1
    heartbeat = post(url, "heartbeat", lease, None).json()  # other calls go on while the round waits
    assert heartbeat["ok"] and post(url, "verdict", lease, None).json()["result"]["status"] == "checking"
    coord.release_checks.set()
    deadline = time.monotonic() + 10
    while (v := post(url, "verdict", lease, None).json())["result"]["status"] == "checking":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert v == {"ok": True, "result": {"status": "admitted", "submission_id": sub_id, "version": 0}}
    assert coord.calls["submit"] == 1  # checked once
    assert post(url, "status").json()["result"]["pending"] == 1


@pytest.mark.timeout(30)
def test_the_client_polls_the_verdict_and_raises_the_refusal(served):
    coord, url = served(SlowChecks(check_s=0.3, quorum=2, max_staleness=0))
    polls: list[float] = []
    sent = RecordingTransport()
    c = CoordinatorClient(url, poll_sleep=lambda s: (polls.append(s), time.sleep(s)), http_transport=sent)
    old, new = c.lease("w-old"), c.lease("w-new")
    assert sent.paths == ["/hubgrpo/api/lease"] * 2
    assert c.submit(new, SHA)["status"] == "admitted" and polls  # it waited for the check, then got the verdict
    assert c.submit(c.lease("w3"), SHA)["status"] == "merged"
    with pytest.raises(InvalidSubmission) as e:  # `old` is stale now: the refusal arrives typed, as before
        c.submit(old, SHA)
    assert e.value.code == "stale"
    with pytest.raises(LeaseError):  # a forged lease is refused at once, before anything is queued
        c.submit(old.model_copy(update={"steps": 99}), SHA)
    with pytest.raises(InvalidSubmission) as e:
        c.submit(c.lease("w4"), "")
    assert e.value.code == "bad_commit"
    assert c.submit(new, SHA)["status"] == "duplicate"


@pytest.mark.timeout(30)
def test_a_restarted_coordinator_answers_unknown_and_the_client_submits_again(served):
    coord, url = served(FakeCoordinator(quorum=5))
    lease = CoordinatorClient(url).lease("w1")
    assert post(url, "verdict", lease.model_dump(mode="json"), None).json()["result"]["status"] == "unknown"
    calls = []

    class Forgetful(CoordinatorClient):  # the first verdict comes from a "restarted" coordinator
        def _call(self, name, *args, **kw):
            calls.append(name)
            if name == "verdict" and calls.count("verdict") == 1:
                return {"status": "unknown", "submission_id": "x"}
            return super()._call(name, *args, **kw)

    assert Forgetful(url).submit(lease, SHA)["status"] in ("admitted", "duplicate")
    assert calls[:3] == ["submit", "verdict", "submit"]


def hostile(url: str, body: bytes, name: str = "lease", **kw) -> httpx.Response:
    return httpx.post(f"{url}/hubgrpo/api/{name}", content=body, timeout=20,
                      headers={"Content-Type": "application/json"}, **kw)


@pytest.mark.timeout(60)
def test_hostile_bodies_get_a_400_or_413_that_names_the_problem(served):
    coord, url = served()
    lease = post(url, "lease", "w1", None, None, PROTOCOL_VERSION).json()["result"]
    seen = dict(coord.calls)
    deep = b'{"data": [' + b"[" * 40 + b"]" * 40 + b"]}"
    cases = [
        (b"not json", "not accepted JSON"), (b"", "not accepted JSON"), (b"\xff\xfe{", "not accepted JSON"),
        (b"[1]", "'data' list"), (b'{"data": 3}', "'data' list"), (b'{"rows": []}', "'data' list"),
        (b'{"data": [NaN]}', "NaN is not a JSON number"), (b'{"data": [Infinity]}', "Infinity"),
        (b'{"data": [-Infinity]}', "Infinity"), (b'{"data": [1e400]}', "out of range"),
        (b'{"data": [' + b"9" * 5000 + b"]}", "characters"), (deep, "nested deeper"),
        (b'{"data": [' + b"[" * 200_000 + b"]}", "not accepted JSON"),  # the parser's own recursion limit
        (b'{"data": ["\\ud800"]}', "lone surrogate"),
        (b'{"data": [7, null, null, 2]}', "argument 1 (worker) of 'lease' must be str"),
        (b'{"data": [true, null, null, 2]}', "argument 1 (worker) of 'lease' must be str, not bool"),
        (b'{"data": ["w", null, {"t": 1}, 2]}', "argument 3 (token)"),
        (b'{"data": ["w", null, null, 2, "x", "y", "z"]}', "takes 1 to 4 arguments"),
        (b'{"data": []}', "takes 1 to 4 arguments"),
    ]
    for body, why in cases:
        r = hostile(url, body)
        assert r.status_code == 400, (body[:60], r.text[:300])
        error = r.json()["error"]
        assert error["code"] == "protocol" and why in error["message"], (body[:60], error)
    for name, data, why in [("heartbeat", ["not a lease"], "argument 1 (lease) of 'heartbeat' must be dict"),
                            ("submit", [lease, ["ab"]], "argument 2 (commit) of 'submit' must be str"),
                            ("verdict", [[lease]], "must be dict"),
                            ("record_eval", ["1", 0.5, 3], "argument 1 (version) of 'record_eval' must be int")]:
        r = httpx.post(f"{url}/hubgrpo/api/{name}", json={"data": data}, timeout=20)
        assert r.status_code == 400 and why in r.json()["error"]["message"], (name, r.text)
    big = hostile(url, b'{"data": ["' + b"x" * (2 << 20) + b'"]}')
    assert big.status_code == 413 and "larger than the limit" in big.json()["error"]["message"]
    chunks = [b'{"data": ["'] + [b"x" * 65536] * 40  # no content-length: a streamed body, cut at the limit
    streamed = httpx.post(f"{url}/hubgrpo/api/lease", content=iter(chunks), timeout=20,
                          headers={"Content-Type": "application/json"})
    assert streamed.status_code == 413, streamed.text[:200]
    unknown = httpx.post(f"{url}/hubgrpo/api/nope", json={"data": []}, timeout=20)
    assert unknown.status_code == 404 and "'nope'" in unknown.json()["error"]["message"]
    assert httpx.get(f"{url}/hubgrpo/api/lease", timeout=20).status_code == 405
    assert coord.calls == seen  # none of it reached the coordinator
    malformed = post(url, "heartbeat", {"lease_id": "x"}, None).json()  # the right type, a wrong value
    assert malformed["ok"] is False and malformed["error"]["code"] == "lease"
    assert post(url, "lease", "w2", None, None, PROTOCOL_VERSION).json()["ok"]  # the app is fine afterwards


@pytest.mark.timeout(30)
def test_the_client_falls_back_to_gradio_routes_on_a_coordinator_without_plain_routes(served, monkeypatch):
    import hubgrpo.worker.http_transport as transport_mod

    coord, url = served()
    # an older coordinator has no plain routes: Gradio answers their path with its own 404 (not an envelope)
    monkeypatch.setattr(transport_mod, "PLAIN_PREFIX", "/not-served")
    assert httpx.post(f"{url}/not-served/lease", json={"data": []}).status_code == 404
    sent = RecordingTransport()
    c = CoordinatorClient(url, http_transport=sent)
    lease = c.lease("w1")
    assert sent.paths == ["/not-served/lease", "/gradio_api/run/lease"]  # Gradio's /run, as before the plain routes
    assert c.submit(lease, SHA)["status"] == "admitted"  # synchronous there: nothing to poll


def run_route(url: str, name: str, *args) -> dict:
    """The gr.api endpoint ``name`` through Gradio's one-shot route."""
    r = httpx.post(f"{url}/gradio_api/run/{name}", json={"data": list(args)}, timeout=20)
    assert r.status_code == 200, r.text
    return r.json()["data"][0]


@pytest.mark.timeout(60)
def test_each_plain_route_answers_the_envelope_of_its_gradio_endpoint(served):
    """Two identical fake coordinators (same secret, clock and numbering), one called through the plain routes and
    one through the gr.api endpoints: the same calls get the same envelopes, refusals included."""
    _, plain_url = served(FakeCoordinator(quorum=2))
    _, gradio_url = served(FakeCoordinator(quorum=2))
    both = []

    def plain(name, *args):
        return post(plain_url, name, *args).json()

    def gradio(name, *args):
        return run_route(gradio_url, name, *args)

    for call in (plain, gradio):
        answers = []
        first = call("lease", "w1", None, None, PROTOCOL_VERSION)
        second = call("lease", "w2", None, None, PROTOCOL_VERSION)
        answers += [first, second, call("lease", "w3", None, None, 1)]  # another protocol: refused
        lease, other = first["result"], second["result"]
        answers.append(call("heartbeat", lease, None))
        answers.append(call("heartbeat", {**lease, "steps": 99}, None))  # forged
        answers.append(call("heartbeat", {"lease_id": 3}, None))  # malformed
        submitted = call("submit", lease, SHA, None)
        if call is plain:
            assert submitted["result"]["status"] == "checking"
            deadline = time.monotonic() + 10
            while (submitted := plain("verdict", lease, None))["result"]["status"] == "checking":
                assert time.monotonic() < deadline
                time.sleep(0.02)
        answers.append(submitted)
        answers.append(call("submit", lease, SHA, None))  # again: duplicate
        answers.append(call("submit", other, "", None))  # refused before it is queued
        answers.append(call("verdict", lease, None))
        answers.append(call("release", other, None))
        status = call("status", None)
        assert status["result"].pop("ticks") > 0  # the tick thread's count: timing, not the route
        answers.append(status)
        both.append(answers)
    assert both[0] == both[1]
    assert [a["ok"] for a in both[0]] == [True, True, False, True, False, False, True, True, False, True, True, True]
    assert both[0][6]["result"]["status"] == "admitted" and both[0][7]["result"]["status"] == "duplicate"


@pytest.mark.timeout(30)
def test_a_decided_round_is_not_checked_again(served):
    coord, url = served(FakeCoordinator(quorum=5, max_staleness=0))
    client = CoordinatorClient(url)
    good, bad = client.lease("w1"), client.lease("w2")
    assert client.submit(good, SHA)["status"] == "admitted"
    with pytest.raises(InvalidSubmission) as first:
        client.submit(bad, "not-a-sha")  # the fake refuses it in its check (bad_commit)
    checks = coord.calls["submit"]
    for _ in range(3):  # retries (a lost answer, a restarted worker loop): answered from the verdict
        assert client.submit(good, SHA)["status"] == "duplicate"
        with pytest.raises(InvalidSubmission) as again:
            client.submit(bad, "not-a-sha")
        assert again.value.code == first.value.code == "bad_commit" and again.value.message == first.value.message
    assert coord.calls["submit"] == checks == 2  # checked once each


class HeldChecks(Coordinator):
    """The real coordinator, whose admission checks wait until ``gate`` is set (a round stays queued)."""

    gate: threading.Event

    def submit(self, lease, commit, *, count_commit=True):
        assert self.gate.wait(30), "the test never let the check run"
        return super().submit(lease, commit, count_commit=count_commit)


def held_run(tmp_path, **overrides):
    store = LocalStore(tmp_path / "repo")
    init_repo(store, make_config(**overrides), write_adapter(tmp_path / "v0", seed=0))
    HeldChecks.gate = threading.Event()
    return store, HeldChecks(store, b"secret", workdir=tmp_path / "work")


@pytest.mark.timeout(60)
def test_a_queued_round_survives_a_restart_and_is_admitted_once(served, tmp_path):
    store, coord = held_run(tmp_path, **{"merge.quorum": 4})
    _, url = served(coord)
    lease = CoordinatorClient(url).lease("w1")
    commit = push_submission(store, lease, tmp_path, seed=1)
    queued = post(url, "submit", lease.model_dump(mode="json"), commit, None).json()["result"]
    assert queued["status"] == "checking" and lease.lease_id not in coord.active  # handed in, not yet checked
    sub_id = queued["submission_id"]
    assert sub_id not in [p.sub_id for p in coord.scan()]  # the running coordinator's scan leaves it to its queue
    assert sub_id in {s for _, s in coord.inbox.unseen(set(), None, range(0, 1))}  # though it is in the repo
    # the coordinator dies with the round queued and unchecked; a new one starts on the same repo
    restarted = Coordinator(store, b"secret", workdir=tmp_path / "work2")
    assert sub_id in restarted.pending  # its startup scan found the round
    _, url2 = served(restarted)
    assert post(url2, "verdict", lease.model_dump(mode="json"), None).json()["result"]["status"] == "unknown"
    client = CoordinatorClient(url2)
    assert client.submit(lease, commit)["status"] == "duplicate"  # the worker's retry: no second admission
    assert client.submit(lease, commit)["status"] == "duplicate"
    assert list(restarted.pending) == [sub_id] and not restarted.new_refusals
    HeldChecks.gate.set()  # let the dead process's check go (it changes only that process)


@pytest.mark.timeout(60)
def test_queued_rounds_count_against_the_commit_budget(served, tmp_path):
    store, coord = held_run(tmp_path, **{"merge.quorum": 2})
    coord.cfg.coordinator.commit_budget_per_hour = len(coord.commit_times) + 2  # one round + its merge
    _, url = served(coord)
    client = CoordinatorClient(url)
    lease = client.lease("w1")
    commit = push_submission(store, lease, tmp_path, seed=1)
    assert post(url, "submit", lease.model_dump(mode="json"), commit, None).json()["result"]["status"] == "checking"
    assert coord.in_flight() == {f"w1-{lease.lease_id}"} and not coord.active
    with pytest.raises(Refused) as queued:  # the queued round still needs its commit counted and a merge
        client.lease("w2")
    assert queued.value.code == "budget"
    HeldChecks.gate.set()
    deadline = time.monotonic() + 20
    while coord.in_flight():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert f"w1-{lease.lease_id}" in coord.pending
    with pytest.raises(Refused) as admitted:  # the same count once it is admitted: nothing is counted twice
        client.lease("w2")
    assert admitted.value.code == "budget"
    coord.cfg.coordinator.commit_budget_per_hour += 1
    assert client.lease("w2").worker == "w2"  # one more commit in the budget: the next round fits


@pytest.mark.timeout(120)
def test_auth_on_the_plain_routes_is_the_auth_of_the_gradio_endpoints(tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger="hubgrpo")
    emu = start_emulator()
    apps = []
    try:
        coord = new_coordinator(make_run(emu, tmp_path, "plain-auth"), tmp_path)
        app, url = serve_space(coord, auth=make_auth(coord), batch_wait_s=0.1, tick_interval=0.2)
        apps.append(app)

        def plain(name, *args, token=None):  # the token in the header, as the hubgrpo client sends it
            headers = {"Authorization": f"Bearer {token}"} if token else None
            return httpx.post(f"{url}/hubgrpo/api/{name}", json={"data": list(args)}, headers=headers,
                              timeout=20).json()

        def gradio(name, *args, token=None):
            headers = {"Authorization": f"Bearer {token}"} if token else None
            r = httpx.post(f"{url}/gradio_api/run/{name}", json={"data": list(args)}, headers=headers, timeout=20)
            return r.json()["data"][0]

        answers = {}
        for call in (plain, gradio):
            tag = call.__name__
            refused = [call("lease", f"{tag}-a", None, None, PROTOCOL_VERSION),
                       call("lease", f"{tag}-b", None, None, PROTOCOL_VERSION, token=MALLORY),
                       call("lease", f"{tag}-c", None, None, PROTOCOL_VERSION, token="hf_not_a_real_token")]
            bob = call("lease", f"{tag}-bob", "alice", None, PROTOCOL_VERSION, token=BOB)  # the authenticated name replaces `user`
            lease = bob["result"]
            assert bob["ok"] and lease["user"] == "bob"
            refused += [call("heartbeat", lease, None, token=ALICE),
                        call("submit", lease, "ab" * 20, None, token=ALICE),
                        call("verdict", lease, None, token=ALICE), call("release", lease, None)]
            assert call("heartbeat", lease, None, token=BOB)["ok"] and call("status", None)["ok"]  # status: public
            answers[tag] = json.loads(json.dumps(refused).replace(lease["lease_id"], "LEASE"))
        # gradio_client users may still send the token as an argument on Gradio's routes; the plain routes
        # authenticate from the header before they read a body
        assert gradio("lease", "gradio-arg", None, BOB, PROTOCOL_VERSION)["result"]["user"] == "bob"
        by_argument = httpx.post(f"{url}/hubgrpo/api/lease", json={"data": ["plain-arg", None, BOB, PROTOCOL_VERSION]},
                                 timeout=20)
        assert by_argument.status_code == 401 and "no token" in by_argument.json()["error"]["message"]
        assert answers["plain"] == answers["gradio"]
        assert [a["error"]["code"] for a in answers["plain"]] == ["auth"] * 7
        messages = [a["error"]["message"] for a in answers["plain"]]
        assert "no token" in messages[0] and "may not work" in messages[1] and "does not recognise" in messages[2]
        assert all("another user" in m for m in messages[3:6])
        assert not any(t in caplog.text for t in (ALICE, BOB, MALLORY, "hf_not_a_real_token"))
    finally:
        for app in apps:
            app.hubgrpo_uploads.close()
            app.close(verbose=False)
        emu.stop()
