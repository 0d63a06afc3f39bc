"""One folder per coordinator process under a shared root, and what dead processes left there.

Every ``hubgrpo run`` of a project uses one workdir (``~/.cache/hubgrpo/coordinator/<project>``), every
``hubgrpo coordinator`` and ``hubgrpo space`` of a run one per run (``for_store``), and so does a coordinator
restarted on it. Each process keeps its versions in a folder of its own, ``p<pid>-<hex>``, holding an
exclusive ``flock`` on the folder's ``.lock`` for its whole life (the OS drops it when the process dies, however it
dies). A new process deletes every sibling folder whose lock it can take: its owner is gone, nothing reads those
versions any more (a version needed again comes from its tag), and a long run's or many runs' folders would otherwise
fill the disk (19 GB had piled up on one machine). Live coordinators on one root (two runs of one project at once)
never touch each other's folders. The version folders of releases before this one (``<version>-<id>``, ``.tmp-<hex>``
directly in the root) are deleted too once none of them changed for an hour. Never through a link. Without ``flock``
(Windows) nothing is deleted.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import time
import uuid
from pathlib import Path
from typing import IO

try:
    import fcntl
except ImportError:  # Windows: nothing is locked, so nothing is ever deleted
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

LOCK = ".lock"
OLD_QUIET_S = 3600  # an older release's folders go only when none changed for this long (its coordinator is gone)
_PROCESS = re.compile(r"p[0-9]+-[0-9a-f]{12}")
_OLD = re.compile(r"[0-9]+-[0-9a-f]{40}|\.tmp-[0-9a-f]{32}")  # written by releases before per-process folders
_OWNED: set[str] = set()  # this process's own folders (where locks belong to the process, as on NFS, not the file)


def for_store(location: str) -> Path:
    """The workdir of a coordinator started on its own (``hubgrpo coordinator``, ``hubgrpo space``) for the
    run at ``location``: one per run under hubgrpo's cache, so that a restarted coordinator clears what the one
    before it left (a fresh temporary folder per start would keep every earlier process's versions forever). A local
    run's path counts once resolved."""
    from hubgrpo.runrepo import cache_root

    if os.path.isabs(location):  # a local run repo: one workdir however its path is spelled (links, '..')
        try:
            location = os.path.realpath(location)
        except (OSError, ValueError):
            pass
    tail = re.sub(r"[^A-Za-z0-9._-]+", "-", location.rstrip("/").rsplit("/", 1)[-1])[:40].strip("-.") or "run"
    return cache_root() / "coordinator" / f"{tail}-{hashlib.sha256(os.fsencode(location)).hexdigest()[:12]}"


def own_folder(root: Path) -> tuple[Path, IO[bytes] | None]:
    """A new folder for this process under ``root`` and the open file that holds its lock. The folder gets its
    final name only once locked, so no sibling ever sees it unlocked; where it cannot be locked (no ``flock``, or a
    file system that refuses it) it keeps its ``.new-`` name, which nothing ever deletes."""
    root.mkdir(parents=True, exist_ok=True)
    name = f"p{os.getpid()}-{uuid.uuid4().hex[:12]}"
    fresh = root / f".new-{name}"
    fresh.mkdir()
    handle = (fresh / LOCK).open("ab")
    if not _try_lock(handle.fileno()):
        handle.close()
        if fcntl is not None:
            log.warning("cannot lock %s (a network file system?): its version folders stay after this run", fresh)
        return fresh, None
    fresh.rename(root / name)
    _OWNED.add(str(root / name))
    return root / name, handle


def release(folder: Path, handle: IO[bytes]) -> None:
    """Drop this process's lock on its ``folder``: a later coordinator may delete it."""
    _OWNED.discard(str(folder))
    handle.close()


def clear_dead(root: Path) -> int:
    """Delete what coordinators that are gone left under ``root``; how many folders went."""
    if not root.is_dir() or fcntl is None:
        return 0
    entries = [e for e in root.iterdir() if not e.is_symlink() and e.is_dir()]
    old = [e for e in entries if _OLD.fullmatch(e.name)]
    gone = sum(_remove(e) for e in old) if old and _quiet(old) else 0
    gone += sum(_remove_if_dead(e) for e in entries if _PROCESS.fullmatch(e.name) and str(e) not in _OWNED)
    if gone:
        log.info("removed %d version folders that earlier coordinators left in %s", gone, root)
    return gone


def _quiet(folders: list[Path]) -> bool:
    """Whether none of an older release's ``folders`` changed within ``OLD_QUIET_S`` (no lock tells if it runs)."""
    try:
        newest = max(f.stat().st_mtime for f in folders)
    except OSError:
        return False
    return time.time() - newest > OLD_QUIET_S


def _remove_if_dead(folder: Path) -> int:
    """Remove ``folder`` when its owner's lock can be taken (held while removing); 1 when it went. The lock file
    is opened for writing (NFS emulates ``flock`` with a POSIX lock, which an exclusive lock needs), never through a
    link, never created: a folder without one, or one this user may not write, is not this coordinator's to clear."""
    try:
        fd = os.open(folder / LOCK, os.O_RDWR | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return 0
    try:
        return _remove(folder) if _try_lock(fd) else 0  # not lockable: its coordinator lives
    finally:
        os.close(fd)


def _remove(folder: Path) -> int:
    shutil.rmtree(folder, ignore_errors=True)
    return 0 if folder.exists() else 1


def _try_lock(fd: int) -> bool:
    """An exclusive lock on ``fd`` without waiting; False when another open file holds one (or no flock)."""
    if fcntl is None:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    return True
