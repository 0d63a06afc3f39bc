"""A version's adapter from the coordinator: ``GET /hubgrpo/api/adapter/<version>/<adapter id>/<file>``.

Versions between checkpoints exist only at the coordinator (``hubgrpo.coordinator.versions``), so a worker gets
the adapter it leased, and each newer one a rebasing round moves onto, from there — no read of the run repo. The
answer is hostile until checked (``bounded_http``): no redirect, the token only to the coordinator's own origin,
each file at most ``max_bytes`` (the run's ``merge.max_submission_mb``: what a submission of it may weigh), the
whole transfer within its deadline, and the two files must hash to the adapter id the lease names
(``layout.adapter_id``), else nothing is kept (``bad_adapter``). A folder appears by an atomic rename: a cached
``<cache>/<adapter id>/`` is always complete.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import httpx

from hubgrpo import layout
from hubgrpo.errors import CoordinatorError, wire_text
from hubgrpo.worker.bounded_http import (
    MIN_BODY_RATE,
    Deadline,
    TooLarge,
    Unavailable,
    bounded_client,
    http_failure,
    redirect_error,
)

PATH = "/hubgrpo/api/adapter"
FILES = (layout.ADAPTER_WEIGHTS, layout.ADAPTER_CONFIG)


class Downloader:
    """Downloads of version adapters from one coordinator origin (thread-safe, one connection pool)."""

    def __init__(self, url: str, auth: httpx.Auth, *, timeout: float):
        self.url, self._auth, self._timeout = url.rstrip("/"), auth, float(timeout)
        self._deadline = Deadline()
        self._http: httpx.Client | None = None

    def _client(self) -> httpx.Client:
        if self._http is None:
            self._http = bounded_client(
                base_url=self.url, auth=self._auth, timeout=self._timeout, deadline=self._deadline
            )
        return self._http

    def fetch(self, version: int, adapter_id: str, cache: Path, max_bytes: int) -> Path:
        """``<cache>/<adapter_id>/`` with the version's two files, downloaded unless already there."""
        layout.check_commit_id(adapter_id, "adapter id")
        dest = Path(cache) / adapter_id
        if dest.is_dir():
            os.utime(dest)
            return dest
        tmp = dest.with_name(f".{adapter_id}.tmp-{uuid.uuid4().hex[:8]}")
        tmp.mkdir(parents=True, exist_ok=True)
        try:
            for name in FILES:
                self._get(f"{PATH}/{int(version)}/{adapter_id}/{name}", tmp / name, max_bytes)
            got = layout.adapter_id((tmp / FILES[0]).read_bytes(), (tmp / FILES[1]).read_bytes())
            if got != adapter_id:
                raise CoordinatorError(
                    f"the coordinator at {self.url} served version {version} with adapter id "
                    f"{got}, not the {adapter_id} it leased",
                    code="bad_adapter",
                    hint="the coordinator is broken or hostile; ask the run's owner",
                )
            try:
                tmp.rename(dest)
            except OSError:  # another thread of this worker got it first: the same bytes
                pass
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return dest

    def _get(self, path: str, out: Path, limit: int) -> None:
        try:
            with self._deadline.within(self._timeout + limit / MIN_BODY_RATE):
                with self._client().stream("GET", path) as resp:
                    self._check(resp, path, limit)
                    total = 0
                    with open(out, "wb") as f:
                        for chunk in resp.iter_raw():
                            self._deadline.left(None, httpx.ReadTimeout)
                            total += len(chunk)
                            if total > limit:
                                raise TooLarge(limit)
                            f.write(chunk)
        except TooLarge:
            raise CoordinatorError(
                f"the coordinator at {self.url} sent more than {limit:,} bytes for {path}, more "
                "than an adapter of this run can weigh",
                code="too_large",
                hint="the coordinator is broken or hostile",
            ) from None
        except httpx.HTTPError as e:
            raise http_failure(e, self.url) from None

    def _check(self, resp: httpx.Response, path: str, limit: int) -> None:
        status = resp.status_code
        if 300 <= status < 400:
            raise redirect_error(self.url, status, resp.headers.get("location"))
        if status >= 500 or status in (408, 429):
            raise Unavailable(f"HTTP {status}")
        if status != 200:
            text = next(resp.iter_raw(), b"")[:300].decode(errors="replace")  # a hostile body is never read whole
            code = {401: "auth", 403: "auth", 404: "not_found"}.get(status, "protocol")
            raise CoordinatorError(
                f"the coordinator at {self.url} answered HTTP {status} for {path}: {wire_text(text, 200)}",
                code=code,
                hint="lease again (the coordinator restarted or the version is too old)"
                if status == 404
                else "check the token and the coordinator's version",
            )
        encoding = resp.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            raise CoordinatorError(
                f"the coordinator at {self.url} sent {path} {wire_text(encoding, 40)}-encoded",
                code="protocol",
                hint="the adapter route answers identity-encoded files",
            )
        declared = resp.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise TooLarge(limit)

    def close(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None
