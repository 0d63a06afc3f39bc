"""Submission inboxes: where workers put their rounds when ``hub.submissions`` names a place outside the run repo.

An inbox is a flat namespace of write-once objects keyed by repo-style paths (``submissions/<base>/<id>/<file>``): no
commits, no history, no head to contend for, so a round costs no commit of the run repo. Two kinds:

- ``FolderInbox``: a local folder (one machine, or a shared filesystem); an object is written to a temp file and
  linked into place, so it appears whole, once. ``hub.submissions: coordinator`` is a folder inbox on the
  coordinator's own disk, filled through its upload route (``hubgrpo.coordinator.inbox.rounds_folder``): no
  worker ever opens it (``open_inbox`` refuses);
- ``S3Inbox``: a bucket/prefix on an S3-compatible store (``hubgrpo.store.s3_bucket``): objects are PUT with
  ``IfNoneMatch="*"``, and ``presign_upload`` hands out URLs that let a worker without credentials write one key,
  at most so many bytes: a presigned POST form whose policy caps the size, on stores that enforce it (checked
  once at start, ``ensure``); elsewhere a presigned write-once PUT, which cannot cap the size (the coordinator
  still refuses an oversized object from its listed size, before reading it).

Reading is for the coordinator, which trusts nothing in an inbox: ``list`` gives sizes before anything is read,
``fetch`` refuses an object that is not exactly the listed size (and never more than ``max_bytes``), a
``FolderInbox`` reads only regular files and never follows a symbolic link.
"""

from __future__ import annotations

import builtins  # `list` is a method name in these classes
import logging
import os
import re
import shutil
import stat
import uuid
from pathlib import Path

from hubgrpo.errors import CommitConflict, ConfigError, NotFound, StoreError
from hubgrpo.store.base import check_path

log = logging.getLogger("hubgrpo.store")
_CHUNK = 1 << 20
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
COORDINATOR = "coordinator"  # hub.submissions: rounds go through the coordinator's upload route to its own disk
_SPECS = "`coordinator`, s3://bucket/prefix, a local folder (/abs/path, ./rel/path, file://path)"


def check_inbox_spec(spec: str) -> str:
    """Refuse a ``hub.submissions`` value that names no inbox: ``coordinator``, ``s3://bucket/prefix`` or a local
    folder written as an absolute path, ``./…``, ``../…``, ``~/…`` or ``file://…``."""
    if spec == COORDINATOR:
        return spec
    scheme = _SCHEME.match(spec)
    if scheme and scheme.group(1).lower() == "s3":
        from hubgrpo.store.s3_bucket import parse_s3_url

        parse_s3_url(spec)
        return spec
    if scheme and scheme.group(1).lower() != "file":
        raise ConfigError(
            f"submissions location {spec!r}: the scheme {scheme.group(1)}:// is not supported",
            hint=f"use {_SPECS}, or leave hub.submissions unset to keep submissions in the run repo",
        )
    if not scheme and not spec.startswith(("/", "./", "../", "~")):
        raise ConfigError(
            f"submissions location {spec!r} is ambiguous",
            hint="write `coordinator` for rounds through the coordinator's upload route, a local "
            "folder as ./name or /abs/path, a bucket as s3://bucket/prefix",
        )
    return spec


def open_inbox(spec: str):
    """The inbox that ``spec`` names (see ``check_inbox_spec``); not ``coordinator``, whose folder only the
    coordinator opens (``hubgrpo.coordinator.inbox.run_inbox``)."""
    check_inbox_spec(spec)
    if spec == COORDINATOR:
        raise ConfigError(
            "this run's rounds go through its coordinator (hub.submissions: coordinator); no worker writes its inbox",
            hint="upload rounds with `hubgrpo worker --upload-via coordinator` (the default for such a run)",
        )
    if spec.startswith("s3://"):
        return S3Inbox(spec)
    return FolderInbox(spec[len("file://") :] if spec.startswith("file://") else spec)


class FolderInbox:
    """Write-once objects in a local folder."""

    can_presign = False

    def __init__(self, root: str | Path):
        self.root = Path(root).expanduser().absolute()
        self.location = str(self.root)

    def __repr__(self) -> str:
        return f"FolderInbox({self.location!r})"

    def put(self, rel: str, src: bytes | Path) -> None:
        """Write ``rel`` once; an object already there is left as it is (a retried put)."""
        dest = self.root / check_path(rel)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.parent / f".tmp-{os.getpid()}-{uuid.uuid4().hex}"
        try:
            if isinstance(src, (bytes, bytearray, memoryview)):
                tmp.write_bytes(bytes(src))
            else:
                shutil.copyfile(src, tmp)
            os.link(tmp, dest)  # fails if it exists: write-once
        except FileExistsError:
            pass
        finally:
            tmp.unlink(missing_ok=True)

    def list(self, rel_prefix: str) -> list[tuple[str, int]]:
        """(path, size) of the regular files under folder ``rel_prefix`` (links and other oddities are skipped)."""
        return [(path, size) for path, size, _ in self.entries(rel_prefix)]

    def entries(self, rel_prefix: str) -> builtins.list[tuple[str, int, str]]:
        """(path, size, version) of the regular files under folder ``rel_prefix``; the version (inode and
        modification time) changes when a file is replaced, as an S3 etag does."""
        base = self.root / check_path(rel_prefix.rstrip("/"))
        out = []
        for folder, dirs, files in os.walk(base):
            for name in files:
                path = Path(folder) / name
                st = os.lstat(path)
                if stat.S_ISREG(st.st_mode) and not name.startswith(".tmp-"):
                    out.append((path.relative_to(self.root).as_posix(), st.st_size, f"{st.st_ino}-{st.st_mtime_ns}"))
        return sorted(out)

    def fetch(self, rel: str, dest: Path, *, size: int, max_bytes: int) -> None:
        """Copy ``rel`` into ``dest`` if it is a regular file of exactly ``size`` ≤ ``max_bytes`` bytes."""
        _check_size(self.location, rel, size, max_bytes)
        try:
            fd = os.open(self.root / check_path(rel), os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except FileNotFoundError:
            raise NotFound(f"{self.location}/{rel} does not exist") from None
        except OSError as e:  # ELOOP: a symbolic link
            raise StoreError(
                f"{self.location}/{rel} cannot be read as a plain file ({e.strerror})",
                code="symlink",
                hint="submissions are plain files",
            ) from None
        with os.fdopen(fd, "rb") as src:
            if not stat.S_ISREG(os.fstat(src.fileno()).st_mode):
                raise StoreError(f"{self.location}/{rel} is not a plain file", code="symlink")
            data = src.read(size + 1)
        if len(data) != size:
            raise StoreError(
                f"{self.location}/{rel} changed while it was read",
                code="corrupt",
                hint="submissions are written once; it will be read again at the next scan",
            )
        dest.write_bytes(data)

    def delete(self, rels: builtins.list[str]) -> None:
        """Delete these files (a link is removed, never followed), then the folders they leave empty."""
        parents: set[Path] = set()
        for rel in rels:
            path = self.root / check_path(rel)
            path.unlink(missing_ok=True)
            parents.update(p for p in path.parents if self.root in p.parents)
        for folder in sorted(parents, key=lambda p: len(p.parts), reverse=True):
            try:
                folder.rmdir()
            except OSError:  # not empty, or already gone
                pass

    def read(self, rel: str, *, max_bytes: int) -> bytes:
        listed = dict(self.list(rel.rsplit("/", 1)[0])).get(rel)
        if listed is None:
            raise NotFound(f"{self.location}/{rel} does not exist")
        tmp = self.root / f".read-{uuid.uuid4().hex}"
        try:
            self.fetch(rel, tmp, size=listed, max_bytes=max_bytes)
            return tmp.read_bytes()
        finally:
            tmp.unlink(missing_ok=True)


class S3Inbox:
    """Write-once objects under ``s3://bucket/prefix`` (boto3; credentials the usual way)."""

    can_presign = True

    def __init__(self, url: str, *, endpoint_url: str | None = None, timeout_s: float = 30.0):
        from hubgrpo.store.s3_bucket import S3Bucket, parse_s3_url

        bucket, prefix = parse_s3_url(url)
        self.objects = S3Bucket(bucket, prefix, endpoint_url=endpoint_url, timeout_s=timeout_s)
        self.location = self.objects.location
        self.bounded = False  # the store enforces a POST policy's size range (``ensure`` checks)

    def __repr__(self) -> str:
        return f"S3Inbox({self.location!r})"

    def put(self, rel: str, src: bytes | Path) -> None:
        try:
            self.objects.put(check_path(rel), src, if_none_match=True)
        except CommitConflict:
            pass  # already there: a retried put (write-once)

    def list(self, rel_prefix: str) -> list[tuple[str, int]]:
        return self.objects.list(check_path(rel_prefix.rstrip("/")) + "/")

    def entries(self, rel_prefix: str) -> builtins.list[tuple[str, int, str]]:
        """(path, size, etag) of the objects under folder ``rel_prefix``."""
        return [e[:3] for e in self.objects.entries(check_path(rel_prefix.rstrip("/")) + "/")]

    def fetch(self, rel: str, dest: Path, *, size: int, max_bytes: int) -> None:
        self.objects.download(check_path(rel), dest, size=size, max_bytes=max_bytes)

    def read(self, rel: str, *, max_bytes: int) -> bytes:
        return self.objects.get(check_path(rel), max_bytes=max_bytes)[0]

    def delete(self, rels: builtins.list[str]) -> None:
        self.objects.delete([check_path(r) for r in rels])

    def presign_upload(self, rel: str, max_bytes: int, expires_s: int) -> str:
        """A URL that lets its holder write ``rel``: a POST form capped at ``max_bytes`` where the store enforces
        it (``bounded``), else a write-once PUT (``S3Bucket.presign_post`` / ``presign_put``)."""
        rel = check_path(rel)
        if self.bounded:
            return self.objects.presign_post(rel, max_bytes, expires_s)
        return self.objects.presign_put(rel, expires_s)

    def ensure(self) -> None:
        """At the coordinator's start: create the bucket when it does not exist, refuse a store that ignores
        conditional writes (``S3Bucket.check_conditional_writes``), and find out whether upload URLs can cap
        sizes (``S3Bucket.bounds_posts``)."""
        if not self.objects.bucket_exists():
            self.objects.create_bucket()
        self.objects.check_conditional_writes()
        self.bounded = self.objects.bounds_posts()
        if not self.bounded:
            log.warning(
                "%s does not enforce a POST policy's content-length-range: workers get presigned PUT URLs, "
                "which cannot cap what they upload (oversized objects are refused from their listed size, "
                "never read, and deleted with their round)",
                self.location,
            )


def _check_size(where: str, rel: str, size: int, max_bytes: int) -> None:
    if size > max_bytes:
        raise StoreError(
            f"{where}/{rel} is {size:,} bytes, more than the {max_bytes:,} allowed",
            code="too_large",
            hint="submit only the LoRA adapter at the run's rank",
        )
