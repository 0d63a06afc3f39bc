"""Hub HTTP answers mapped onto ``hubgrpo.errors`` (``map_error``): the one place that reads the Hub's status codes,
for the run repo (``hubgrpo.store.hub``) and the other Hub calls (deploying a Space, launching jobs).

- 412 → ``CommitConflict``; 409 on a commit → ``RepoBusy`` (or what ``on_409`` says); 429 → ``RateLimited`` with the
  server's wait; 5xx, 408, timeouts, dropped connections → ``StoreUnavailable``; 401/403 → ``AuthError``; missing
  repo / revision / file → ``NotFound``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import cast

from huggingface_hub.errors import (
    EntryNotFoundError,
    FileMetadataError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from hubgrpo.errors import (
    AuthError,
    CommitConflict,
    NotFound,
    RateLimited,
    RepoBusy,
    StoreError,
    StoreUnavailable,
)

try:  # huggingface_hub 2.x talks through httpx2, 1.x through httpx
    from httpx2 import TransportError
except ImportError:  # pragma: no cover
    from httpx import TransportError  # type: ignore[assignment]  # httpx's class of the same role (no httpx2)


HUB_ERRORS = (HfHubHTTPError, EntryNotFoundError, TransportError, OfflineModeIsEnabled, FileMetadataError)
_RATELIMIT_T = re.compile(r"""\bt\s*=\s*(\d+)""")
_HINT_RETRY = "the operation is safe to retry; check your network and https://status.huggingface.co"


def _server_wait(exc: HfHubHTTPError, default: float = 60.0) -> float:
    """The wait a 429 asks for: ``RateLimit: "api";r=0;t=N``, else a numeric ``Retry-After``, else ``default``."""
    headers = exc.response.headers
    m = _RATELIMIT_T.search(headers.get("RateLimit") or "")
    if m:
        return float(m.group(1))
    retry_after = (headers.get("Retry-After") or "").strip()
    return float(retry_after) if retry_after.isdigit() else default


def map_error(exc: Exception, *, what: str, repo: str, on_409: Callable[[str], StoreError] | None = None) -> StoreError:
    """Turn a huggingface_hub / transport error into the hubgrpo error tree, with a message and a hint."""
    where = f"{what} on {repo}"
    if isinstance(exc, LocalEntryNotFoundError):  # an EntryNotFoundError, but really "could not reach the Hub"
        return StoreUnavailable(
            f"{where}: the Hub could not be reached and the file is not cached ({exc.__cause__})", hint=_HINT_RETRY
        )
    if isinstance(exc, RevisionNotFoundError):
        return NotFound(f"{where}: revision not found", hint="use a commit sha from history(), a tag or the head")
    if isinstance(exc, EntryNotFoundError):
        return NotFound(f"{where}: no such file or folder", hint="list_files() shows what exists at that revision")
    if isinstance(exc, RepositoryNotFoundError):
        return NotFound(
            f"{where}: the repo does not exist or this token cannot see it",
            hint="check the repo id and HF_TOKEN, or create the run repo first (`hubgrpo init`)",
        )
    if isinstance(exc, OfflineModeIsEnabled):
        return StoreUnavailable(f"{where}: HF_HUB_OFFLINE is set", hint="unset HF_HUB_OFFLINE to reach the Hub")
    if isinstance(exc, FileMetadataError):
        return StoreError(
            f"{where}: the endpoint did not answer like a Hub ({exc})", hint="check HF_ENDPOINT and proxy settings"
        )
    if isinstance(exc, TransportError):
        return StoreUnavailable(f"{where}: no answer from the Hub ({type(exc).__name__}: {exc})", hint=_HINT_RETRY)
    return _map_status(cast(HfHubHTTPError, exc), where, on_409)  # the rest of HUB_ERRORS: HTTP errors


def _map_status(exc: HfHubHTTPError, where: str, on_409: Callable[[str], StoreError] | None) -> StoreError:
    """The part of ``map_error`` that depends on the HTTP status code."""
    status = exc.response.status_code
    said = (exc.server_message or "").strip().replace("\n", " ")
    detail = f" ({said})" if said else ""
    if status == 401:
        return AuthError(
            f"{where}: the Hub refused the token (401){detail}",
            hint="set HF_TOKEN or run `hf auth login` with a valid token",
        )
    if status == 403:
        return AuthError(
            f"{where}: no permission (403){detail}",
            hint="use a token with write access to this namespace; workers without write access "
            "upload through the coordinator",
        )
    if status == 409:
        if on_409 is not None:
            return on_409(where)
        return RepoBusy(
            f"{where}: another commit to this repo is in progress (409)",
            hint="retry in a few seconds; the branch head has not moved",
        )
    if status == 412:
        return CommitConflict(
            f"{where}: the branch head moved since the parent revision was read (412)",
            hint="re-read the head, re-apply the change on top of it and commit again",
        )
    if status == 429:
        wait = _server_wait(exc)
        return RateLimited(
            f"{where}: rate-limited by the Hub (429), retry in {wait:.0f}s{detail}",
            wait_s=wait,
            hint="commits have an hourly quota per repo: batch changes into fewer commits",
        )
    if status == 408 or status >= 500:
        return StoreUnavailable(f"{where}: the Hub answered {status}{detail}", hint=_HINT_RETRY)
    return StoreError(f"{where}: the Hub answered {status}{detail}", hint="see the server message above")


def exists_error(what: str) -> Callable[[str], StoreError]:
    return lambda where: StoreError(
        f"{where}: {what} already exists", code="exists", hint="pass exist_ok=True to accept the existing one"
    )
