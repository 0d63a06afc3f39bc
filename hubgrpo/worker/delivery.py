"""Putting a round where the run wants it, when ``hub.submissions`` names a box instead of the run repo.

The four files go in the order the coordinator relies on (the adapter, its config, the rollouts, then
``submission.json``: a round is present once its record is) and the worker then submits
``sha256:<hex of submission.json>``:

- with presigned URLs in the lease (an S3 box): plain HTTP — no boto3 and no bucket credentials on the worker. A
  URL with a fragment is a presigned POST form (``S3Bucket.presign_post``: the form's action ``#`` its fields),
  whose policy caps the file's size: the fields and the file are POSTed; a 400 ``EntityTooLarge`` is a round
  larger than the run allows. Any other URL is a write-once PUT: a 412 means the object is already there (our
  own earlier try whose answer was lost). 5xx, 429 and dropped connections are retried with bounded backoff;
  a 403 (the URL expired) is raised as ``AuthError`` for the loop to fetch fresh URLs with a heartbeat;
- without (a local folder, or an S3 box the coordinator cannot sign for): the box itself, with this machine's
  access to it (``hubgrpo.store.boxes``).
"""

from __future__ import annotations

import logging
import random
import time
from pathlib import Path
from typing import Callable
from urllib.parse import parse_qsl

import httpx

from hubgrpo import layout
from hubgrpo.errors import AuthError, StoreError, StoreUnavailable
from hubgrpo.layout import Lease

log = logging.getLogger("hubgrpo.worker")
FILES = layout.SUBMISSION_FILES


def deliver(spec: str, lease: Lease, folder: Path, *, sleep: Callable[[float], None] = time.sleep,
            timeout_s: float = 120.0) -> str:
    """Put the round in ``folder`` into the box ``spec`` (through ``lease.uploads`` when it has them); the token
    to submit."""
    if lease.uploads:
        missing = [n for n in FILES if n not in lease.uploads]
        if missing:
            raise StoreError(f"the lease has no upload URL for {missing[0]}", code="protocol",
                             hint="the coordinator speaks another hubgrpo version; upgrade the worker")
        with httpx.Client(timeout=timeout_s, follow_redirects=False) as http:
            for name in FILES:
                _put(http, lease.uploads[name], folder / name, name, sleep)
    else:
        from hubgrpo.store.boxes import open_box

        box = open_box(spec)
        sub_id = layout.submission_id(lease.worker, lease.lease_id)
        for name in FILES:
            box.put(layout.submission_path(lease.base_version, sub_id, name), folder / name)
    return layout.box_token((folder / layout.SUBMISSION_FILE).read_bytes())


def _put(http: httpx.Client, url: str, path: Path, name: str, sleep: Callable[[float], None],
         tries: int = 6) -> None:
    """One presigned upload (a POST form, or a PUT with ``If-None-Match: *`` in its signature), retried while the
    store is busy."""
    data = path.read_bytes()
    action, _, form = url.partition("#")
    last = ""
    for attempt in range(tries):
        try:
            if form:  # a presigned POST form: the same POST again writes the same bytes
                resp = http.post(action, data=dict(parse_qsl(form)), files={"file": (name, data)})
            else:
                resp = http.put(url, content=data, headers={"If-None-Match": "*"})
        except httpx.HTTPError as e:  # dropped, refused, timed out: the same upload again is safe
            last = f"{type(e).__name__}: {e}"
        else:
            if resp.status_code in (200, 201, 204, 412):  # 412: already written by our earlier try
                return
            if resp.status_code == 400 and "EntityTooLarge" in resp.text:
                raise StoreError(f"{name} is {len(data):,} bytes, larger than the run allows (the bucket refused "
                                 "it)", code="too_large", hint="submit only the LoRA adapter at the run's rank")
            if resp.status_code in (401, 403):
                raise AuthError(f"the upload URL for {name} was refused ({resp.status_code})",
                                hint="it may have expired; a heartbeat brings fresh ones")
            if resp.status_code < 500 and resp.status_code not in (408, 409, 429):
                raise StoreError(f"uploading {name} failed: HTTP {resp.status_code}: {resp.text[:200]}",
                                 hint="the bucket refused the object; see the message")
            last = f"HTTP {resp.status_code}"
        if attempt + 1 < tries:
            sleep(min(30.0, 0.5 * 2 ** attempt) * random.uniform(0.5, 1.0))
    raise StoreUnavailable(f"uploading {name} failed after {tries} tries ({last})",
                           hint="check the network to the bucket; the round is kept for the next try")
