"""A real S3 server on 127.0.0.1 for the tests: moto's S3 implementation (``moto[server]``) over HTTP, in its own
process, started by ``S3Server().start()`` on a free port and stopped by ``stop()``.

``python -m moto.server`` serves requests on many threads, and moto 5.2.5 checks ``If-Match``/``If-None-Match``
and then writes without a lock in between, so two concurrent conditional writes to one key can both succeed. Real
S3 makes a conditional write atomic (one wins; the other gets 412, or 409 ConditionalRequestConflict). This server
runs the same moto application but lets one request at a time into it, which gives that guarantee (and makes
moto's in-memory backend safe for concurrent clients); it is otherwise moto's own server.

Run as ``python tests/s3_server.py PORT``.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path


def serve(port: int) -> None:
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import make_server

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
    app = DomainDispatcherApplication(create_backend_app)
    one_at_a_time = threading.Lock()

    def serialised(environ, start_response):
        with one_at_a_time:
            return list(app(environ, start_response))

    make_server("127.0.0.1", port, serialised, threaded=True, request_handler=MotoRequestHandler).serve_forever()


class S3Server:
    """A moto S3 server in a child process; ``url`` is its endpoint (for ``AWS_ENDPOINT_URL``)."""

    def __init__(self, startup_s: float = 60.0):
        self.startup_s = startup_s
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
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), str(self.port)], env=env,
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
    serve(int(sys.argv[1]))
