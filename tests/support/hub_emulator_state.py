"""The data model behind the local Hub emulator: repos, commits with full trees, branches, tags and blobs.

Pure Python, no HTTP. ``HubState`` is guarded by one re-entrant lock; every mutation happens under it, so readers
always see a consistent repo. With ``data_dir`` every mutation is appended to an event log (plus one file per blob)
that is replayed on start, so a subprocess emulator can be restarted without losing the bucket.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

GITATTRIBUTES = (
    b"*.bin filter=lfs diff=lfs merge=lfs -text\n"
    b"*.pt filter=lfs diff=lfs merge=lfs -text\n"
    b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n"
    b"*.gguf filter=lfs diff=lfs merge=lfs -text\n"
)


class HubError(Exception):
    """An error answer: HTTP status, message, optional ``X-Error-Code`` and extra JSON body keys."""

    def __init__(self, status: int, message: str, code: str | None = None, headers: dict | None = None, **body):
        super().__init__(message)
        self.status, self.message, self.code = status, message, code
        self.headers = dict(headers or {})
        self.body = body


def git_blob_sha1(data: bytes) -> str:
    """The git blob id of ``data`` (what ``git hash-object`` prints; the Hub's ETag for regular files)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def iso(ts: float) -> str:
    """A timestamp in the Hub's format, e.g. ``2024-05-01T12:00:00.123Z``."""
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def bad_path(path: str) -> str | None:
    """Why the server refuses ``path`` (None when it is fine)."""
    if not path or path.startswith("/") or "\\" in path:
        return "must be a relative POSIX path"
    segs = path.split("/")
    if any(s in ("", ".", "..") for s in segs):
        return "has an empty, '.' or '..' segment"
    if segs[0] == ".git":
        return "is inside .git"
    return None


@dataclass
class Commit:
    """One commit: its full tree (path → blob oid), first parent, summary/description, author and time."""

    sha: str
    parent: str | None
    tree: dict[str, str]
    title: str
    message: str
    author: str
    date: float


@dataclass
class Repo:
    """A repo of one type. ``branches``/``tags`` map names to commit shas; ``commit_lock`` is held while committing."""

    repo_type: str
    repo_id: str
    private: bool
    created_at: float
    commits: dict[str, Commit] = field(default_factory=dict)
    branches: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    lfs: dict[str, dict] = field(default_factory=dict)  # sha256 → stored LFS object (``hub_emulator_storage``)
    commit_lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @property
    def namespace(self) -> str:
        return self.repo_id.split("/", 1)[0]

    def resolve(self, rev: str) -> Commit | None:
        """A branch, a tag, a full sha or an unambiguous sha prefix (≥ 7 hex) → the commit, else None."""
        sha = self.branches.get(rev) or self.tags.get(rev)
        if sha is None and rev in self.commits:
            sha = rev
        if sha is None and 7 <= len(rev) < 40 and all(c in "0123456789abcdef" for c in rev):
            hits = [s for s in self.commits if s.startswith(rev)]
            sha = hits[0] if len(hits) == 1 else None
        return self.commits.get(sha) if sha else None

    def history(self, start: Commit):
        """Commits from ``start`` back to the root, following first parents (newest first)."""
        c: Commit | None = start
        while c is not None:
            yield c
            c = self.commits.get(c.parent) if c.parent else None


def tree_items(commit: Commit | None, path: str, recursive: bool, sizes: dict[str, int], lfs_of=None) -> list[dict]:
    """Tree entries under folder ``path`` ('' = root) in the Hub's JSON shape (``lfs_of(path, oid)``: the entry's
    ``lfs`` info, or None for a regular file). Raises HubError if not a folder."""
    tree = commit.tree if commit else {}
    prefix = path.rstrip("/") + "/" if path else ""
    files = sorted(p for p in tree if p.startswith(prefix))
    if path and not files:
        raise HubError(404, f"{path} does not exist on this revision", code="EntryNotFound")
    out: dict[str, dict] = {}
    for p in files:
        rel = p[len(prefix):].split("/")
        for depth in range(1, len(rel)):
            d = prefix + "/".join(rel[:depth])
            if (recursive or depth == 1) and d not in out:
                sub = "".join(sorted(f"{q}:{tree[q]}" for q in tree if q.startswith(d + "/")))
                out[d] = {"type": "directory", "oid": hashlib.sha1(sub.encode()).hexdigest(), "path": d}
        if recursive or len(rel) == 1:
            out[p] = {"type": "file", "oid": tree[p], "size": sizes.get(tree[p], 0), "path": p}
            lfs = lfs_of(p, tree[p]) if lfs_of else None
            if lfs:
                out[p]["lfs"] = lfs
    return [out[k] for k in sorted(out)]


class HubState:
    """All repos and blobs of one emulator. Call mutating methods only while holding ``self.lock``."""

    def __init__(self, data_dir: str | Path | None = None):
        self.lock = threading.RLock()
        self.repos: dict[tuple[str, str], Repo] = {}
        self.blobs: dict[str, bytes] = {}
        self.sha256: dict[str, str] = {}  # blob oid → sha256 of its bytes (LFS ids), computed on demand
        self.data_dir = Path(data_dir) if data_dir else None
        if self.data_dir and (self.data_dir / "events.jsonl").exists():
            self._load()

    # -- blobs ---------------------------------------------------------------------------------------------
    def put_blob(self, data: bytes) -> str:
        """Store ``data`` and return its git blob oid."""
        oid = git_blob_sha1(data)
        if oid not in self.blobs:
            self.blobs[oid] = data
            if self.data_dir:
                (self.data_dir / "blobs").mkdir(parents=True, exist_ok=True)
                tmp = self.data_dir / "blobs" / f"{oid}.{uuid.uuid4().hex}.tmp"
                tmp.write_bytes(data)
                os.replace(tmp, self.data_dir / "blobs" / oid)
        return oid

    def sizes(self) -> dict[str, int]:
        return {oid: len(b) for oid, b in self.blobs.items()}

    # -- repos ---------------------------------------------------------------------------------------------
    def create_repo(self, repo_type: str, repo_id: str, *, private: bool, author: str, initial_commit: bool) -> Repo:
        """A new repo; like the Hub, it starts with an 'initial commit' holding ``.gitattributes``."""
        repo = Repo(repo_type, repo_id, private, time.time())
        self.repos[(repo_type, repo_id)] = repo
        self._log({"op": "repo", "type": repo_type, "id": repo_id, "private": private, "created_at": repo.created_at})
        if initial_commit:
            tree = {".gitattributes": self.put_blob(GITATTRIBUTES)}
            self._add_commit(repo, "main", tree, "initial commit", "", author)
        return repo

    def _add_commit(self, repo: Repo, branch: str, tree: dict, title: str, message: str, author: str) -> Commit:
        """Record a commit with a fresh, unique 40-hex id and move ``branch`` to it."""
        parent = repo.branches.get(branch)
        seed = f"{parent}\n{sorted(tree.items())}\n{title}\n{message}\n{time.time_ns()}\n{uuid.uuid4()}"
        c = Commit(hashlib.sha1(seed.encode()).hexdigest(), parent, tree, title, message, author, time.time())
        repo.commits[c.sha] = c
        repo.branches[branch] = c.sha
        self._log({"op": "commit", "type": repo.repo_type, "id": repo.repo_id, "commit": asdict(c)})
        self.save_refs(repo)
        return c

    def apply_commit(self, repo: Repo, branch: str, header: dict, ops: list[dict], author: str) -> Commit:
        """Apply NDJSON operations as one commit on ``branch``; 412 if ``parentCommit`` is not the head."""
        head_sha = repo.branches.get(branch)
        parent = header.get("parentCommit")
        if parent and not (head_sha or "").startswith(parent.lower()):
            raise HubError(412, "The branch was updated since you opened this page. Please refresh and try again.")
        tree = dict(repo.commits[head_sha].tree) if head_sha else {}
        old = dict(tree)
        for op in ops:
            _apply_op(self, tree, op)
        title, message = header.get("summary") or "", header.get("description") or ""
        from tests.support.hub_emulator_storage import register_lfs

        register_lfs(self, repo, old, tree)
        return self._add_commit(repo, branch, tree, title, message, author)

    def copy_repo(self, repo_type: str, src: str, dst: str) -> Repo:
        """A copy of repo ``src`` named ``dst`` (same commits, refs and LFS records; blobs are shared), so that a
        test can run one scenario many times on the same history. Not persisted to ``data_dir``."""
        with self.lock:
            old = self.repos[(repo_type, src)]
            new = Repo(repo_type, dst, old.private, old.created_at, lfs={k: dict(v) for k, v in old.lfs.items()},
                       commits={s: Commit(**asdict(c)) for s, c in old.commits.items()},
                       branches=dict(old.branches), tags=dict(old.tags))
            self.repos[(repo_type, dst)] = new
            return new

    def delete_repo(self, repo_type: str, repo_id: str) -> None:
        del self.repos[(repo_type, repo_id)]
        self._log({"op": "delete", "type": repo_type, "id": repo_id})

    # -- persistence: an append-only event log (data_dir/events.jsonl) and one file per blob ---------------
    def save_refs(self, repo: Repo) -> None:
        """Record the branches and tags of ``repo`` (after any change to them)."""
        self._log({"op": "refs", "type": repo.repo_type, "id": repo.repo_id, "branches": repo.branches,
                   "tags": repo.tags})

    def _log(self, event: dict) -> None:
        """Append one event (no-op without a data dir)."""
        if self.data_dir:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            with open(self.data_dir / "events.jsonl", "a") as f:
                f.write(json.dumps(event) + "\n")

    def _load(self) -> None:
        """Replay the event log; a torn last line (the process was killed mid-write) is ignored."""
        for line in (self.data_dir / "events.jsonl").read_text().splitlines():
            try:
                e = json.loads(line)
            except ValueError:
                continue
            key = (e["type"], e["id"])
            if e["op"] == "repo":
                self.repos[key] = Repo(e["type"], e["id"], e["private"], e["created_at"])
            elif e["op"] == "commit":
                self.repos[key].commits[e["commit"]["sha"]] = Commit(**e["commit"])
            elif e["op"] == "refs":
                self.repos[key].branches, self.repos[key].tags = e["branches"], e["tags"]
            elif e["op"] == "drop":  # commits collected after a super-squash or a ref deletion
                for sha in e["commits"]:
                    self.repos[key].commits.pop(sha, None)
            elif e["op"] == "lfs":
                self.repos[key].lfs = e["lfs"]
            elif e["op"] == "delete":
                self.repos.pop(key, None)
        for f in (self.data_dir / "blobs").glob("*"):
            if not f.name.endswith(".tmp"):
                self.blobs[f.name] = f.read_bytes()


def _apply_op(state: HubState, tree: dict[str, str], op: dict) -> None:
    """Apply one NDJSON line (``file``, ``deletedFile``, ``deletedFolder``) to ``tree`` in place."""
    key, value = op.get("key"), op.get("value") or {}
    path = value.get("path", "")
    if key == "file":
        why = bad_path(path)
        if why:
            raise HubError(400, f"Invalid path '{path}': it {why}")
        if any(p.startswith(path + "/") for p in tree) or any(path.startswith(p + "/") for p in tree):
            raise HubError(400, f"'{path}' conflicts with an existing file or folder")
        data = base64.b64decode(value.get("content", "")) if value.get("encoding") == "base64" else \
            str(value.get("content", "")).encode()
        tree[path] = state.put_blob(data)
    elif key == "deletedFile":
        if path not in tree:
            raise HubError(404, "A file with this name doesn't exist", code="EntryNotFound")
        del tree[path]
    elif key == "deletedFolder":
        prefix = path.rstrip("/") + "/"
        gone = [p for p in tree if p.startswith(prefix)]
        if not gone:
            raise HubError(404, "A folder with this name doesn't exist", code="EntryNotFound")
        for p in gone:
            del tree[p]
    elif key == "lfsFile":
        raise HubError(400, "LFS files are not supported by the emulator (preupload always answers 'regular')")
    else:
        raise HubError(400, f"Unknown commit operation key {key!r}")
