"""The blobs of an S3 run repo (``blobs/<sha256>``): file contents, content-addressed, uploaded unless the bucket
has them, and downloaded once into a local cache, checked against their size and sha256."""

from __future__ import annotations

import hashlib
import os
import uuid
from pathlib import Path

from hubgrpo.errors import StoreError
from hubgrpo.store.s3_bucket import S3Bucket

_SMALL = 1 << 20  # blobs below this are PUT without asking first whether they exist
_CHUNK = 1 << 20


class Blobs:
    """The blobs under ``objects`` (the repo's ``.hubgrpo/`` prefix); verified local copies in ``cache_dir``."""

    def __init__(self, objects: S3Bucket, cache_dir: Path, location: str):
        self.objects, self.cache_dir, self.location = objects, cache_dir, location

    def put(self, value: bytes | Path) -> tuple[str, int]:
        """Upload one file's content unless the bucket has it; (sha256, size)."""
        data: bytes | Path
        if isinstance(value, (bytes, bytearray, memoryview)):
            data = bytes(value)
            digest, size = hashlib.sha256(data).hexdigest(), len(data)
        elif isinstance(value, os.PathLike):
            digest, size = _hash_file(Path(value))
            data = Path(value)
        else:
            raise StoreError(
                f"commit values must be bytes or a Path, not {type(value).__name__}",
                hint="wrap file names in pathlib.Path; encode text with .encode()",
            )
        if size >= _SMALL:  # a large blob the bucket already has (same name and size) is not sent again
            have = self.objects.head(f"blobs/{digest}")
            if have is not None and have[0] == size:
                return digest, size
        self.objects.put(f"blobs/{digest}", data)  # idempotent: the same bytes under the same name
        return digest, size

    def local_file(self, digest: str, size: int) -> Path:
        """The verified local copy of a blob (downloaded once, checked against its size and sha256)."""
        dest = self.cache_dir / "blobs" / digest[:2] / digest
        if dest.is_file() and dest.stat().st_size == size:
            return dest
        tmp = self.tmp()
        try:
            self.objects.download(f"blobs/{digest}", tmp, size=size, max_bytes=size)
            if _hash_file(tmp) != (digest, size):
                raise StoreError(
                    f"{self.location}: blob {digest} does not match its hash",
                    code="corrupt",
                    hint="the bucket's object was altered; restore it or re-upload the file",
                )
            os.chmod(tmp, 0o444)
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)
        return dest

    def tmp(self) -> Path:
        (self.cache_dir / "tmp").mkdir(parents=True, exist_ok=True)
        return self.cache_dir / "tmp" / f"{os.getpid()}-{uuid.uuid4().hex}"


def _hash_file(path: Path) -> tuple[str, int]:
    h, size = hashlib.sha256(), 0
    try:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(_CHUNK), b""):
                h.update(chunk)
                size += len(chunk)
    except FileNotFoundError:
        raise StoreError(f"cannot upload {path}: no such local file", hint="check the path") from None
    return h.hexdigest(), size
