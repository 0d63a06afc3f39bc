"""An anonymous visitor against a served ``hubgrpo space`` subprocess, before any body: what the HTTP server itself
keeps (the request line and the headers) and what Gradio keeps on disk (its file upload route).

- a request line (a URL, a query string) or a header of tens of MiB is cut by the server's head limit: the
  process's memory stays within 64 MiB of idle, and the connection is refused or closed long before it is all sent
  (uvicorn with httptools keeps a head of any size: +600 MiB for one 300 MiB header);
- Gradio's file route ``/gradio_api/upload`` takes no file: this app has no file component, and each anonymous
  64 KiB file there stayed on the Space's disk (``GRADIO_TEMP_DIR``), a disk filled at the network's speed.
"""

from __future__ import annotations

import os
import socket
import time

import pytest

from tests.support import visitor_attacks as va
from tests.support.space_support import ALICE, make_run, start_emulator

MiB = 1 << 20


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("heads")
    emu = start_emulator()
    proc = None
    try:
        make_run(emu, tmp, "heads", **{"rounds.versions": 1000})
        files = tmp / "gradio-files"
        env = dict(os.environ, HF_ENDPOINT=emu.url, HF_TOKEN=ALICE, HUBGRPO_SECRET="heads-test-secret",
                   OMP_NUM_THREADS="1", GRADIO_TEMP_DIR=str(files))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        proc = va.start_space("alice/heads", port, env, tmp / "space.log", extra=("--quiet",))
        yield proc, f"http://127.0.0.1:{port}", port, files
    finally:
        if proc is not None:
            va.stop(proc)
        emu.stop()


@pytest.mark.timeout(300)
def test_an_endless_request_line_or_header_is_cut_and_costs_no_memory(served):
    proc, url, port, _ = served
    time.sleep(1.0)
    baseline = va.rss_kib(proc.pid)
    size = 96 * MiB
    with va.PeakSampler(proc.pid) as sampler:
        header = va.send_head(port, b"GET /hubgrpo/api/status HTTP/1.1\r\nHost: x\r\nX-Long: ", size)
        query = va.send_head(port, b"GET /?q=", size)
        time.sleep(0.5)
    grew_mib = (sampler.peak - baseline) / 1024
    assert grew_mib <= 64, f"the Space grew by {grew_mib:.0f} MiB over its idle {baseline / 1024:.0f} MiB"
    for sent, answer in (header, query):
        assert sent < 16 * MiB, (sent, answer[:200])  # refused long before the end
        assert not answer or answer.split(b" ", 2)[1] in (b"400", b"413", b"414", b"431"), answer[:200]


@pytest.mark.timeout(120)
def test_gradios_file_route_takes_no_file_from_anyone(served):
    import httpx

    _, url, _, files = served
    for headers in ({}, {"Authorization": f"Bearer {ALICE}"}):
        r = httpx.post(f"{url}/gradio_api/upload", files={"files": ("a.bin", os.urandom(60 << 10))},
                       headers=headers, timeout=30)
        assert r.status_code == 413 and r.json()["error"]["code"] == "protocol", (r.status_code, r.text[:300])
        assert "no file" in r.json()["error"]["message"], r.text[:300]
    kept = [p for p in files.rglob("*") if p.is_file()] if files.exists() else []
    assert not kept, kept[:5]


@pytest.mark.timeout(300)
def test_gradios_queued_routes_keep_nothing_for_an_anonymous_visitor(served):
    """Each call on Gradio's queued routes (``/gradio_api/call/<name>``, ``/gradio_api/queue/join``) is kept as an
    event with its body and its answer until someone reads the answer: 1500 anonymous 60 KB calls of ``status``
    grew the server by 300 MiB. Anonymous callers are refused there before the body (``status`` stays public on
    ``/hubgrpo/api/status`` and ``/gradio_api/run/status``); a user of the run is served."""
    import httpx
    from concurrent.futures import ThreadPoolExecutor

    proc, url, _, _ = served
    time.sleep(1.0)
    baseline = va.rss_kib(proc.pid)
    with va.PeakSampler(proc.pid) as sampler:
        with ThreadPoolExecutor(8) as pool:
            codes = list(pool.map(lambda i: va.queued_call(url, i), range(800)))
        time.sleep(1.0)
    grew_mib = (sampler.peak - baseline) / 1024
    assert grew_mib <= 64, f"the Space grew by {grew_mib:.0f} MiB over its idle {baseline / 1024:.0f} MiB"
    assert set(codes) == {401}, sorted(set(codes))
    alice = {"Authorization": f"Bearer {ALICE}"}
    event = httpx.post(f"{url}/gradio_api/call/status", json={"data": [None]}, headers=alice, timeout=30).json()
    stream = httpx.get(f"{url}/gradio_api/call/status/{event['event_id']}", headers=alice, timeout=30).text
    assert "event: complete" in stream and '"ok": true' in stream.replace('"ok":true', '"ok": true'), stream[:300]
    plain = httpx.post(f"{url}/hubgrpo/api/status", json={"data": []}, timeout=30).json()
    assert plain["ok"] is True  # status stays public where nothing is kept
