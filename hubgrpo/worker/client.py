"""The worker's side of the coordinator API (see ``hubgrpo.space.api`` for the wire format).

``CoordinatorClient`` mirrors the coordinator: ``lease``, ``heartbeat``, ``release``, ``submit`` (polling
``verdict``), ``status``, ``record_eval``, the Space's ``upload``, and ``adapter`` (a version's adapter,
``hubgrpo.worker.downloads``).
Two transports carry the same JSON envelopes:

- ``http``: raw HTTP with one persistent ``httpx.Client`` to the coordinator's plain routes, falling back to
  Gradio's call API (``hubgrpo.worker.http_transport``; ``http_route`` picks where to start).
- ``gradio``: ``gradio_client.Client`` (a URL or a Space id ``user/space``, resolved through the Hub;
  ``hubgrpo.worker.gradio_transport``).

A coordinator is only a URL a participant was given, so its answers are untrusted (``hubgrpo.worker.bounded_http``):
the token travels only as an ``Authorization`` header, only to the coordinator's origin (https or loopback); no
redirect is followed (``redirect``); an answer is read up to a cap (``too_large``); each attempt has an overall
deadline; a lease is checked field by field (``bad_lease``); waits it suggests are capped
(``errors.wait_seconds``). The worker loop stops on ``redirect``, ``too_large`` and ``bad_lease``.

On the plain routes ``submit`` answers ``checking`` at once and the coordinator checks the round in the background;
``CoordinatorClient.submit`` then polls ``verdict`` and returns (or raises) what a synchronous submit would have.

``transport="auto"`` picks ``http`` for http(s) URLs and ``gradio`` for Space ids. Refusals arrive as the typed
errors the coordinator raised (``hubgrpo.errors.from_dict``) and are never retried here; a ``Refused`` with a
wait (codes ``budget``/``rate``) carries ``wait_s`` for the worker loop to honour. Connection failures, timeouts
and 5xx answers are retried with bounded exponential backoff and jitter, then become ``CoordinatorError``
(code ``unreachable``). Nothing connects until the first call, so a client may be made before the app is up.
"""

from __future__ import annotations

import base64
import random
import re
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import httpx
from pydantic import ValidationError

from hubgrpo import errors, layout
from hubgrpo.errors import CoordinatorError, wire_text
from hubgrpo.layout import PROTOCOL_VERSION, Lease
from hubgrpo.worker.bounded_http import OriginToken, Unavailable, token_may_go_to
from hubgrpo.worker.http_transport import HttpTransport
from hubgrpo.worker.json_body import Base64Text
from hubgrpo.worker.lease_bounds import check_renewal

if TYPE_CHECKING:
    from hubgrpo.worker.downloads import Downloader
    from hubgrpo.worker.gradio_transport import GradioTransport

VERDICT_WAIT_S = 1800.0  # longest submit() polls `verdict` for a round the coordinator is still checking
_SPACE_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")


def space_url(space_id: str) -> str:
    """Direct URL of a Space's app: ``user/my_space`` → ``https://user-my-space.hf.space``."""
    return "https://" + re.sub(r"[/_.]", "-", space_id.lower()) + ".hf.space"


def unwrap(answer: Any) -> Any:
    """The ``result`` of an ``{"ok": ...}`` envelope, or raise the typed error it carries."""
    if not isinstance(answer, dict) or "ok" not in answer:
        raise CoordinatorError(
            f"unexpected answer from the coordinator: {str(answer)[:200]}",
            code="protocol",
            hint="client and coordinator versions may differ",
        )
    if answer["ok"]:
        return answer.get("result")
    raise errors.from_dict(answer.get("error"))  # its wait_s bounded: never sleep for ever on a coordinator's word


def _clamped(value: Any, low: float, high: float) -> float:
    """A wait the coordinator suggested, as a number within [low, high] (anything else: low)."""
    try:
        wait = float(value)
    except (TypeError, ValueError):
        return low
    return min(max(wait, low), high) if wait == wait else low


def _lease_dict(lease: Lease | dict) -> dict:
    return lease.model_dump(mode="json") if isinstance(lease, Lease) else dict(lease)


def _as_lease(result: Any) -> Lease:
    """The coordinator's lease, checked like anything a stranger sends (``Lease``: commit ids, names, upload URLs);
    a lease that fails is the error ``bad_lease``, which stops the worker before it writes anything."""
    try:
        return Lease.model_validate(result)
    except ValidationError as e:
        first: Mapping[str, Any] = e.errors()[0] if e.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ())) or "lease"
        raise CoordinatorError(
            f"the coordinator sent a lease the worker refuses: {where}: "
            f"{wire_text(str(first.get('msg', 'invalid')), 300)}",
            code="bad_lease",
            hint="a commit id is 40 hex digits and names are 1-64 of [A-Za-z0-9._-]: this "
            "coordinator is broken or hostile, or speaks another hubgrpo version; check the "
            "URL you were given",
        ) from None


class CoordinatorClient:
    """Talk to a hubgrpo coordinator at an http(s) URL or a Space id (``user/space``).

    ``token`` authenticates to the coordinator (sent only as the HTTP Authorization header, never in a body; it
    is also the credential for a private Space). ``retries`` failed attempts are retried after sleeping
    ``min(max_backoff, backoff·2^i)·U(0.5, 1)`` seconds via ``sleep``; ``timeout`` bounds each attempt. Polls for
    a submitted round's verdict wait with ``poll_sleep``. ``http_transport``: the ``httpx`` transport the http
    transport sends through (default: httpx's own; tests pass ``httpx.MockTransport`` or one that records requests).
    Thread-safe: one client may be shared by a worker's training and heartbeat threads.
    """

    def __init__(
        self,
        url_or_space: str,
        *,
        token: str | None = None,
        timeout: float = 60,
        retries: int = 8,
        sleep: Callable[[float], None] = time.sleep,
        transport: str = "auto",
        backoff: float = 0.5,
        max_backoff: float = 30.0,
        http_route: str = "plain",
        verdict_wait_s: float = VERDICT_WAIT_S,
        poll_sleep: Callable[[float], None] = time.sleep,
        http_transport: httpx.BaseTransport | None = None,
    ):
        is_url = url_or_space.startswith(("http://", "https://"))
        if not is_url and not _SPACE_ID.fullmatch(url_or_space):
            raise CoordinatorError(
                f"{url_or_space!r} is neither an http(s) URL nor a Space id",
                code="config",
                hint="pass e.g. https://host:7860 or user/space",
            )
        if token and is_url and not token_may_go_to(url_or_space):
            raise CoordinatorError(
                f"refusing to send your Hub token to {url_or_space}: plain http is readable on "
                "the way; tokens go only to https URLs or this machine (loopback)",
                code="config",
                hint="use the coordinator's https URL or its Space id (user/space)",
            )
        if transport == "auto":
            transport = "http" if is_url else "gradio"
        if http_transport is not None and transport != "http":
            raise CoordinatorError(
                "an httpx transport needs the http transport", code="config", hint="pass transport='http'"
            )
        if transport not in ("http", "gradio"):
            raise CoordinatorError(
                f"unknown transport {transport!r}", code="config", hint="use 'auto', 'http' or 'gradio'"
            )
        self.target, self.transport_name, self.token, self.timeout = url_or_space, transport, token, timeout
        self._downloader: Downloader | None = None  # made at the first ``adapter`` call
        self.retries, self.backoff, self.max_backoff, self.sleep = int(retries), backoff, max_backoff, sleep
        self.verdict_wait_s, self.poll_sleep = float(verdict_wait_s), poll_sleep  # polls wait for real work
        if transport == "http":
            url = url_or_space if is_url else space_url(url_or_space)
            self._transport: HttpTransport | GradioTransport = HttpTransport(
                url, token=token, timeout=timeout, route=http_route, http_transport=http_transport
            )
        else:
            from hubgrpo.worker.gradio_transport import GradioTransport

            self._transport = GradioTransport(url_or_space, token=token, timeout=timeout)

    def __repr__(self) -> str:  # never shows the token
        return f"CoordinatorClient({self.target!r}, transport={self.transport_name!r})"

    def _delay(self, attempt: int) -> float:
        return min(self.max_backoff, self.backoff * 2**attempt) * random.uniform(0.5, 1.0)

    def _call(
        self, name: str, *args: Any, after_token: list | None = None, send: Callable[[str, list], Any] | None = None
    ) -> Any:
        """Call endpoint ``name`` (then ``after_token``), retrying only while the coordinator is unreachable. The
        token travels only in the Authorization header (``OriginToken``): its argument position stays, empty.
        ``send``: the transport's method that sends the call (default: ``call``)."""
        last = "no attempt made"
        send = send or self._transport.call
        for attempt in range(self.retries + 1):
            try:
                answer = send(name, [*args, None, *(after_token or [])])
            except Unavailable as e:
                last = str(e)
                if attempt < self.retries:
                    self.sleep(self._delay(attempt))
                continue
            return unwrap(answer)
        raise CoordinatorError(
            f"coordinator at {self.target} unreachable after {self.retries + 1} attempts ({name}): {last}",
            code="unreachable",
            hint="check that the coordinator app / Space is running and the URL or Space id is right; "
            "a Space that is starting up can take minutes",
        )

    def lease(self, worker: str, user: str | None = None) -> Lease:
        """Lease a round for ``worker``; raises ``Refused`` (e.g. ``budget`` with ``wait_s``, ``finished``)."""
        return _as_lease(self._call("lease", worker, user, after_token=[PROTOCOL_VERSION]))

    def heartbeat(self, lease: Lease | dict) -> Lease:
        """Extend ``lease``; returns the re-signed lease to use from now on. Raises ``LeaseError``, and
        ``bad_lease`` when the answer is another round (``lease_bounds.check_renewal``)."""
        old = lease if isinstance(lease, Lease) else _as_lease(lease)
        return check_renewal(old, _as_lease(self._call("heartbeat", _lease_dict(lease))))

    def release(self, lease: Lease | dict) -> None:
        """Give ``lease`` back (the worker stops without submitting)."""
        self._call("release", _lease_dict(lease))

    def submit(self, lease: Lease | dict, commit: str) -> dict:
        """Report the commit with this round's submission: ``{"status": "admitted"|"merged"|"duplicate",
        "merge_due": bool, ...}``; raises the refusal. A coordinator that checks rounds in the background answers
        ``checking`` first: then this polls ``verdict`` (at the wait it suggests) until the check is done, for at
        most ``verdict_wait_s`` (then the ``checking`` answer is returned: the round is in the store, and the
        coordinator decides it without the worker)."""
        result = self._dict("submit", self._call("submit", _lease_dict(lease), commit))
        waited, resubmits = 0.0, 0
        while result.get("status") in ("checking", "unknown"):
            if result["status"] == "unknown":  # a restarted coordinator never saw it: submit again
                if resubmits >= 3:
                    return result
                resubmits += 1
                result = self._dict("submit", self._call("submit", _lease_dict(lease), commit))
                continue
            if waited >= self.verdict_wait_s:
                return result
            delay = _clamped(result.get("wait_s"), 0.05, 5.0)
            self.poll_sleep(delay)
            waited += delay
            result = self._dict("verdict", self._call("verdict", _lease_dict(lease)))
        return result

    @staticmethod
    def _dict(name: str, result: Any) -> dict:
        if not isinstance(result, dict):
            raise CoordinatorError(f"the coordinator answered {name} with {str(result)[:100]}", code="protocol")
        return result

    def upload(self, lease: Lease | dict, folder, *, frozen_a: bool = False) -> dict:
        """Send a round's submission folder to the coordinator instead of committing it (no write access needed).

        The coordinator checks it, commits it together with other uploads, submits it, and answers like ``submit``
        (plus ``commit`` and ``batch``). Retrying is safe: a repeated upload joins its batch or answers duplicate.
        Over http the files go as they are (``hubgrpo.upload_body``), over gradio_client in base64. ``frozen_a``
        (a run whose merge freezes lora_A: ffa): the adapter goes without its A factors, which the coordinator
        puts back from the run's adapter (``hubgrpo.merge.frozen_a``).
        """
        from pathlib import Path

        raw = {
            name: (Path(folder) / name).read_bytes()
            for name in layout.SUBMISSION_FILES
            if (Path(folder) / name).is_file()
        }
        if frozen_a and layout.ADAPTER_WEIGHTS in raw:
            from hubgrpo.merge.frozen_a import strip_a

            try:
                raw[layout.ADAPTER_WEIGHTS] = strip_a(raw[layout.ADAPTER_WEIGHTS])
            except ValueError:  # not a file this worker wrote: sent whole, the coordinator says what is wrong
                pass
        if isinstance(self._transport, HttpTransport):
            answer = self._call("upload", _lease_dict(lease), raw, send=self._transport.call_files)
        else:
            answer = self._call("upload", _lease_dict(lease), {k: Base64Text.of(v) for k, v in raw.items()})
        return self._dict("upload", answer)

    def adapter(self, version: int, adapter_id: str, cache, max_bytes: int):
        """The folder ``<cache>/<adapter_id>/`` of ``version``'s adapter, downloaded from the coordinator and
        checked against its id (``hubgrpo.worker.downloads``); retried while the coordinator is unreachable."""
        if self._downloader is None:
            from hubgrpo.worker.downloads import Downloader

            url = self.target if self.target.startswith(("http://", "https://")) else space_url(self.target)
            self._downloader = Downloader(url, OriginToken(self.token, url), timeout=self.timeout)
        downloader = self._downloader
        last = "no attempt made"
        for attempt in range(self.retries + 1):
            try:
                return downloader.fetch(version, adapter_id, cache, max_bytes)
            except Unavailable as e:
                last = str(e)
                if attempt < self.retries:
                    self.sleep(self._delay(attempt))
        raise CoordinatorError(
            f"coordinator at {self.target} unreachable after {self.retries + 1} attempts "
            f"(adapter of version {version}): {last}",
            code="unreachable",
            hint="check that the coordinator app / Space is running",
        )

    def record_eval(self, version: int, reward: float, samples: int) -> dict:
        """Report the held-out reward of ``version`` (``hubgrpo evaluate``): ``{"status": "recorded"|"duplicate"}``."""
        answer = self._call("record_eval", int(version), float(reward), int(samples), after_token=[PROTOCOL_VERSION])
        return self._dict("record_eval", answer)

    def record_verdict(self, submission_id: str, report: dict) -> dict:
        """Report a proof-of-rollouts verdict on an admitted round (``hubgrpo evaluate --verify``): ``{"status":
        "recorded"|"duplicate", "passed", "excluded"}``."""
        answer = self._call("record_verdict", str(submission_id), dict(report), after_token=[PROTOCOL_VERSION])
        return self._dict("record_verdict", answer)

    def round_files(self, submission_id: str, base_version: int, names: tuple[str, ...]) -> dict[str, bytes]:
        """The files ``names`` of a round awaiting its verdict, from the coordinator (``hubgrpo evaluate --verify`` on
        a run whose rounds are in an inbox): exactly those names, each strict base64, or the error ``protocol``."""
        try:
            answer = self._dict(
                "round_files",
                self._call("round_files", str(submission_id), int(base_version), after_token=[PROTOCOL_VERSION]),
            )
        except CoordinatorError as e:
            if e.code != "too_large":
                raise
            raise errors.StoreError(e.message, code="too_large", hint="this round is skipped") from None  # not a stop
        files = answer.get("files")
        if not isinstance(files, dict) or sorted(files) != sorted(names):
            raise CoordinatorError(f"round_files answered other files than {list(names)}", code="protocol")
        try:
            return {n: base64.b64decode(files[n], validate=True) for n in names}
        except (TypeError, ValueError) as e:
            raise CoordinatorError(f"round_files answered a file that is not base64: {e}", code="protocol") from None

    def status(self) -> dict:
        """The run's public status."""
        return self._dict("status", self._call("status"))

    def close(self) -> None:
        """Close connections (the client reconnects if used again)."""
        self._transport.close()
        if self._downloader is not None:
            self._downloader.close()

    def __enter__(self) -> CoordinatorClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
