"""A coordinator app that goes away while a gradio_client call waits for its answer: the call is retried as
unreachable, never taken for a protocol mismatch (which would stop the worker)."""

from __future__ import annotations

import threading
from concurrent.futures import CancelledError

import pytest

from hubgrpo.errors import CoordinatorError
from hubgrpo.space.api import serve
from hubgrpo.worker.bounded_http import Unavailable, http_failure
from hubgrpo.worker.client import CoordinatorClient
from tests.support.fake_coordinator import FakeCoordinator


class Blocking(FakeCoordinator):
    """Its lease waits until ``release`` is set."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.entered, self.release = threading.Event(), threading.Event()

    def lease(self, worker: str, user: str | None = None):
        self.entered.set()
        self.release.wait(10)
        return super().lease(worker, user)


@pytest.mark.timeout(60)
def test_an_app_closed_mid_call_is_unreachable_not_a_protocol_error():
    coord = Blocking()
    app, url = serve(coord, tick_interval=0.05)
    client = CoordinatorClient(url, transport="gradio", timeout=20, retries=1)
    client.sleep = lambda s: None
    coord.release.set()
    client.lease("warm")  # connected
    coord.entered.clear()
    failure: list[BaseException] = []

    def call():
        try:
            client.lease("w1")
        except BaseException as e:  # noqa: BLE001 - the test looks at what it was
            failure.append(e)

    t = threading.Thread(target=call)
    coord.release.clear()
    t.start()
    assert coord.entered.wait(10)
    app.close(verbose=False)
    coord.release.set()
    t.join(30)
    client.close()
    assert failure, "the call answered although its app was closed"
    assert isinstance(failure[0], CoordinatorError) and failure[0].code == "unreachable", repr(failure[0])


def test_a_job_cancelled_by_a_closed_stream_is_retried_not_fatal():
    """gradio_client cancels a job whose event stream ends before its answer (``concurrent.futures
    .CancelledError``, seen under load in CI): a transport failure to retry, like a dropped connection."""
    failure = http_failure(CancelledError(), "http://127.0.0.1:1")
    assert isinstance(failure, Unavailable), failure
    assert isinstance(http_failure(ValueError("odd"), "http://127.0.0.1:1"), CoordinatorError)  # others: not retried
