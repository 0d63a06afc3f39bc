"""The files of a local run repo under ``<root>/.hubgrpo/``: content-addressed objects, atomic writes, one lock.

An object is a read-only file named by the sha256 of its bytes (``objects/ab/ab12…``), written once. Every write
goes to ``tmp/`` first and is renamed into place (same filesystem), flushed to disk first when ``fsync`` is on.
``_locked`` is an exclusive ``flock`` on ``lock``, one file descriptor per call, so threads exclude each other as
processes do, and a process that dies releases it. POSIX only (``fcntl``).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

from hubgrpo.errors import StoreError

_CHUNK = 1 << 20


class LocalFiles:
    """Objects, atomic writes and the lock of the repo whose metadata folder is ``meta`` (``LocalStore`` inherits
    it)."""

    meta: Path
    fsync: bool

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Exclusive lock for read-check-write of HEAD and tags. One fd per call, so threads exclude each other too."""
        fd = os.open(self.meta / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock (also released by the kernel if the process dies)

    def _object(self, digest: str) -> Path:
        return self.meta / "objects" / digest[:2] / digest

    def _tmp_name(self) -> Path:
        return self.meta / "tmp" / f"{os.getpid()}-{uuid.uuid4().hex}"

    def _put_object(self, value: bytes | Path) -> str:
        """Store a blob (bytes, or a local file streamed once: hashed while copied); return its sha256."""
        if isinstance(value, (bytes, bytearray, memoryview)):
            data = bytes(value)
            digest = hashlib.sha256(data).hexdigest()
            if not self._object(digest).is_file():
                self._atomic_write(self._object(digest), data, mode=0o444)
            return digest
        if not isinstance(value, os.PathLike):
            raise StoreError(
                f"commit values must be bytes or a Path, not {type(value).__name__}",
                hint="wrap file names in pathlib.Path; encode text with .encode()",
            )
        tmp, h = self._tmp_name(), hashlib.sha256()
        try:
            with open(value, "rb") as src, open(tmp, "wb") as dst:
                for chunk in iter(lambda: src.read(_CHUNK), b""):
                    h.update(chunk)
                    dst.write(chunk)
                self._flush(dst)
        except FileNotFoundError as e:
            tmp.unlink(missing_ok=True)
            raise StoreError(f"cannot upload {value}: no such local file") from e
        digest = h.hexdigest()
        self._install(tmp, self._object(digest), mode=0o444)
        return digest

    def _atomic_write(self, dest: Path, data: bytes, mode: int | None = None) -> None:
        tmp = self._tmp_name()
        with open(tmp, "wb") as f:
            f.write(data)
            self._flush(f)
        self._install(tmp, dest, mode)

    def _install(self, tmp: Path, dest: Path, mode: int | None) -> None:
        if mode is not None:
            os.chmod(tmp, mode)
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, dest)

    def _flush(self, f) -> None:
        if self.fsync:
            f.flush()
            os.fsync(f.fileno())
