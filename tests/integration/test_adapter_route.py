"""The coordinator's ``GET /hubgrpo/api/adapter/<version>/<adapter id>/<file>`` route (a real app on 127.0.0.1, raw
HTTP and the worker's client): on a served Space with the Hub's auth (the Hub emulator) only the run's users get a
byte, a path never names anything but a version's two files, the bytes hash to the id the status and the leases
name, and no token reaches the log; an auth hook of the documented shape guards it too; a version that is not a
number is a 404."""

from __future__ import annotations

import logging

import httpx
import pytest

from hubgrpo import layout
from hubgrpo.errors import Refused
from hubgrpo.space.api import serve
from hubgrpo.space.app import serve_space
from hubgrpo.space.auth import make_auth
from hubgrpo.worker.client import CoordinatorClient
from tests.support.checkpoint_run import setup_run
from tests.support.space_support import ALICE, BOB, MALLORY, make_run, new_coordinator, start_emulator

pytestmark = pytest.mark.timeout(120)


@pytest.mark.timeout(120)
def test_the_adapter_route_serves_only_the_runs_users_and_only_a_versions_two_files(tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    emu = start_emulator()
    app = None
    try:
        coord = new_coordinator(make_run(emu, tmp_path, "adapter-route"), tmp_path)
        app, url = serve_space(coord, auth=make_auth(coord), batch_wait_s=0.1, tick_interval=0.2)
        status = httpx.post(f"{url}/hubgrpo/api/status", json={"data": [None]}, timeout=20).json()["result"]
        aid = status["version_id"]
        assert status["version"] == 0 and layout.is_commit_id(aid)
        base = f"{url}/hubgrpo/api/adapter/0/{aid}"

        def get(path, token=None, **headers):
            if token:
                headers["Authorization"] = f"Bearer {token}"
            return httpx.get(path, headers=headers, timeout=20)

        for token in (None, MALLORY, "hf_not_a_real_token"):  # anonymous, a stranger, a token the Hub refuses
            for name in (layout.ADAPTER_WEIGHTS, layout.ADAPTER_CONFIG):
                r = get(f"{base}/{name}", token)
                assert r.status_code == 401 and r.json()["error"]["code"] == "auth", (token, r.status_code)
                assert b"lora" not in r.content
        blobs = {}
        for name in (layout.ADAPTER_WEIGHTS, layout.ADAPTER_CONFIG):
            r = get(f"{base}/{name}", ALICE)
            assert r.status_code == 200
            assert r.headers["etag"] == f'"{aid}-{name}"' and "immutable" in r.headers["cache-control"]
            assert "private" in r.headers["cache-control"]
            blobs[name] = r.content
            again = get(f"{base}/{name}", ALICE, **{"If-None-Match": r.headers["etag"]})
            assert again.status_code == 304 and not again.content
        assert layout.adapter_id(blobs[layout.ADAPTER_WEIGHTS], blobs[layout.ADAPTER_CONFIG]) == aid
        odd = [f"{base}/state.json", f"{base}/..%2F..%2Fconfig.yaml", f"{url}/hubgrpo/api/adapter/0/{aid.upper()}/"
               f"{layout.ADAPTER_CONFIG}", f"{url}/hubgrpo/api/adapter/-1/{aid}/{layout.ADAPTER_CONFIG}",
               f"{url}/hubgrpo/api/adapter/12345678901/{aid}/{layout.ADAPTER_CONFIG}",
               f"{url}/hubgrpo/api/adapter/0/{'0' * 40}/{layout.ADAPTER_CONFIG}",  # the right version, another id
               f"{url}/hubgrpo/api/adapter/7/{aid}/{layout.ADAPTER_CONFIG}",  # a version that was never made
               f"{url}/hubgrpo/api/adapter/0/..%2F..%2F..%2F..%2Fetc/passwd"]
        for path in odd:
            r = get(path, ALICE)  # refused by the route (its envelope), or never routed (a/../b is more segments)
            assert r.status_code == 404 and b"lora" not in r.content and b"root:" not in r.content, (path, r.status_code)
        with CoordinatorClient(url, token=BOB, retries=0) as bob:  # the worker's client: checked against the id
            folder = bob.adapter(0, aid, tmp_path / "bob-cache", 1 << 20)
        assert folder.name == aid and (folder / layout.ADAPTER_WEIGHTS).read_bytes() == blobs[layout.ADAPTER_WEIGHTS]
        with CoordinatorClient(url, token=MALLORY, retries=0) as mallory:
            with pytest.raises(Exception) as refused:
                mallory.adapter(0, aid, tmp_path / "mallory-cache", 1 << 20)
        assert getattr(refused.value, "code", None) == "auth" and not (tmp_path / "mallory-cache" / aid).exists()
        logged = "\n".join(r.getMessage() for r in caplog.records)
        assert not any(t in logged for t in (ALICE, BOB, MALLORY))
    finally:
        if app is not None:
            app.close(verbose=False)
        emu.stop()


def only_alice(token, request=None):
    """An auth hook of the documented shape ``auth(token, request) -> user`` (no ``identify``)."""
    from hubgrpo.space.auth import request_token

    if (token or request_token(request)) != "hf_alice_token":
        raise Refused("auth", "only alice may work on this run", hint="send alice's token")
    return "alice"


def _served(tmp_path, auth):
    store, c, _clock = setup_run(tmp_path)
    app, url = serve(c, auth=auth, tick_interval=0.2)
    return app, url, c


def test_an_auth_hook_without_identify_still_guards_the_adapter_route(tmp_path):
    app, url, c = _served(tmp_path, only_alice)
    try:
        path = f"{url}/hubgrpo/api/adapter/0/{c.ids[0]}/{layout.ADAPTER_WEIGHTS}"
        lease = httpx.post(f"{url}/hubgrpo/api/lease", json={"data": ["w", None, None, layout.PROTOCOL_VERSION]},
                           timeout=20).json()
        assert lease["ok"] is False and lease["error"]["code"] == "auth"  # the POST routes refuse the anonymous
        r = httpx.get(path, timeout=20)
        assert r.status_code == 401, f"an anonymous GET got HTTP {r.status_code} ({len(r.content)} bytes of weights)"
    finally:
        app.close(verbose=False)


def test_a_version_in_unicode_digits_is_a_404_not_a_server_error(tmp_path):
    app, url, c = _served(tmp_path, None)  # loopback without auth: anyone who reaches it
    try:
        for version in ("%C2%B2", "%E2%91%A0"):  # '²' and '①': str.isdigit() says yes, int() says no
            r = httpx.get(f"{url}/hubgrpo/api/adapter/{version}/{c.ids[0]}/{layout.ADAPTER_CONFIG}", timeout=20)
            assert r.status_code == 404, (version, r.status_code, r.text[:200])
    finally:
        app.close(verbose=False)
