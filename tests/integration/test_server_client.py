"""The coordinator API end to end: a real Gradio app on 127.0.0.1 (``hubgrpo.space.api``) over a fake coordinator,
called through both client transports (``hubgrpo.worker.client``)."""

from __future__ import annotations

import http.server
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from hubgrpo.worker.client import CoordinatorClient, space_url
from hubgrpo.coordinator.inflight import InFlight
from hubgrpo.errors import CoordinatorError, InvalidSubmission, LeaseError, Refused
from hubgrpo.layout import Lease
from hubgrpo.space.api import build_app, free_port, serve
from tests.support.fake_coordinator import FakeCoordinator, RecordingTransport

SHA = "ab" * 20
# (transport, http route): the plain routes (submit checked in the background), raw HTTP one-shot /run, raw HTTP
# queued /call + SSE, gradio_client
TRANSPORTS = [("http", "plain"), ("http", "run"), ("http", "call"), ("gradio", "run")]
TRANSPORT_IDS = ["http-plain", "http-run", "http-call", "gradio"]


class Swappable:
    """Forwards the coordinator interface to ``target``, swapped per test, so one app serves the module."""

    target: FakeCoordinator | None = None
    in_flight = InFlight()  # the app's admission queue reports to the proxy, whichever target is behind it

    def __getattr__(self, name: str):
        if self.target is None and name in ("tick", "plan_merge", "scan_pass", "flush", "warm_up", "prefold",
                                            "checkpoints_inline", "use_merge_thread", "rounds_via_upload"):
            return lambda *a, **kw: None
        return getattr(self.target, name)


@pytest.fixture(scope="module")
def shared():
    """One running app over a ``Swappable`` coordinator, and one client per transport, for the module."""
    proxy = Swappable()
    app, url = serve(proxy, tick_interval=0.05)
    clients: dict = {}
    proxy.admission_queue = app.hubgrpo_ticker.api.admission_queue
    yield proxy, url, clients
    for c in clients.values():
        c.close()
    app.close(verbose=False)


@pytest.fixture
def api(shared):
    """use(coord=None, transport) -> (coord, client): a fresh fake coordinator behind the shared app."""
    proxy, url, clients = shared

    def use(coord: FakeCoordinator | None = None, transport=("http", "plain")):
        proxy.target = coord or FakeCoordinator()
        proxy.admission_queue._verdicts.clear()  # verdicts belong to one coordinator: a fresh one has none
        c = clients.get(transport) or clients.setdefault(transport, client(url, transport))
        c.sleep = time.sleep
        return proxy.target, c

    use.url = url
    yield use
    proxy.target = None


@pytest.fixture
def served():
    """start(coord=None, **serve_kw) -> (coord, url): a separate app (own port, auth, blocks), closed after."""
    apps = []

    def start(coord: FakeCoordinator | None = None, **kw):
        coord = coord or FakeCoordinator()
        app, url = serve(coord, **{"tick_interval": 0.05, **kw})
        apps.append(app)
        return coord, url

    yield start
    for app in apps:
        app.close(verbose=False)


def client(url: str, transport=("http", "plain"), **kw) -> CoordinatorClient:
    return CoordinatorClient(url, transport=transport[0], http_route=transport[1], timeout=20, **kw)


def wait_until(cond, timeout: float = 5.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("transport", TRANSPORTS, ids=TRANSPORT_IDS)
def test_every_endpoint_round_trips(api, transport):
    coord, c = api(FakeCoordinator(quorum=2), transport)
    lease = c.lease("worker-1", user="alice")
    assert isinstance(lease, Lease) and lease.worker == "worker-1" and lease.user == "alice"
    assert lease == coord.active[lease.lease_id]  # the same signed lease, unchanged by the wire
    coord.clock.advance(10)
    renewed = c.heartbeat(lease)
    assert renewed.deadline == lease.deadline + 10 and renewed.signature != lease.signature
    assert c.submit(renewed, SHA) == {"status": "admitted", "submission_id": f"worker-1-{lease.lease_id}",
                                      "version": 0}
    assert c.submit(renewed, SHA)["status"] == "duplicate"
    second = c.lease("worker-2")
    assert c.submit(second.model_dump(mode="json"), SHA)["status"] == "merged"  # a dict lease works too
    third = c.lease("worker-3")
    assert c.release(third) is None and third.lease_id not in coord.active
    status = c.status()
    assert status["version"] == 1 and status["issued"] == 3 and status["leases"] == 0
    assert status["reward"] is None  # NaN in the coordinator's status becomes null, valid JSON


@pytest.mark.timeout(30)
@pytest.mark.parametrize("transport", TRANSPORTS, ids=TRANSPORT_IDS)
def test_refusals_arrive_typed_and_are_not_retried(api, transport):
    coord, c = api(FakeCoordinator(quorum=1, max_staleness=0, max_leases=3), transport)
    sleeps: list[float] = []
    c.sleep = sleeps.append
    with pytest.raises(InvalidSubmission) as e:
        c.lease("../etc")
    assert e.value.code == "bad_name" and e.value.hint
    old, new = c.lease("w-old"), c.lease("w-new")
    forged = old.model_copy(update={"steps": 999})
    with pytest.raises(LeaseError, match="bad signature"):
        c.heartbeat(forged)
    with pytest.raises(LeaseError, match="malformed lease"):
        c.submit({"lease_id": "L1", "signature": "x"}, SHA)
    with pytest.raises(InvalidSubmission) as e:
        c.submit(new, "not-a-sha")
    assert e.value.code == "bad_commit"
    assert c.submit(new, SHA)["status"] == "merged"  # version 0 -> 1, so `old` is now stale
    with pytest.raises(InvalidSubmission) as e:
        c.submit(old, SHA)
    assert e.value.code == "stale" and "too old" in e.value.message
    c.lease("w-a")
    c.lease("w-b")  # 3 leases out: the budget is spent
    calls = coord.calls["lease"]
    with pytest.raises(Refused) as e:
        c.lease("w-c")
    assert e.value.code == "budget" and e.value.wait_s == 2.5
    assert coord.calls["lease"] == calls + 1  # one attempt: refusals are not retried
    coord.finished = True
    with pytest.raises(Refused) as e:
        c.lease("w-d")
    assert e.value.code == "finished"
    assert sleeps == []


@pytest.mark.timeout(30)
@pytest.mark.parametrize("transport", [TRANSPORTS[0], TRANSPORTS[2]], ids=["http", "gradio"])
def test_internal_error_becomes_coordinator_error_without_traceback(api, transport, caplog):
    coord, c = api(transport=transport)
    coord.fail_with = KeyError("state.json")
    with caplog.at_level(logging.ERROR, logger="hubgrpo.space.api"):
        with pytest.raises(CoordinatorError) as e:
            c.lease("w1")
        assert c.lease("w1").lease_id == "L000000"  # the app survives
    assert type(e.value) is CoordinatorError and e.value.code == "internal"
    assert "KeyError" in e.value.message and "Traceback" not in str(e.value) and 'File "' not in str(e.value)
    assert "Traceback" in caplog.text and "fake_coordinator.py" in caplog.text  # logged server-side
    coord.fail_with = RuntimeError("boom")
    raw = httpx.post(f"{api.url}/gradio_api/run/status", json={"data": [None]}).json()["data"][0]
    assert raw["ok"] is False and set(raw["error"]) == {"error", "code", "message", "hint"}
    assert raw["error"]["error"] == "CoordinatorError" and "Traceback" not in str(raw)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("transport", [TRANSPORTS[0], TRANSPORTS[2]], ids=["http", "gradio"])
def test_concurrent_leases_are_distinct(api, transport):
    coord, c = api(transport=transport)
    with ThreadPoolExecutor(8) as pool:
        leases = list(pool.map(lambda i: c.lease(f"w{i % 8}"), range(40)))
    assert len({lease.lease_id for lease in leases}) == 40
    assert len({idx for lease in leases for idx in lease.prompt_indices}) == 160
    assert coord.counter == 40 and len(coord.active) == 40


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport", [TRANSPORTS[0], TRANSPORTS[2]], ids=["http", "gradio"])
def test_client_retries_until_the_app_comes_up(served, transport):
    port = free_port()
    sleeps: list[float] = []

    def nap(seconds: float) -> None:
        sleeps.append(seconds)
        time.sleep(min(seconds, 0.2))

    c = client(f"http://127.0.0.1:{port}", transport, sleep=nap, retries=300)  # made before the app exists
    starter = threading.Timer(1.0, lambda: served(port=port))
    starter.start()
    try:
        assert c.status()["issued"] == 0
    finally:
        starter.join()
        c.close()
    assert len(sleeps) >= 2


@pytest.mark.timeout(20)
@pytest.mark.parametrize("transport", [TRANSPORTS[0], TRANSPORTS[2]], ids=["http", "gradio"])
def test_client_gives_up_when_the_app_never_comes_up(transport):
    sleeps: list[float] = []
    url = f"http://127.0.0.1:{free_port()}"
    c = client(url, transport, sleep=sleeps.append, retries=3, backoff=0.5, max_backoff=1.0)
    with pytest.raises(CoordinatorError) as e:
        c.lease("w1")
    assert type(e.value) is CoordinatorError and e.value.code == "unreachable"
    assert url in e.value.message and "4 attempts" in e.value.message and e.value.hint
    assert len(sleeps) == 3 and 0.25 <= sleeps[0] <= 0.5 and all(0.5 <= s <= 1.0 for s in sleeps[1:])


class _Always503(http.server.BaseHTTPRequestHandler):
    hits = 0

    def do_POST(self):  # noqa: N802 (http.server API)
        type(self).hits += 1
        self.send_response(503)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.mark.timeout(20)
def test_5xx_answers_are_retried_then_reported():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Always503)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    sleeps: list[float] = []
    try:
        c = client(f"http://127.0.0.1:{server.server_address[1]}", sleep=sleeps.append, retries=2)
        with pytest.raises(CoordinatorError, match="HTTP 503") as e:
            c.submit({"lease_id": "L0"}, SHA)
    finally:
        server.shutdown()
        server.server_close()
    assert e.value.code == "unreachable" and _Always503.hits == 3 and len(sleeps) == 2


@pytest.mark.timeout(20)
def test_tick_thread_runs_and_expires_leases(api):
    coord, c = api(FakeCoordinator(ttl=30))
    lease = c.lease("w1")
    assert wait_until(lambda: coord.ticks >= 3)
    coord.clock.advance(31)
    assert wait_until(lambda: coord.expired == 1)
    with pytest.raises(LeaseError, match="unknown, released or expired"):
        c.heartbeat(lease)
    assert coord.calls["heartbeat"] == 1 and coord.active == {}


@pytest.mark.timeout(20)
def test_tick_thread_ends_when_app_closes():
    coord = FakeCoordinator()
    app, _ = serve(coord, tick_interval=0.05)
    assert wait_until(lambda: coord.ticks >= 2)
    app.close(verbose=False)
    app.hubgrpo_ticker.join(timeout=2)
    after = coord.ticks
    time.sleep(0.2)
    assert coord.ticks == after and not app.hubgrpo_ticker._thread.is_alive()


@pytest.mark.timeout(20)
def test_auth_hook_names_the_user_and_tokens_are_never_logged(served, caplog, capsys):
    tokens = {"hf_secret_alice": "alice", "hf_secret_bob": "bob"}

    def auth(token, request):
        assert request.headers.get("authorization") == (f"Bearer {token}" if token else None)
        if token == "hf_secret_crash":
            raise RuntimeError(f"hub lookup failed for {token}")
        if token not in tokens:
            raise Refused("auth", "a valid token is required", hint="pass --token")
        return tokens[token]

    coord, url = served(auth=auth)
    with caplog.at_level(logging.DEBUG):
        with pytest.raises(Refused) as e:
            client(url).lease("w1")
        assert e.value.code == "auth"
        lease = client(url, token="hf_secret_alice").lease("w1", user="mallory")
        assert lease.user == "alice"  # the authenticated name wins over the claimed one
        with pytest.raises(Refused, match="another user"):
            client(url, token="hf_secret_bob").heartbeat(lease)
        with pytest.raises(CoordinatorError) as e:
            client(url, token="hf_secret_crash").lease("w1")
        assert e.value.code == "internal" and "hf_secret_crash" not in str(e.value) and "***" in e.value.message
        assert client(url).status()["issued"] == 1  # status is public
    logged = caplog.text + "".join(capsys.readouterr())
    assert "hub lookup failed" in logged and "hf_secret" not in logged
    assert "hf_secret" not in repr(client(url, token="hf_secret_alice"))


@pytest.mark.timeout(10)
def test_transport_selection_and_targets():
    assert CoordinatorClient("http://127.0.0.1:1").transport_name == "http"
    assert CoordinatorClient("https://user-run.hf.space").transport_name == "http"
    assert CoordinatorClient("user/my_run.space").transport_name == "gradio"  # nothing connects yet
    asked: list[httpx.URL] = []
    answer = {"ok": True, "result": {"version": 0}}
    offline = httpx.MockTransport(lambda request: asked.append(request.url) or httpx.Response(200, json=answer))
    http_space = CoordinatorClient("User/my_run.space", transport="http", http_transport=offline)
    assert http_space.status() == {"version": 0}
    assert str(asked[0]) == "https://user-my-run-space.hf.space/hubgrpo/api/status"
    assert space_url("User/my_run.space") == "https://user-my-run-space.hf.space"
    for bad, kw in [("not a target", {}), ("http://x", {"transport": "carrier-pigeon"}),
                    ("user/space", {"http_transport": httpx.MockTransport(lambda request: httpx.Response(500))})]:
        with pytest.raises(CoordinatorError) as e:
            CoordinatorClient(bad, **kw)
        assert e.value.code == "config"


@pytest.mark.timeout(10)
def test_build_app_adds_endpoints_to_an_existing_blocks():
    import gradio as gr

    with gr.Blocks() as ui:
        inbox = gr.Textbox()
        gr.Button("echo").click(lambda s: s, inbox, inbox, api_name="echo")
    app = build_app(FakeCoordinator(), blocks=ui)
    assert app is ui
    assert sorted(app.get_api_info()["named_endpoints"]) == [
        "/echo", "/heartbeat", "/lease", "/record_eval", "/record_verdict", "/release", "/round_files", "/status",
        "/submit", "/verdict"]


@pytest.mark.timeout(20)
@pytest.mark.parametrize("queue", [False, True])
def test_http_client_works_where_the_rest_api_is_closed(served, queue):
    """On a Space Gradio turns ``api_open`` off: ``/run`` then serves only unqueued endpoints (ours, by default);
    against queued ones the client falls back to ``/call`` + SSE."""
    import gradio as gr

    coord, url = served(blocks=gr.Blocks().queue(api_open=False), queue=queue)
    sent = RecordingTransport()
    with client(url, ("http", "run"), http_transport=sent) as c:
        assert c.lease("w1").lease_id == "L000000" and c.status()["issued"] == 1
        assert sent.paths[-1].startswith("/gradio_api/call/" if queue else "/gradio_api/run/")


@pytest.mark.timeout(30)
def test_a_worker_of_another_protocol_is_refused_with_the_install_that_matches(served, monkeypatch):
    from hubgrpo import __version__
    from hubgrpo.layout import PROTOCOL_VERSION

    coord, url = served()
    old = client(url)
    # an old worker says nothing; protocol 1 workers send no rollouts (their rounds cannot be verified); a newer one
    for sent in (None, 1, PROTOCOL_VERSION + 1, "1", True):  # sends another number
        with pytest.raises(Refused) as e:
            old._call("lease", "w-old", None, after_token=[sent])
        assert e.value.code == "version" and "protocol" in e.value.message and __version__ in e.value.hint
    monkeypatch.setenv("SPACE_ID", "alice/run-space")  # on a Space: the hint is the Space's own wheel
    with pytest.raises(Refused) as e:
        old._call("lease", "w-old", None, after_token=[None])
    assert f"pip install https://huggingface.co/spaces/alice/run-space/resolve/main/wheels/hubgrpo-{__version__}" \
        in e.value.hint
    assert client(url).lease("w-new").worker == "w-new"  # this release's client sends its protocol


@pytest.mark.timeout(90)
def test_a_served_coordinator_scans_at_once_for_rounds_committed_while_it_started(tmp_path):
    """A round committed after the coordinator's constructor scanned the repo (while it was starting to serve) and
    never submitted is found by the served coordinator's first scan, not after coordinator.scan_interval_s."""
    from hubgrpo import layout
    from hubgrpo.coordinator.core import Coordinator
    from hubgrpo.coordinator.repo_init import init_repo
    from hubgrpo.store.local import LocalStore
    from tests.support.chaos_helpers import wait_for
    from tests.support.coord_helpers import make_config, push_submission, write_adapter

    cfg = make_config(**{"merge.quorum": 2, "coordinator.scan_interval_s": 3600})
    store = LocalStore(tmp_path / "repo")
    init_repo(store, cfg, write_adapter(tmp_path / "v0", seed=0, b_scale=0.0))
    coord = Coordinator(store, b"scan-secret", workdir=tmp_path / "work")
    lease = coord.lease("late")
    push_submission(store, lease, tmp_path / "sub", seed=1)  # the worker then waits out a backoff, or crashed
    sub_id = layout.submission_id(lease.worker, lease.lease_id)
    assert sub_id not in coord.pending and not coord.scan_due()
    app, _ = serve(coord, port=0, tick_interval=0.2)
    try:
        wait_for(lambda: sub_id in coord.pending, 30, "the first scan to find the committed round")
    finally:
        app.close()
