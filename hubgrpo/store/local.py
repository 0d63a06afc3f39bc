"""LocalStore: a run repo in a directory, with atomic commits, history, tags and compare-and-swap.

Everything the store API reads lives under ``<root>/.hubgrpo/``::

    repo.json                 format marker; its presence means "the repo exists"
    objects/ab/ab12…          content-addressed blobs (sha256), read-only, never rewritten
    commits/<sha1>.json       one commit: tree blob id, parents, message, marker, time (read-only)
    HEAD                      sha of the main branch head; replacing it is the commit point
    tags.json                 {tag: sha}, replaced atomically
    snapshots/<sha>/<path>    hard links handed out by ``local_path`` (like the Hub cache's snapshots)
    lock                      ``flock``-ed around every read-check-write of HEAD or tags
    tmp/                      temp files, renamed into place (same filesystem)

A tree is a JSON blob ``{path: blob sha256}`` (objects, atomic writes and the lock: ``hubgrpo.store.local_files``).
A commit writes its blobs outside the lock, then under the lock reads HEAD, checks ``parent`` (compare-and-swap),
writes tree and commit files and replaces HEAD. Readers read HEAD once and then only immutable files, so they see a
whole commit or none, across threads and processes; a writer killed at any point leaves orphan objects at worst.
Old revisions stay readable forever.

The files at ``<root>`` itself are a **convenience checkout** of the head (``PeftModel.from_pretrained(root)``
works on a local run), updated under the lock after each commit with atomic per-file replaces. It may lag after
a crash (the next commit catches up), is never read by the store API, and skips paths under ``.hubgrpo/``.
POSIX only (``fcntl``); keep the root on a local disk or NFSv4.

Differences from the Hub: no initial commit (``head()`` is None until the first commit); ``private`` is ignored;
``RepoBusy`` is never raised (writers queue on the lock).
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import shutil
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from pathlib import Path

from hubgrpo.errors import CommitConflict, NotFound, StoreError
from hubgrpo.store.base import MARKER_PREFIX, CommitInfo, Store, check_path, check_tag_name
from hubgrpo.store.local_files import LocalFiles
from hubgrpo.store.tree import apply_changes, checked_delete, files_under, first_parents, same_commit

log = logging.getLogger(__name__)

META = ".hubgrpo"
FORMAT = 1
BRANCH = "main"
_SHA1 = re.compile(r"[0-9a-f]{40}")


class LocalStore(LocalFiles, Store):
    """A run repo in a local directory. Safe for many threads and processes at once; holds no global state.

    ``fsync``: flush blobs, commits and HEAD to disk before they become visible (durable across power loss as
    far as the filesystem orders renames); ``checkout``: keep the browsable copy of the head at the root.
    """

    def __init__(self, root: str | Path, *, fsync: bool = True, checkout: bool = True):
        self.root = Path(root).expanduser().absolute()
        self.location = str(self.root)
        self.meta = self.root / META
        self.fsync = fsync
        self.checkout = checkout
        self._cache_lock = threading.Lock()
        self._commits: dict[str, dict] = {}  # sha -> commit record (immutable, so caching is safe)
        self._trees: OrderedDict[str, dict[str, str]] = OrderedDict()  # tree id -> {path: blob}, small LRU

    def __repr__(self) -> str:
        return f"LocalStore({self.location!r})"

    # ------------------------------------------------------------------------------------------ repo

    def create(self, *, exist_ok: bool = True, private: bool = True) -> None:
        """Create the repo atomically (a fully built ``.hubgrpo`` is renamed into place). ``private`` is ignored."""
        if self.exists():
            if not exist_ok:
                raise StoreError(
                    f"run repo {self.location} already exists",
                    code="exists",
                    hint="pass exist_ok=True to reuse it, or choose another directory",
                )
            return
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f"{META}.tmp-{os.getpid()}-{uuid.uuid4().hex}"
        for sub in ("objects", "commits", "snapshots", "tmp"):
            (tmp / sub).mkdir(parents=True)
        (tmp / "lock").touch()
        (tmp / "tags.json").write_text("{}")
        (tmp / "repo.json").write_text(json.dumps({"format": FORMAT, "created_at": time.time()}))
        try:
            os.rename(tmp, self.meta)
        except OSError as e:  # another process created it first (the rename target is a non-empty directory)
            shutil.rmtree(tmp, ignore_errors=True)
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST) or not self.exists():
                raise StoreError(f"cannot create run repo at {self.location}: {e}") from e
            if not exist_ok:
                raise StoreError(
                    f"run repo {self.location} already exists",
                    code="exists",
                    hint="pass exist_ok=True to reuse it, or choose another directory",
                ) from e

    def exists(self) -> bool:
        return (self.meta / "repo.json").is_file()

    def head(self) -> str | None:
        self._require()
        try:
            return (self.meta / "HEAD").read_text().strip() or None
        except FileNotFoundError:
            return None

    # ------------------------------------------------------------------------------------------ reads

    def read(self, path: str, revision: str | None = None) -> bytes:
        return self._blob_path(path, revision)[1].read_bytes()

    def local_path(self, path: str, revision: str | None = None) -> Path:
        """A read-only file named like ``path`` under ``.hubgrpo/snapshots/<sha>/`` (a hard link to the blob).

        As with the Hub cache, files of one revision share a folder, so ``local_path(p).parent`` holds the
        siblings already asked for. Callers must not write to it.
        """
        sha, blob = self._blob_path(path, revision)
        dest = self.meta / "snapshots" / sha / path
        if not dest.is_file():
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = self._tmp_name()
            try:
                os.link(blob, tmp)
            except OSError:  # no hard links on this filesystem: copy
                shutil.copyfile(blob, tmp)
                os.chmod(tmp, 0o444)
            os.replace(tmp, dest)
        return dest

    def list_files(self, prefix: str = "", revision: str | None = None) -> list[str]:
        """Files under folder ``prefix`` (or the file ``prefix`` itself); [] when there is none."""
        return files_under(self._tree_at(self._resolve(revision)), prefix)

    def file_sizes(self, prefix: str = "", revision: str | None = None) -> dict[str, int]:
        tree = self._tree_at(self._resolve(revision))
        return {p: os.stat(self._object(tree[p])).st_size for p in files_under(tree, prefix)}

    def exists_file(self, path: str, revision: str | None = None) -> bool:
        return check_path(path) in self._tree_at(self._resolve(revision))

    def history(self, limit: int | None = None) -> list[CommitInfo]:
        """First-parent history of the main branch, newest first."""

        def info(sha: str) -> CommitInfo:
            rec = self._commit(sha)
            return CommitInfo(
                sha=sha,
                message=rec["message"],
                created_at=rec["created_at"],
                marker=rec["marker"],
                parents=tuple(rec["parents"]),
            )

        return first_parents(self.head(), info, limit)

    def tags(self) -> dict[str, str]:
        self._require()
        return json.loads((self.meta / "tags.json").read_text())

    # ------------------------------------------------------------------------------------------ writes

    def commit(
        self, adds: Mapping[str, bytes | Path], deletes: Sequence[str] = (), *, message: str, parent: str | None = None
    ) -> str:
        """One atomic commit; see ``Store.commit``.

        Deletes apply before adds; deleting a missing file (or a folder with no file) raises NotFound. When the
        result equals the head's tree no commit is made and the head is returned (as on the Hub), except on an
        empty repo, where the first commit is always made. ``parent``: a sha (a prefix of ≥ 5 hex digits is accepted,
        as on the Hub).
        """
        self._require()
        if not isinstance(message, str) or not message.strip():
            raise StoreError("refusing a commit with an empty message", hint="say what the commit does")
        adds = {check_path(p): v for p, v in adds.items()}
        deletes = [checked_delete(d) for d in ([deletes] if isinstance(deletes, str) else deletes)]
        blobs = {p: self._put_object(v) for p, v in adds.items()}  # slow I/O, outside the lock
        with self._locked():
            head = self.head()
            if parent is not None and not same_commit(parent, head):
                raise CommitConflict(
                    f"{self.location}: the head moved: expected parent {parent}, actual head {head}",
                    hint="re-read the repo at the new head, redo your change and commit again",
                )
            old = self._tree_at(head)
            new = apply_changes(old, blobs, deletes, head)
            if head is not None and new == old:
                return head
            sha = self._write_commit(new, head, message)
            self._write_head(sha)
            if self.checkout:
                self._sync_checkout(sha)
        return sha

    def tag(self, name: str, revision: str, *, exist_ok: bool = False) -> None:
        """Tag ``revision`` (a sha, tag or 'main'). An existing tag is kept as it is when ``exist_ok``."""
        check_tag_name(name)
        sha = self._resolve(revision)
        if sha is None:
            raise NotFound(f"cannot tag {revision!r} in {self.location}: the repo has no commit yet")
        with self._locked():
            tags = self.tags()
            if name in tags:
                if exist_ok:
                    return
                raise StoreError(
                    f"tag {name!r} already exists in {self.location} (at {tags[name]})",
                    code="exists",
                    hint="pass exist_ok=True, or pick the next version number",
                )
            tags[name] = sha
            self._atomic_write(self.meta / "tags.json", json.dumps(tags, indent=1, sort_keys=True).encode())

    # ------------------------------------------------------------------------------------------ internals

    def _require(self) -> None:
        if not self.exists():
            raise NotFound(f"no run repo at {self.location}", hint="create it first (Store.create / hubgrpo init)")

    def _resolve(self, revision: str | None) -> str | None:
        """A commit sha for a revision (None/'main' → head, a sha, or a tag); None for an empty repo's head."""
        if revision is None or revision == BRANCH:
            return self.head()
        self._require()
        if _SHA1.fullmatch(revision) and (self.meta / "commits" / f"{revision}.json").is_file():
            return revision
        sha = self.tags().get(revision)
        if sha is None:
            raise NotFound(
                f"revision {revision!r} not found in {self.location}",
                hint="use a commit sha from history(), a tag from tags(), or 'main'",
            )
        return sha

    def _commit(self, sha: str) -> dict:
        with self._cache_lock:
            rec = self._commits.get(sha)
        if rec is None:
            try:
                rec = json.loads((self.meta / "commits" / f"{sha}.json").read_bytes())
            except FileNotFoundError:
                raise NotFound(f"commit {sha} missing from {self.location}") from None
            with self._cache_lock:
                self._commits[sha] = rec
        return rec

    def _tree_at(self, sha: str | None) -> dict[str, str]:
        """{path: blob} of a commit ({} for None). The returned dict is shared: do not mutate it."""
        if sha is None:
            return {}
        tree_id = self._commit(sha)["tree"]
        with self._cache_lock:
            tree = self._trees.get(tree_id)
            if tree is not None:
                self._trees.move_to_end(tree_id)
                return tree
        tree = json.loads(self._object(tree_id).read_bytes())
        with self._cache_lock:
            self._trees[tree_id] = tree
            while len(self._trees) > 16:
                self._trees.popitem(last=False)
        return tree

    def _blob_path(self, path: str, revision: str | None) -> tuple[str, Path]:
        check_path(path)
        sha = self._resolve(revision)
        blob = self._tree_at(sha).get(path)
        if blob is None or sha is None:  # (the empty repo has no files)
            at = "the empty repo" if sha is None else f"revision {revision or BRANCH} ({sha})"
            raise NotFound(f"{path!r} not found at {at} of {self.location}")
        return sha, self._object(blob)

    def _write_commit(self, tree: dict[str, str], parent: str | None, message: str) -> str:
        tree_id = self._put_object(json.dumps(tree, sort_keys=True, separators=(",", ":")).encode())
        marker = str(uuid.uuid4())  # CommitInfo.marker is the id; the description line is what the Hub stores
        rec = {
            "tree": tree_id,
            "parents": [parent] if parent else [],
            "message": message,
            "description": f"{MARKER_PREFIX}{marker}",
            "marker": marker,
            "created_at": time.time(),
        }
        data = json.dumps(rec, sort_keys=True, indent=1).encode()
        sha = hashlib.sha1(data).hexdigest()
        self._atomic_write(self.meta / "commits" / f"{sha}.json", data, mode=0o444)
        return sha

    def _write_head(self, sha: str) -> None:
        """The commit point: replace HEAD, then make the rename durable."""
        self._atomic_write(self.meta / "HEAD", sha.encode())
        if self.fsync:
            fd = os.open(self.meta, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def _sync_checkout(self, sha: str) -> None:
        """Bring the browsable files at the root from the last checked-out commit to ``sha`` (under the lock).

        Only files that changed between the two trees are touched (a file removed by hand comes back when it
        changes). Best effort: the commit has already happened, so a failure here is logged, not raised.
        """
        mark = self.meta / "CHECKOUT"
        try:
            done = mark.read_text().strip() or None
            old = self._tree_at(done) if done else {}
        except (FileNotFoundError, NotFound):
            old = {}
        new = self._tree_at(sha)
        try:
            for p in old.keys() - new.keys():
                if p.split("/")[0] != META:
                    _remove_file(self.root, p)
            for p, blob in new.items():
                if p.split("/")[0] != META and old.get(p) != blob:
                    tmp = self._tmp_name()
                    shutil.copyfile(self._object(blob), tmp)
                    self._install(tmp, self.root / p, mode=0o644)
            with open(tmp := self._tmp_name(), "w") as f:  # no fsync: the checkout is a view, it may lag
                f.write(sha)
            os.replace(tmp, mark)
        except OSError as e:
            log.warning("%s: checkout at the root not updated to %s: %s", self.location, sha, e)


def _remove_file(root: Path, path: str) -> None:
    """Delete a checked-out file and the folders it leaves empty (never the root)."""
    target = root / path
    target.unlink(missing_ok=True)
    parent = target.parent
    while parent != root:
        try:
            parent.rmdir()
        except OSError:
            break
        parent = parent.parent
