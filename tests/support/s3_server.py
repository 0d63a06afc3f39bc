"""A real S3 server on 127.0.0.1 for the tests: moto's S3 implementation (``moto[server]``) over HTTP, in its own
process, started by ``S3Server().start()`` on a free port and stopped by ``stop()``.

``python -m moto.server`` serves requests on many threads, and moto 5.2.5 checks ``If-Match``/``If-None-Match``
and then writes without a lock in between, so two concurrent conditional writes to one key can both succeed. Real
S3 makes a conditional write atomic (one wins; the other gets 412, or 409 ConditionalRequestConflict). This server
runs the same moto application but lets one request at a time into it, which gives that guarantee (and makes
moto's in-memory backend safe for concurrent clients); it is otherwise moto's own server.

moto accepts a presigned POST whatever its policy says (5.2: no ``content-length-range``, no expiry); S3 and MinIO
refuse a file outside the range with 400 ``EntityTooLarge`` / ``EntityTooSmall``. ``bounded_posts`` adds that one
check in front of moto (only that one: the policy's signature and expiry are still not checked), so that the
coordinator's probe finds a backend that bounds uploads; ``S3Server(bounded_posts=False)`` serves moto as it is.

Run as ``python tests/support/s3_server.py PORT [--moto-posts]``.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path


def bounded_posts(app):
    """WSGI middleware: a POST upload whose file is outside its policy's ``content-length-range`` gets S3's 400."""
    from werkzeug.formparser import parse_form_data

    def check(environ, start_response):
        if environ["REQUEST_METHOD"] != "POST" or not environ.get("CONTENT_TYPE", "").startswith("multipart/"):
            return app(environ, start_response)
        body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        parsed = dict(environ, **{"wsgi.input": io.BytesIO(body)})
        _, form, files = parse_form_data(parsed)
        size = len(files["file"].read()) if "file" in files else 0
        try:
            policy = json.loads(base64.b64decode(form.get("policy", "")))
        except ValueError:
            policy = {}
        for cond in policy.get("conditions", []):
            if isinstance(cond, list) and cond[:1] == ["content-length-range"] and not cond[1] <= size <= cond[2]:
                code = "EntityTooLarge" if size > cond[2] else "EntityTooSmall"
                answer = (f"<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>{code}</Code><Message>Your "
                          f"proposed upload is outside the policy's content-length-range</Message></Error>").encode()
                start_response("400 Bad Request", [("Content-Type", "application/xml"),
                                                   ("Content-Length", str(len(answer)))])
                return [answer]
        environ["wsgi.input"] = io.BytesIO(body)
        return app(environ, start_response)

    return check


def serve(port: int, posts_bounded: bool = True) -> None:
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import make_server

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
    app = DomainDispatcherApplication(create_backend_app)
    if posts_bounded:
        app = bounded_posts(app)
    one_at_a_time = threading.Lock()

    def serialised(environ, start_response):
        with one_at_a_time:
            return list(app(environ, start_response))

    make_server("127.0.0.1", port, serialised, threaded=True, request_handler=MotoRequestHandler).serve_forever()


class S3Server:
    """A moto S3 server in a child process; ``url`` is its endpoint (for ``AWS_ENDPOINT_URL``)."""

    def __init__(self, startup_s: float = 60.0, bounded_posts: bool = True):
        self.startup_s, self.bounded_posts = startup_s, bounded_posts
        self.proc: subprocess.Popen | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "S3Server":
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.log = tempfile.TemporaryFile()  # moto logs every request: never a pipe nobody reads
        args = [str(self.port)] + ([] if self.bounded_posts else ["--moto-posts"])
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), *args], env=env,
                                     stdout=subprocess.DEVNULL, stderr=self.log, start_new_session=True)
        deadline = time.monotonic() + self.startup_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise RuntimeError(f"the S3 server exited at start-up:\n{self.log.read().decode()[-3000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"the S3 server did not listen on {self.url} within {self.startup_s:.0f} s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc is not None:
            self.log.close()


if __name__ == "__main__":
    serve(int(sys.argv[1]), posts_bounded="--moto-posts" not in sys.argv[2:])
