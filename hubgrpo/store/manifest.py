"""Commit manifests and refs of ``S3Store``: their JSON form, and the checks every one passes when it is read.

A bucket is shared storage that others can write to, so nothing read from it is trusted: a manifest is at most
``MAX_MANIFEST_BYTES``, its id must be the sha1 of its bytes (content-addressed, like its blobs), it has exactly the
keys below with the types below, at most ``MAX_FILES`` files, every path passes ``check_path``, every blob id is a
sha256 and every size an integer in range. A manifest::

    {"format": 1, "parents": ["<sha1>"], "files": {"<path>": ["<sha256>", <size>]}, "message": "...",
     "description": "hubgrpo-commit-id: <uuid4>", "marker": "<uuid4>", "created_at": <unix time>}

A ref (the branch head, a tag) is ``{"commit": "<sha1>"}``.
"""

from __future__ import annotations

import hashlib
import json
import math
import re

from hubgrpo.errors import StoreError
from hubgrpo.store.base import MARKER_PREFIX, SHA1_RE, CommitInfo, check_path

FORMAT = 1
MAX_MANIFEST_BYTES = 64 << 20
MAX_FILES = 200_000
MAX_BLOB_BYTES = 1 << 40
MAX_REF_BYTES = 1 << 10
MAX_TEXT = 1 << 16
SHA256_RE = re.compile(r"[0-9a-f]{64}")
_KEYS = {"format", "parents", "files", "message", "description", "marker", "created_at"}

Tree = dict[str, tuple[str, int]]  # repo path → (blob sha256, size)


def encode(tree: Tree, parent: str | None, message: str, marker: str, created_at: float) -> tuple[str, bytes]:
    """(commit id, manifest bytes) of a new commit; the id is the sha1 of the bytes."""
    rec = {
        "format": FORMAT,
        "parents": [parent] if parent else [],
        "files": {p: [blob, size] for p, (blob, size) in sorted(tree.items())},
        "message": message,
        "description": f"{MARKER_PREFIX}{marker}",
        "marker": marker,
        "created_at": created_at,
    }
    data = json.dumps(rec, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha1(data).hexdigest(), data


def decode(sha: str, data: bytes, *, where: str) -> tuple[CommitInfo, Tree]:
    """Check a manifest read from the bucket (see the module docstring); its ``CommitInfo`` and tree."""
    if hashlib.sha1(data).hexdigest() != sha:
        _bad(where, f"manifest {sha} does not hash to its name: it was altered")
    rec = _json(data, where)
    if not isinstance(rec, dict) or set(rec) != _KEYS or rec["format"] != FORMAT:
        _bad(
            where,
            f"manifest {sha} is not a hubgrpo manifest "
            f"(keys {sorted(rec)[:10] if isinstance(rec, dict) else type(rec).__name__})",
        )
    parents, files = rec["parents"], rec["files"]
    if not isinstance(parents, list) or len(parents) > 1 or not all(_is_sha1(p) for p in parents):
        _bad(where, f"manifest {sha}: parents must be at most one commit id")
    if not isinstance(files, dict) or len(files) > MAX_FILES:
        _bad(where, f"manifest {sha}: files must be a mapping of at most {MAX_FILES} entries")
    tree: Tree = {}
    for path, entry in files.items():
        check_path(path)
        if not (
            isinstance(entry, list)
            and len(entry) == 2
            and isinstance(entry[0], str)
            and SHA256_RE.fullmatch(entry[0])
            and _is_int(entry[1])
            and 0 <= entry[1] <= MAX_BLOB_BYTES
        ):
            _bad(where, f"manifest {sha}: the entry of {path[:200]!r} is not [sha256, size]")
        tree[path] = (entry[0], entry[1])
    for key in ("message", "description", "marker"):
        if not isinstance(rec[key], str) or len(rec[key]) > MAX_TEXT:
            _bad(where, f"manifest {sha}: {key} must be a string of at most {MAX_TEXT} characters")
    t = rec["created_at"]
    if not (isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) and 0 <= t <= 1e11):
        _bad(where, f"manifest {sha}: created_at must be a Unix time")
    info = CommitInfo(
        sha=sha, message=rec["message"], created_at=float(t), marker=rec["marker"] or None, parents=tuple(parents)
    )
    return info, tree


def encode_ref(sha: str) -> bytes:
    return json.dumps({"commit": sha}).encode()


def decode_ref(data: bytes, *, where: str) -> str:
    """The commit id a ref (branch head or tag) points at."""
    rec = _json(data, where)
    if not isinstance(rec, dict) or set(rec) != {"commit"} or not _is_sha1(rec["commit"]):
        _bad(where, 'a ref must be {"commit": "<40-hex commit id>"}')
    return rec["commit"]


def _json(data: bytes, where: str):
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as e:  # RecursionError: a nesting bomb
        _bad(where, f"not valid JSON ({type(e).__name__})")


def _is_sha1(value) -> bool:
    return isinstance(value, str) and SHA1_RE.fullmatch(value) is not None


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _bad(where: str, what: str):
    raise StoreError(
        f"{where}: {what}",
        code="corrupt",
        hint="the bucket holds objects hubgrpo did not write; restore them or use a fresh prefix",
    )
