"""The gradio_client transport of ``CoordinatorClient`` (``transport="gradio"``, the default for Space ids)."""

from __future__ import annotations

import threading
from typing import Any

from hubgrpo.errors import CoordinatorError, wire_text
from hubgrpo.worker.bounded_http import OriginToken, Unavailable, http_failure


class GradioTransport:
    """``gradio_client.Client`` (URL or Space id), created on first use and re-created after a failure.

    gradio_client builds every later URL from the app's own ``/config`` (its ``api_prefix``), and would send its
    token header to wherever that points. So it gets no token (``token=False``); ``OriginToken`` adds it to
    requests for the coordinator's origin only and refuses the rest. A Space id is resolved to its host through
    the Hub first (huggingface_hub, which keeps the token to the Hub)."""

    def __init__(self, src: str, *, token: str | None, timeout: float):
        self.src, self._token, self._timeout = src, token, timeout
        self._gc = None
        self._lock = threading.Lock()

    def _client(self):
        with self._lock:
            if self._gc is None:
                from gradio_client import Client

                url = self.src if self.src.startswith(("http://", "https://")) else self._space_host()
                auth = OriginToken(self._token, url, hf_header=True)
                self._gc = Client(url, token=False, verbose=False, analytics_enabled=False, download_files=False,
                                  httpx_kwargs={"timeout": self._timeout, "auth": auth})
            return self._gc

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
        except CoordinatorError:  # OriginToken refused a request elsewhere
            self.close()
            raise
        except (QueueError, TooManyRequestsError) as e:
            raise Unavailable(f"{type(e).__name__}: {e}") from None
        except AppError as e:
            raise CoordinatorError(f"the app at {self.src} failed on {name!r}: {wire_text(str(e), 300)}",
                                   code="protocol", hint="client and coordinator versions may differ") from None
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
