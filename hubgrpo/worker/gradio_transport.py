"""The gradio_client transport of ``CoordinatorClient`` (``transport="gradio"``, the default for Space ids)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import httpx

from hubgrpo.errors import CoordinatorError, wire_text
from hubgrpo.worker.bounded_http import OriginToken, Unavailable, http_failure

MAX_ANSWER_BYTES = 16 << 20  # the most of any one gradio answer read (a status is MiBs in long runs)
_UNTIMED = "/heartbeat/"  # gradio_client's keep-alive stream stays open for the client's life: only capped


class _Capped(httpx.SyncByteStream):
    """An answer's body, cut off past ``limit`` bytes (``too_large``) or after ``deadline`` (a read timeout)."""

    def __init__(self, inner, where: str, limit: int, deadline: float | None):
        self._inner, self._where, self._limit, self._deadline = inner, where, limit, deadline

    def __iter__(self):
        total = 0
        for chunk in self._inner:
            total += len(chunk)
            if total > self._limit:
                raise CoordinatorError(
                    f"the coordinator at {self._where} answered with more than "
                    f"{self._limit >> 20} MiB; the worker stopped reading",
                    code="too_large",
                    hint="a hubgrpo coordinator's answers are small: check the URL you were given",
                )
            if self._deadline is not None and time.monotonic() > self._deadline:
                raise httpx.ReadTimeout("the whole answer took longer than its deadline")
            yield chunk

    def close(self) -> None:
        self._inner.close()


class _BoundedAuth(OriginToken):
    """``OriginToken``, and every answer read through ``_Capped`` (gradio_client reads whatever it is sent)."""

    def __init__(self, token: str | None, url: str, timeout: float):
        super().__init__(token, url, hf_header=True)
        self._url, self._timeout = url, timeout

    def auth_flow(self, request: httpx.Request):
        request = next(super().auth_flow(request))  # refuses other origins, adds the token
        deadline = None if _UNTIMED in request.url.path else time.monotonic() + self._timeout
        response = yield request
        response.stream = _Capped(response.stream, self._url, MAX_ANSWER_BYTES, deadline)


class GradioTransport:
    """``gradio_client.Client`` (URL or Space id), created on first use and re-created after a failure.

    gradio_client builds every later URL from the app's own ``/config`` (its ``api_prefix``), and would send its
    token header to wherever that points. So it gets no token (``token=False``); ``OriginToken`` adds it to
    requests for the coordinator's origin only and refuses the rest. Every answer is read up to
    ``MAX_ANSWER_BYTES`` within ``timeout`` (``_BoundedAuth``), and connecting (the app's ``/config``) gives up
    after ``timeout`` too, as the http transport does. A Space id is resolved to its host through the Hub first
    (huggingface_hub, which keeps the token to the Hub)."""

    def __init__(self, src: str, *, token: str | None, timeout: float):
        self.src, self._token, self._timeout = src, token, timeout
        self._gc = None
        self._lock = threading.Lock()

    def _client(self):
        with self._lock:
            if self._gc is None:
                url = self.src if self.src.startswith(("http://", "https://")) else self._space_host()
                self._gc = self._connect(url)
            return self._gc

    def _connect(self, url: str):
        """A ``gradio_client.Client`` for ``url``, made within ``timeout`` (headers that trickle in are not bounded
        by httpx's per-read timeout); one finished after that is closed."""
        from gradio_client import Client

        auth = _BoundedAuth(self._token, url, self._timeout)
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hubgrpo-gradio-connect")
        future = pool.submit(
            Client,
            url,
            token=False,
            verbose=False,
            analytics_enabled=False,
            download_files=False,
            httpx_kwargs={"timeout": self._timeout, "auth": auth},
        )
        pool.shutdown(wait=False)
        try:
            return future.result(timeout=self._timeout)
        except FutureTimeout:
            future.add_done_callback(lambda f: f.exception() is None and f.result().close())
            raise Unavailable(f"the app at {url} did not answer its config within {self._timeout:g} s") from None

    def _space_host(self) -> str:
        from huggingface_hub import space_info

        host = space_info(self.src, token=self._token or False).host
        if not host or not str(host).startswith("https://"):
            raise Unavailable(f"the Space {self.src} has no running app (host {str(host)[:80]!r})")
        return str(host)

    def call(self, name: str, args: list) -> Any:
        """Submit a job to endpoint ``name`` and wait for its answer (at most ``timeout`` seconds)."""
        from gradio_client.exceptions import AppError
        from gradio_client.utils import QueueError, TooManyRequestsError

        try:
            return self._client().submit(*args, api_name=f"/{name}").result(timeout=self._timeout)
        except (CoordinatorError, Unavailable):  # a request elsewhere, an answer too large or too slow
            self.close()
            raise
        except (QueueError, TooManyRequestsError) as e:
            raise Unavailable(f"{type(e).__name__}: {e}") from None
        except AppError as e:
            raise CoordinatorError(
                f"the app at {self.src} failed on {name!r}: {wire_text(str(e), 300)}",
                code="protocol",
                hint="client and coordinator versions may differ",
            ) from None
        except Exception as e:  # deliberate: gradio_client raises many types; classify, reconnect next time
            failure = http_failure(e, self.src)
            if isinstance(failure, Unavailable):
                self.close()
            raise failure from None

    def close(self) -> None:
        """Stop gradio_client's heartbeat thread and forget the connection."""
        with self._lock:
            if self._gc is not None:
                self._gc.close()
                self._gc = None
