"""Review of issue 36 — DEFECTS (fail against the code at review time; not committed): the adapter route of a
served coordinator (a real app on 127.0.0.1, raw HTTP)."""

from __future__ import annotations

import httpx
import pytest

from hubgrpo import layout
from hubgrpo.errors import Refused
from hubgrpo.space.api import serve
from tests.unit.test_checkpoints import _setup

pytestmark = pytest.mark.timeout(120)


def only_alice(token, request=None):
    """An auth hook of the documented shape ``auth(token, request) -> user`` (no ``identify``)."""
    from hubgrpo.space.auth import request_token

    if (token or request_token(request)) != "hf_alice_token":
        raise Refused("auth", "only alice may work on this run", hint="send alice's token")
    return "alice"


def _served(tmp_path, auth):
    store, c, _clock = _setup(tmp_path)
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
