"""One folder per coordinator process under a shared root, and what dead processes left there.

Every ``hubgrpo run`` of a project uses one workdir (``~/.cache/hubgrpo/coordinator/<project>``), and so does a
coordinator restarted on it. Each process keeps its versions in a folder of its own, ``p<pid>-<hex>``, holding an
exclusive ``flock`` on the folder's ``.lock`` for its whole life (the OS drops it when the process dies, however it
dies). A new process deletes every sibling folder whose lock it can take: its owner is gone, nothing reads those
versions any more (a version needed again comes from its tag), and a long run's or many runs' folders would otherwise
fill the disk (19 GB had piled up on one machine). Live coordinators on one root (two runs of one project at once)
never touch each other's folders. The version folders of releases before this one (``<version>-<id>``, ``.tmp-<hex>``
directly in the root) are deleted too. Never through a link. Without ``flock`` (Windows) nothing is deleted.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import uuid
from pathlib import Path
from typing import IO

log = logging.getLogger(__name__)

LOCK = ".lock"
_PROCESS = re.compile(r"p[0-9]+-[0-9a-f]{12}")
_OLD = re.compile(r"[0-9]+-[0-9a-f]{40}|\.tmp-[0-9a-f]{32}")  # written by releases before per-process folders


def own_folder(root: Path) -> tuple[Path, IO[bytes] | None]:
    """A new folder for this process under ``root`` and the open file that holds its lock (None without
    ``flock``). The folder gets its final name only once locked, so no sibling ever sees it unlocked."""
    root.mkdir(parents=True, exist_ok=True)
    name = f"p{os.getpid()}-{uuid.uuid4().hex[:12]}"
    fresh = root / f".new-{name}"
    fresh.mkdir()
    handle = (fresh / LOCK).open("ab")
    owner: IO[bytes] | None = handle if _try_lock(handle) else None  # a fresh file: None only without flock
    if owner is None:
        handle.close()
    fresh.rename(root / name)
    return root / name, owner


def clear_dead(root: Path) -> int:
    """Delete what coordinators that are gone left under ``root``; how many folders went."""
    if not root.is_dir() or not _has_flock():
        return 0
    gone = 0
    for entry in root.iterdir():
        if entry.is_symlink() or not entry.is_dir():
            continue
        if _OLD.fullmatch(entry.name):
            gone += _remove(entry)
        elif _PROCESS.fullmatch(entry.name):
            gone += _remove_if_dead(entry)
    if gone:
        log.info("removed %d version folders that earlier coordinators left in %s", gone, root)
    return gone


def _remove_if_dead(folder: Path) -> int:
    """Remove ``folder`` when its owner's lock can be taken (held while removing); 1 when it went."""
    try:
        handle = (folder / LOCK).open("ab")
    except OSError:  # gone meanwhile, or not ours to open
        return 0
    with handle:
        if not _try_lock(handle):
            return 0  # its coordinator lives
        return _remove(folder)


def _remove(folder: Path) -> int:
    shutil.rmtree(folder, ignore_errors=True)
    return 0 if folder.exists() else 1


def _has_flock() -> bool:
    try:
        import fcntl  # noqa: F401
    except ImportError:
        return False
    return True


def _try_lock(handle: IO[bytes]) -> bool:
    """An exclusive lock on ``handle`` without waiting; False when another open file holds one (or no flock)."""
    try:
        import fcntl
    except ImportError:
        return False
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    return True
