"""One bucket and key prefix on an S3-compatible object store (AWS S3, MinIO, R2, …), through boto3.

Its client is the only one in hubgrpo; boto3 is loaded and its answers mapped onto ``hubgrpo.errors`` in
``hubgrpo.store.s3_errors``.

botocore's own retries are switched off, so every retry is one this module (or ``S3Store``) chose: a write whose
answer was lost is never repeated blindly. Conditional writes go out with ``retry=False``; the caller checks what
happened. The endpoint comes from ``AWS_ENDPOINT_URL`` (MinIO, R2) and credentials the usual boto3 way
(environment, shared files, instance roles); nothing here ever logs them.
"""

from __future__ import annotations

import builtins  # `list` is a method name in these classes
import itertools
import os
import re
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar
from urllib.parse import parse_qsl, urlencode

from hubgrpo.errors import CommitConflict, ConfigError, NotFound, StoreError, StoreUnavailable
from hubgrpo.store.base import check_path
from hubgrpo.store.retry import retry_delay
from hubgrpo.store.s3_errors import load_boto3, map_s3_error

T = TypeVar("T")
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_CHUNK = 1 << 20


def parse_s3_url(url: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix`` → ``("bucket", "some/prefix/")`` (prefix ``""`` for the bucket's root)."""
    if not isinstance(url, str) or not url.startswith("s3://"):
        raise ConfigError(f"{url!r} is not an s3:// location", hint="write s3://bucket/prefix")
    bucket, _, prefix = url[len("s3://") :].partition("/")
    if not _BUCKET.fullmatch(bucket) or ".." in bucket:
        raise ConfigError(
            f"{url!r}: {bucket!r} is not a valid S3 bucket name",
            hint="bucket names are 3-63 lower-case letters, digits, '.' or '-': s3://my-bucket/run1",
        )
    prefix = prefix.strip("/")
    if prefix:
        try:
            check_path(prefix)
        except StoreError as e:
            raise ConfigError(
                f"{url!r}: the key prefix {prefix!r} is not allowed ({e.message})",
                hint="use a relative prefix such as s3://bucket/runs/run1",
            ) from None
    return bucket, f"{prefix}/" if prefix else ""


class S3Bucket:
    """``bucket`` with every key under ``prefix``; thread-safe (one boto3 client, created on first use)."""

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        timeout_s: float = 30.0,
        max_retries: int = 6,
        retry_base_s: float = 0.25,
        retry_cap_s: float = 8.0,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.bucket, self.prefix = bucket, prefix
        self.endpoint_url = endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        self.timeout_s, self.max_retries = float(timeout_s), int(max_retries)
        self.retry_base_s, self.retry_cap_s, self._sleep = float(retry_base_s), float(retry_cap_s), sleep
        self.location = f"s3://{bucket}/{prefix}".rstrip("/")
        self._client = None
        self._lock = threading.Lock()
        self._errors = load_boto3()[1].exceptions  # fails here, with the install hint, when boto3 is missing

    def __repr__(self) -> str:
        return f"S3Bucket({self.location!r})"

    @property
    def client(self):
        with self._lock:
            if self._client is None:
                boto3, botocore = load_boto3()
                session = boto3.session.Session()
                config = botocore.config.Config(
                    connect_timeout=self.timeout_s,
                    read_timeout=self.timeout_s,
                    signature_version="s3v4",
                    retries={"total_max_attempts": 1, "mode": "standard"},  # every retry is ours (see docstring)
                    s3={"addressing_style": "path" if self.endpoint_url else "auto"},
                    request_checksum_calculation="when_required",
                    response_checksum_validation="when_required",
                )
                self._client = session.client(
                    "s3", endpoint_url=self.endpoint_url, config=config, region_name=session.region_name or "us-east-1"
                )
            return self._client

    def key(self, rel: str) -> str:
        return self.prefix + rel

    def call(self, what: str, fn: Callable[[], T], *, retry: bool = True) -> T:
        """``fn()``, with botocore errors mapped; transient ones retried (bounded) unless ``retry`` is False."""
        for attempt in itertools.count(1):
            try:
                return fn()
            except (self._errors.BotoCoreError, self._errors.ClientError) as exc:
                err = map_s3_error(exc, where=f"{what} on {self.location}")
            except StoreUnavailable as exc:  # raised by ``fn`` itself (a body cut short)
                err = exc
            delay = retry_delay(err, attempt, base_s=self.retry_base_s, cap_s=self.retry_cap_s) if retry else None
            if delay is None or attempt > self.max_retries:
                raise err
            self._sleep(delay)
        raise AssertionError("unreachable")

    # -- objects ---------------------------------------------------------------------------------------------
    def get(self, rel: str, *, max_bytes: int) -> tuple[bytes, str]:
        """(body, etag) of ``rel``; refused without reading when it is larger than ``max_bytes``."""

        def once() -> tuple[bytes, str]:
            resp = self.client.get_object(Bucket=self.bucket, Key=self.key(rel))
            body = resp["Body"]
            try:
                self._check_size(rel, int(resp.get("ContentLength", 0)), max_bytes)
                data = body.read(max_bytes + 1)
            finally:
                body.close()
            self._check_size(rel, len(data), max_bytes)
            return data, resp.get("ETag", "")

        return self.call(f"read {rel}", once)

    def head(self, rel: str) -> tuple[int, str] | None:
        """(size, etag) of ``rel``, or None when there is no such object."""

        def once() -> tuple[int, str] | None:
            resp = self.client.head_object(Bucket=self.bucket, Key=self.key(rel))
            return int(resp.get("ContentLength", 0)), resp.get("ETag", "")

        try:
            return self.call(f"check {rel}", once)
        except NotFound:
            return None

    def put(
        self,
        rel: str,
        body: bytes | Path,
        *,
        if_match: str | None = None,
        if_none_match: bool = False,
        retry: bool = True,
    ) -> str:
        """Write ``rel`` (bytes, or a local file streamed from disk); its new etag. ``if_none_match``: only if
        it does not exist; ``if_match``: only if its etag is still that (412 → ``CommitConflict`` otherwise)."""
        extra = {"IfMatch": if_match} if if_match else {}
        if if_none_match:
            extra["IfNoneMatch"] = "*"

        def once() -> str:
            if isinstance(body, (bytes, bytearray, memoryview)):
                resp = self.client.put_object(Bucket=self.bucket, Key=self.key(rel), Body=bytes(body), **extra)
            else:
                with open(body, "rb") as f:
                    resp = self.client.put_object(Bucket=self.bucket, Key=self.key(rel), Body=f, **extra)
            return resp.get("ETag", "")

        return self.call(f"write {rel}", once, retry=retry)

    def download(self, rel: str, dest: Path, *, size: int, max_bytes: int) -> None:
        """Stream ``rel`` into ``dest`` (a new file); refused when the object is not ``size`` bytes or exceeds
        ``max_bytes`` — checked before the body is read, and again while it streams."""
        self._check_size(rel, size, max_bytes)

        def once() -> None:
            resp = self.client.get_object(Bucket=self.bucket, Key=self.key(rel))
            body, got = resp["Body"], 0
            try:
                if int(resp.get("ContentLength", -1)) != size:
                    raise StoreError(
                        f"{self.location}/{rel} is {resp.get('ContentLength')} bytes, expected {size}",
                        code="corrupt",
                        hint="the object was replaced; it cannot be trusted",
                    )
                with open(dest, "wb") as f:
                    for chunk in iter(lambda: body.read(_CHUNK), b""):
                        got += len(chunk)
                        self._check_size(rel, got, size)
                        f.write(chunk)
            finally:
                body.close()
            if got != size:
                raise StoreUnavailable(
                    f"{self.location}/{rel}: the download stopped at {got} of {size} bytes",
                    hint="retried automatically",
                )

        self.call(f"download {rel}", once)

    def list(self, rel_prefix: str = "", *, max_keys: int = 1_000_000) -> list[tuple[str, int]]:
        """(key relative to the prefix, size) of every object whose key starts with ``rel_prefix``, sorted."""
        return [(key, size) for key, size, _, _ in self.entries(rel_prefix, max_keys=max_keys)]

    def entries(self, rel_prefix: str = "", *, max_keys: int = 1_000_000) -> builtins.list[tuple[str, int, str, float]]:
        """(key relative to the prefix, size, etag, last modified as a Unix time) of every object whose key
        starts with ``rel_prefix``, sorted."""

        def once() -> builtins.list[tuple[str, int, str, float]]:
            out, pages = [], self.client.get_paginator("list_objects_v2")
            for page in pages.paginate(Bucket=self.bucket, Prefix=self.key(rel_prefix)):
                for item in page.get("Contents", []):
                    modified = item.get("LastModified")
                    out.append(
                        (
                            item["Key"][len(self.prefix) :],
                            int(item.get("Size", 0)),
                            str(item.get("ETag", "")),
                            modified.timestamp() if modified is not None else 0.0,
                        )
                    )
                if len(out) > max_keys:
                    raise StoreError(
                        f"{self.location}/{rel_prefix} holds more than {max_keys} objects",
                        hint="use a fresh prefix for the run",
                    )
            return sorted(out)

        return self.call(f"list {rel_prefix or '/'}", once)

    def presign_put(self, rel: str, expires_s: int) -> str:
        """A URL that lets its holder PUT ``rel`` once (``If-None-Match: *`` is signed in) for ``expires_s``
        seconds, with no credentials of its own. Local computation: no request is made."""
        return self.call(
            f"sign an upload URL for {rel}",
            lambda: self.client.generate_presigned_url(
                "put_object",
                Params={"Bucket": self.bucket, "Key": self.key(rel), "IfNoneMatch": "*"},
                ExpiresIn=int(expires_s),
                HttpMethod="PUT",
            ),
            retry=False,
        )

    def delete(self, rels: builtins.list[str]) -> None:
        """Delete these objects (up to 1000 per request); objects already gone are fine."""
        for i in range(0, len(rels), 1000):
            objects = [{"Key": self.key(r)} for r in rels[i : i + 1000]]
            batch = {"Objects": objects, "Quiet": True}
            resp = self.call(
                f"delete {len(objects)} objects",
                lambda: self.client.delete_objects(Bucket=self.bucket, Delete=batch),
            )
            failed = [e for e in resp.get("Errors", []) if e.get("Code") != "NoSuchKey"]
            if failed:
                raise StoreError(
                    f"{self.location}: {len(failed)} objects could not be deleted (first: "
                    f"{failed[0].get('Key')}: {failed[0].get('Code')})",
                    hint="check that the credentials may delete objects (s3:DeleteObject)",
                )

    def check_conditional_writes(self) -> None:
        """Refuse a backend that ignores ``If-None-Match: *``: write a fresh probe object twice with it; the
        second write must answer 412. Without that, every write-once object and the compare-and-swap of a head
        could be overwritten by a second writer or a retry (code ``no_conditional_writes``)."""
        rel = f".hubgrpo-probe/{uuid.uuid4().hex}"
        try:
            try:
                self.put(rel, b"probe 1", if_none_match=True)
            except CommitConflict:
                pass  # our own earlier try landed (a lost answer): the key is fresh
            try:
                self.put(rel, b"probe 2", if_none_match=True)
            except CommitConflict:
                return
        finally:
            try:
                self.delete([rel])
            except StoreError:
                pass  # no delete permission: a 7-byte object stays behind
        raise StoreError(
            f"{self.location}: the object store ignores conditional writes (a second PUT with If-None-Match: * "
            "did not answer 412): without compare-and-swap, two coordinators, a worker and a retry could "
            "overwrite each other's objects",
            code="no_conditional_writes",
            hint="use a store that supports conditional writes: AWS S3, MinIO (2024 or later), Cloudflare R2; or "
            "keep the run repo on the Hub and submissions in the run repo (leave hub.submissions unset)",
        )

    def presign_post(self, rel: str, max_bytes: int, expires_s: int) -> str:
        """A presigned POST form that lets its holder upload ``rel`` of 1 to ``max_bytes`` bytes for ``expires_s``
        seconds (the policy's ``content-length-range``: the store refuses a larger file with 400
        ``EntityTooLarge``), as one URL: the form's action, then ``#`` and its fields, URL-encoded (a fragment
        is never sent: ``hubgrpo.worker.delivery`` posts the fields and the file). Local computation."""
        post = self.call(
            f"sign an upload form for {rel}",
            lambda: self.client.generate_presigned_post(
                self.bucket,
                self.key(rel),
                Conditions=[["content-length-range", 1, int(max_bytes)]],
                ExpiresIn=int(expires_s),
            ),
            retry=False,
        )
        return f"{post['url']}#{urlencode(post['fields'])}"

    def bounds_posts(self) -> bool:
        """Whether the store enforces a POST policy's ``content-length-range``: a 2-byte probe under a 1-byte cap
        must be refused with ``EntityTooLarge`` (moto accepts it; Cloudflare R2 has no POST uploads)."""
        import httpx

        rel = f".hubgrpo-probe/{uuid.uuid4().hex}"
        url, _, fields = self.presign_post(rel, 1, 300).partition("#")
        try:
            resp = httpx.post(
                url,
                data=dict(parse_qsl(fields)),
                files={"file": ("probe", b"12")},
                timeout=self.timeout_s,
                follow_redirects=False,
            )
        except httpx.HTTPError:
            return False
        if resp.status_code < 300:
            try:
                self.delete([rel])
            except StoreError:
                pass
        return resp.status_code == 400 and "EntityTooLarge" in resp.text

    # -- the bucket ------------------------------------------------------------------------------------------
    def bucket_exists(self) -> bool:
        try:
            self.call("check the bucket", lambda: self.client.head_bucket(Bucket=self.bucket))
            return True
        except NotFound:
            return False

    def create_bucket(self) -> None:
        """Create the bucket (in the client's region); an existing bucket of ours is fine."""
        region = self.client.meta.region_name
        kw = {} if region in (None, "us-east-1") else {"CreateBucketConfiguration": {"LocationConstraint": region}}
        try:
            self.call("create the bucket", lambda: self.client.create_bucket(Bucket=self.bucket, **kw))
        except StoreError as e:
            if "BucketAlreadyOwnedByYou" in e.message:
                return
            if "BucketAlreadyExists" in e.message:
                raise StoreError(
                    f"{self.location}: the bucket name is taken by another account",
                    code="exists",
                    hint="pick another bucket name",
                ) from None
            raise

    def _check_size(self, rel: str, size: int, max_bytes: int) -> None:
        if size > max_bytes:
            raise StoreError(
                f"{self.location}/{rel} is {size:,} bytes, more than the {max_bytes:,} allowed",
                code="too_large",
                hint="it was not written by hubgrpo; it is not read",
            )
