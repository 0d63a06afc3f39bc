"""``hubgrpo launch --install space``: the job's wheel download, run as the job runs it (the generated ``python -c``
snippet in a real process, HF_TOKEN in its environment) against real HTTP servers on loopback. The token goes to
the Space's origin only: never to the origin a redirect names, never over plain HTTP to another host."""

from __future__ import annotations

import shlex
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from hubgrpo import __version__, layout
from hubgrpo.launch.jobs import install_command

TOKEN = "hf_wheel_fetch_secret_token"
SPACE = "alice/fetch-space"


class Origin:
    """A tiny HTTP server on 127.0.0.1: ``routes`` maps a path to (status, headers, body); every request's path
    and headers are recorded."""

    def __init__(self):
        self.routes: dict[str, tuple[int, dict, bytes]] = {}
        self.seen: list[tuple[str, dict]] = []
        origin = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                origin.seen.append((self.path, {k.lower(): v for k, v in self.headers.items()}))
                status, headers, body = origin.routes.get(self.path, (404, {}, b"no such file"))
                self.send_response(status)
                for k, v in {**headers, "Content-Length": str(len(body))}.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def origins():
    made = [Origin(), Origin()]
    yield made
    for o in made:
        o.close()


def fetch_snippet(endpoint: str) -> tuple[str, Path, str]:
    """The python -c code of the job's install line for ``endpoint``, where it writes the wheel, and the line."""
    line = install_command("space", coordinator=SPACE, endpoint=endpoint)
    argv = shlex.split(line)
    assert argv[:2] == ["python", "-c"], line
    return argv[2], Path(f"/tmp/{layout.wheel_name(__version__)}"), line


def run_snippet(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={"HF_TOKEN": TOKEN, "PATH": "/usr/bin:/bin"})


def wheel_path() -> str:
    return layout.space_wheel_url(SPACE, "", __version__)


@pytest.mark.timeout(60)
def test_the_job_s_wheel_fetch_never_forwards_the_token_to_another_origin(origins):
    space, cdn = origins
    space.routes[wheel_path()] = (302, {"Location": f"{cdn.url}/blob/wheel?signed=1"}, b"")
    cdn.routes["/blob/wheel?signed=1"] = (200, {}, b"the wheel bytes from the cdn")
    code, target, line = fetch_snippet(space.url)
    assert TOKEN not in line
    target.unlink(missing_ok=True)
    done = run_snippet(code)
    assert done.returncode == 0, done.stderr[-2000:]
    assert target.read_bytes() == b"the wheel bytes from the cdn"
    assert space.seen and space.seen[0][1].get("authorization") == f"Bearer {TOKEN}"  # private Spaces work
    assert cdn.seen and all("authorization" not in h for _, h in cdn.seen), cdn.seen
    assert all(TOKEN not in str(h) for _, h in cdn.seen)
    target.unlink(missing_ok=True)


@pytest.mark.timeout(60)
def test_a_same_origin_redirect_keeps_the_token_and_plain_http_elsewhere_is_refused(origins):
    space, _ = origins
    space.routes[wheel_path()] = (307, {"Location": "/api/resolve-cache/the-wheel"}, b"")
    space.routes["/api/resolve-cache/the-wheel"] = (200, {}, b"same-origin wheel")
    code, target, _ = fetch_snippet(space.url)
    target.unlink(missing_ok=True)
    done = run_snippet(code)
    assert done.returncode == 0, done.stderr[-2000:]
    assert target.read_bytes() == b"same-origin wheel"
    assert [h.get("authorization") for _, h in space.seen] == [f"Bearer {TOKEN}"] * 2
    target.unlink(missing_ok=True)

    space.seen.clear()
    space.routes[wheel_path()] = (302, {"Location": "http://wheels.example.invalid/w.whl"}, b"")
    refused = run_snippet(code)
    assert refused.returncode != 0 and not target.exists()
    assert "http://wheels.example.invalid" in refused.stderr and "https" in refused.stderr, refused.stderr
    assert TOKEN not in refused.stderr


@pytest.mark.timeout(60)
def test_the_first_url_must_be_https_or_loopback():
    code, target, _ = fetch_snippet("http://hub.example.invalid")
    refused = run_snippet(code)
    assert refused.returncode != 0 and "https" in refused.stderr and TOKEN not in refused.stderr, refused.stderr
