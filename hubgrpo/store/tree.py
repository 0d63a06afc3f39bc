"""Trees shared by the versioned backends: a tree is ``{repo path: blob id}``; a commit applies deletes, then adds.

``LocalStore`` and ``S3Store`` keep a whole tree per commit and use these rules, so both refuse the same things
(a missing delete, a path that would be both a file and a folder) with the same errors.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import TypeVar

from hubgrpo.errors import InvalidPath, NotFound
from hubgrpo.store.base import CommitInfo, check_path


def same_commit(parent: str, head: str | None) -> bool:
    """Whether ``parent`` (a full sha or a prefix of at least 5 hex digits, as the Hub accepts) names ``head``."""
    return head is not None and len(parent) >= 5 and head.startswith(parent.lower()) and len(parent) <= 40


def checked_delete(path: str) -> str:
    """A validated delete: a file path, or a folder path ending in '/'."""
    if isinstance(path, str) and path.endswith("/") and path != "/":
        return check_path(path[:-1]) + "/"
    return check_path(path)


V = TypeVar("V")  # what a tree maps each path to (a blob id, or the S3 store's (sha256, size))


def apply_changes(old: dict[str, V], blobs: dict[str, V], deletes: list[str], head: str | None) -> dict[str, V]:
    """The tree after deleting ``deletes`` (files, or folders ending in '/') and then adding ``blobs``."""
    new = dict(old)
    for d in deletes:
        gone = [p for p in new if p.startswith(d)] if d.endswith("/") else [d] if d in new else []
        if not gone:
            raise NotFound(
                f"cannot delete {d!r}: no such {'folder' if d.endswith('/') else 'file'} at head {head}",
                hint="a folder delete ends with '/'; list_files() shows what exists",
            )
        for p in gone:
            del new[p]
    new.update(blobs)
    keys = sorted(new) if blobs else []
    for path in blobs:
        parts = path.split("/")
        above = next((q for q in ("/".join(parts[:i]) for i in range(1, len(parts))) if q in new), None)
        i = bisect.bisect_left(keys, path + "/")
        if above or (i < len(keys) and keys[i].startswith(path + "/")):
            raise InvalidPath(
                f"repo path {above or path!r} would be both a file and a folder",
                hint="delete the file (or folder) in the same commit, or choose another path",
            )
    return new


def files_under(tree, prefix: str) -> list[str]:
    """Paths of ``tree`` under folder ``prefix`` (or the file ``prefix`` itself), sorted; [] when there is none."""
    folder = prefix.rstrip("/")
    if not folder:
        return sorted(tree)
    check_path(folder)
    return sorted(p for p in tree if p == folder or p.startswith(folder + "/"))


def first_parents(head: str | None, info: Callable[[str], CommitInfo], limit: int | None) -> list[CommitInfo]:
    """The first-parent history from ``head``, newest first (at most ``limit`` commits)."""
    out: list[CommitInfo] = []
    sha = head
    while sha is not None and (limit is None or len(out) < limit):
        out.append(info(sha))
        sha = out[-1].parents[0] if out[-1].parents else None
    return out
