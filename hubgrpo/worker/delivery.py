"""Putting a round where the run wants it: a commit of the run repo (``commit_round``), or the inbox
``hub.submissions`` names (``deliver``), which a worker writes only when it may (``check_inbox_is_ours``).

Into an inbox the four files go in the order the coordinator relies on (the adapter, its config, the rollouts, then
``submission.json``: a round is present once its record is) and the worker then submits
``sha256:<hex of submission.json>``:

- with presigned URLs in the lease (an S3 inbox): plain HTTP — no boto3 and no bucket credentials on the worker. A
  URL with a fragment is a presigned POST form (``S3Bucket.presign_post``: the form's action ``#`` its fields),
  whose policy caps the file's size: the fields and the file are POSTed; a 400 ``EntityTooLarge`` is a round
  larger than the run allows. Any other URL is a write-once PUT: a 412 means the object is already there (our
  own earlier try whose answer was lost). 5xx, 429 and dropped connections are retried with bounded backoff;
  a 403 (the URL expired) is raised as ``AuthError`` for the loop to fetch fresh URLs with a heartbeat. The URLs
  come from the coordinator, so they are treated like its answers (``hubgrpo.worker.bounded_http``): http(s)
  only, never an Authorization header, no redirect followed, each upload bounded in time, at most
  ``MAX_ERROR_BYTES`` of an answer read (a success's body is not read at all);
- without (a local folder, or an S3 inbox the coordinator cannot sign for): the inbox itself, with this machine's
  access to it (``hubgrpo.store.inboxes``).

``hub.submissions: coordinator`` is no inbox a worker writes: its rounds go to the coordinator's ``upload`` route
(``CoordinatorClient.upload``), which ``upload_route`` picks by itself.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import parse_qsl

import httpx

from hubgrpo import layout
from hubgrpo.errors import AuthError, RateLimited, StoreError, StoreUnavailable, wait_seconds, wire_text
from hubgrpo.layout import Lease
from hubgrpo.store.base import Store
from hubgrpo.worker.bounded_http import MIN_BODY_RATE, Deadline, TooLarge, bounded_client, origin, read_capped

log = logging.getLogger("hubgrpo.worker")
FILES = layout.SUBMISSION_FILES
MAX_ERROR_BYTES = 64 << 10  # the most of an upload URL's answer read (for the error message)


def upload_route(spec: str | None, asked: str | None = None) -> str:
    """How a worker hands in its rounds: ``coordinator`` (the ``upload`` route) or ``store`` (a commit of the run
    repo, or the inbox ``spec`` names). ``asked``: what its owner said (``--upload-via``; None: nothing). A run whose
    rounds go through the coordinator (``hub.submissions: coordinator``) takes them no other way."""
    from hubgrpo.errors import ConfigError
    from hubgrpo.store.inboxes import COORDINATOR

    if asked not in (None, "store", "coordinator"):
        raise ConfigError(
            f"--upload-via {wire_text(str(asked), 40)} is not a way to hand in rounds",
            hint="use --upload-via coordinator or --upload-via store (or leave it out)",
        )
    if spec == COORDINATOR:
        if asked == "store":
            raise ConfigError(
                "--upload-via store: this run takes rounds only through its coordinator "
                "(hub.submissions: coordinator), which keeps them off the run repo",
                hint="leave --upload-via out (or pass --upload-via coordinator)",
            )
        return "coordinator"
    return asked or "store"


def check_inbox_is_ours(spec: str | None, store: Store, coordinator: str) -> None:
    """A submissions inbox that is a local folder is this machine's disk: the worker writes there only for a run on
    this machine (its repo a local folder, or its coordinator on loopback). A remote run repo's config is data
    written by others: it never picks a folder here."""
    from hubgrpo.store.local import LocalStore
    from hubgrpo.worker.bounded_http import on_this_machine

    here = "://" in coordinator and on_this_machine(coordinator)
    if spec and not spec.startswith("s3://") and not isinstance(store, LocalStore) and not here:
        from hubgrpo.errors import ConfigError

        raise ConfigError(
            f"the run repo {store.location} names a folder of this machine as its submissions inbox "
            f"({wire_text(spec, 120)}); a worker writes there only for a run on this machine",
            hint="a remote run's rounds go to its repo, an s3:// inbox, or the coordinator "
            "(--upload-via coordinator); ask the run's owner to fix hub.submissions",
        )


def commit_round(
    store: Store, out: Path, lease: Lease, sub_id: str, *, sleep: Callable[[float], None] = time.sleep
) -> str:
    """Push the submission folder ``out`` in one commit of the run repo (no parent: workers write disjoint paths),
    waiting out rate limits and outages; the commit."""
    adds = {layout.submission_path(lease.base_version, sub_id, f): out / f for f in layout.SUBMISSION_FILES}
    msg = f"hubgrpo: submission {sub_id} (base v{lease.base_version})"
    delay = 2.0
    for attempt in range(10):
        try:
            return store.commit(adds, message=msg)
        except RateLimited as e:
            wait = wait_seconds(e.wait_s, 60.0)
            log.warning("store rate-limited; waiting %.0f s", wait)
            sleep(wait)
        except StoreUnavailable as e:
            log.warning("store unavailable (%s); retrying in %.0f s", e.message, delay)
            sleep(delay)
            delay = min(delay * 2, 120.0)
    return store.commit(adds, message=msg)


def deliver(
    spec: str, lease: Lease, folder: Path, *, sleep: Callable[[float], None] = time.sleep, timeout_s: float = 120.0
) -> str:
    """Put the round in ``folder`` into the inbox ``spec`` (through ``lease.uploads`` when it has them); the token
    to submit."""
    if lease.uploads:
        missing = [n for n in FILES if n not in lease.uploads]
        if missing:
            raise StoreError(
                f"the lease has no upload URL for {missing[0]}",
                code="protocol",
                hint="the coordinator speaks another hubgrpo version; upgrade the worker",
            )
        bad = [n for n in FILES if not lease.uploads[n].startswith(("https://", "http://"))]
        if bad:
            raise StoreError(
                f"the lease's upload URL for {bad[0]} is not http(s)",
                code="protocol",
                hint="the coordinator is broken or hostile; the round was not sent",
            )
        deadline = Deadline()
        with bounded_client(timeout=timeout_s, deadline=deadline) as http:  # no auth, no redirects, no token
            for name in FILES:
                _put(http, deadline, lease.uploads[name], folder / name, name, sleep, timeout_s)
    else:
        from hubgrpo.store.inboxes import open_inbox

        inbox = open_inbox(spec)
        sub_id = layout.submission_id(lease.worker, lease.lease_id)
        for name in FILES:
            inbox.put(layout.submission_path(lease.base_version, sub_id, name), folder / name)
    return layout.inbox_token((folder / layout.SUBMISSION_FILE).read_bytes())


def _put(
    http: httpx.Client,
    deadline: Deadline,
    url: str,
    path: Path,
    name: str,
    sleep: Callable[[float], None],
    timeout_s: float,
    tries: int = 6,
) -> None:
    """One presigned upload (a POST form, or a PUT with ``If-None-Match: *`` in its signature), retried while the
    store is busy."""
    data = path.read_bytes()
    last = ""
    for attempt in range(tries):
        try:
            with deadline.within(timeout_s + len(data) / MIN_BODY_RATE):
                status, text = _send(http, url, name, data)
        except httpx.HTTPError as e:  # dropped, refused, timed out: the same upload again is safe
            last = f"{type(e).__name__}: {e}"
        else:
            if status in (200, 201, 204, 412):  # 412: already written by our earlier try
                return
            if status == 400 and "EntityTooLarge" in text:
                raise StoreError(
                    f"{name} is {len(data):,} bytes, larger than the run allows (the bucket refused it)",
                    code="too_large",
                    hint="submit only the LoRA adapter at the run's rank",
                )
            if status in (401, 403):
                raise AuthError(
                    f"the upload URL for {name} was refused ({status})",
                    hint="it may have expired; a heartbeat brings fresh ones",
                )
            if status < 500 and status not in (408, 409, 429):
                raise StoreError(
                    f"uploading {name} to {origin(url)} failed: HTTP {status}: {text}",
                    hint="the bucket refused the object (a redirect is never followed); see the message",
                )
            last = f"HTTP {status}"
        if attempt + 1 < tries:
            sleep(min(30.0, 0.5 * 2**attempt) * random.uniform(0.5, 1.0))
    raise StoreUnavailable(
        f"uploading {name} failed after {tries} tries ({last})",
        hint="check the network to the bucket; the round is kept for the next try",
    )


def _send(http: httpx.Client, url: str, name: str, data: bytes) -> tuple[int, str]:
    """(status, the start of an error answer's text) of one upload: a success's body is never read."""
    action, _, form = url.partition("#")
    if form:  # a presigned POST form: the same POST again writes the same bytes
        request = http.build_request("POST", action, data=dict(parse_qsl(form)), files={"file": (name, data)})
    else:
        request = http.build_request("PUT", url, content=data, headers={"If-None-Match": "*"})
    resp = http.send(request, stream=True)
    try:
        if resp.status_code in (200, 201, 204, 412):
            return resp.status_code, ""
        try:
            text = read_capped(resp, MAX_ERROR_BYTES).decode(errors="replace")
        except TooLarge:
            text = f"(an answer of more than {MAX_ERROR_BYTES >> 10} KiB, not read)"
        return resp.status_code, wire_text(text, 200)
    finally:
        resp.close()
