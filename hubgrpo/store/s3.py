"""S3Store: a run repo on any S3-compatible object store (AWS S3, MinIO, R2, …), from immutable objects and one
head pointer swapped with S3 conditional writes.

Everything lives under ``s3://bucket/prefix/.hubgrpo/``::

    repo.json               format marker, created with IfNoneMatch="*"; its presence means "the repo exists"
    blobs/<sha256>          file contents, content-addressed, never rewritten with other bytes
    commits/<sha1>.json     one manifest per commit (``hubgrpo.store.manifest``): parent, files → blob + size,
                            message, marker, time; its name is the sha1 of its bytes; created with IfNoneMatch="*"
    refs/heads/main         {"commit": sha1}: the head; replaced only with IfMatch=<the etag it was read with>
    refs/tags/<name>        {"commit": sha1}: created once with IfNoneMatch="*", never moved

A commit uploads its blobs, then (bounded tries) reads the head, checks ``parent`` (compare-and-swap), writes a
manifest of the new tree on top of it and swaps the head with ``IfMatch``. A 412 or 409 on the swap means another
writer won: with ``parent`` that is ``CommitConflict``; without, the commit is re-applied on the new head (paths of
concurrent writers are disjoint). When the answer to the swap is lost (timeout, dropped connection, 5xx), the head
is read again and its first-parent history searched back to the head we built on: a commit that landed is never
made twice, and a swap that did not land cannot land later (its IfMatch etag is gone). Readers read the head once
and then only immutable, verified objects: they see a whole commit or none. Old revisions stay readable.

Nothing read from the bucket is trusted: manifests and refs are checked (``manifest``), blobs are checked against
their size and sha256 as they are downloaded into hubgrpo's cache (``local_path``, ``s3_blobs``), once per blob.
Revisions are 40-hex commit ids, as on the other backends; ``head()`` is None until the first commit (as with
``LocalStore``).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import random
import shutil
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from hubgrpo.errors import CommitConflict, NotFound, RepoBusy, StoreError, StoreUnavailable
from hubgrpo.store import manifest
from hubgrpo.store.base import SHA1_RE, CommitInfo, Store, check_path, check_tag_name
from hubgrpo.store.retry import retry_delay
from hubgrpo.store.s3_blobs import Blobs
from hubgrpo.store.s3_bucket import S3Bucket, parse_s3_url
from hubgrpo.store.tree import apply_changes, checked_delete, files_under, first_parents, same_commit

META = ".hubgrpo/"
HEAD_REF = "refs/heads/main"
TAGS = "refs/tags/"


class S3Store(Store):
    """A run repo at ``s3://bucket/prefix``. Safe for many threads and processes at once.

    ``endpoint_url`` defaults to ``AWS_ENDPOINT_URL``; ``cache_dir`` (downloaded blobs) to ``<hubgrpo cache>/s3``;
    ``max_commit_tries`` bounds how often a commit without ``parent`` is re-applied on a moving head;
    ``search_depth`` bounds the history walked after a lost answer; ``sleep`` is injected by tests.
    """

    def __init__(
        self,
        url: str,
        *,
        endpoint_url: str | None = None,
        cache_dir: str | Path | None = None,
        timeout_s: float = 30.0,
        max_retries: int = 6,
        retry_base_s: float = 0.25,
        max_commit_tries: int = 64,
        search_depth: int = 200,
        sleep: Callable[[float], None] = time.sleep,
    ):
        bucket, prefix = parse_s3_url(url)
        self.objects = S3Bucket(
            bucket,
            prefix + META,
            endpoint_url=endpoint_url,
            timeout_s=timeout_s,
            max_retries=max_retries,
            retry_base_s=retry_base_s,
            sleep=sleep,
        )
        self.location = f"s3://{bucket}/{prefix}".rstrip("/")
        if cache_dir is None:
            from hubgrpo.runrepo import cache_root

            cache_dir = cache_root() / "s3"
        self.cache_dir = Path(cache_dir)
        self.blobs = Blobs(self.objects, self.cache_dir, self.location)
        self.max_retries, self.retry_base_s, self._sleep = int(max_retries), float(retry_base_s), sleep
        self.max_commit_tries, self.search_depth = int(max_commit_tries), int(search_depth)
        self._lock = threading.Lock()
        self._infos: dict[str, CommitInfo] = {}  # immutable once read and checked
        self._trees: OrderedDict[str, manifest.Tree] = OrderedDict()  # small LRU
        self._tags: dict[str, str] = {}  # tags are never moved, so a tag read once is known for good
        self._writes_checked = False  # the conditional-write probe passed (``_check_writes``)

    def __repr__(self) -> str:
        return f"S3Store({self.location!r})"

    # ------------------------------------------------------------------------------------------ repo

    def create(self, *, exist_ok: bool = True, private: bool = True) -> None:
        """Create the repo (and the bucket, when it does not exist). ``private`` is ignored: bucket policies
        decide who can read."""
        if not self.exists():
            if not self.objects.bucket_exists():
                self.objects.create_bucket()
            self._check_writes()
            body = json.dumps({"format": manifest.FORMAT, "created_at": time.time(), "id": str(uuid.uuid4())})
            if self._create("repo.json", body.encode()):
                return
        if not exist_ok:
            raise StoreError(
                f"run repo {self.location} already exists",
                code="exists",
                hint="pass exist_ok=True to reuse it, or choose another prefix",
            )

    def exists(self) -> bool:
        return self.objects.head("repo.json") is not None

    def head(self) -> str | None:
        return self._read_head()[0]

    def _read_head(self) -> tuple[str | None, str | None]:
        """(head commit id, the ref's etag); (None, None) for a repo without commits."""
        try:
            data, etag = self.objects.get(HEAD_REF, max_bytes=manifest.MAX_REF_BYTES)
        except NotFound:
            self._require()
            return None, None
        return manifest.decode_ref(data, where=f"{self.location} {HEAD_REF}"), etag

    def _require(self) -> None:
        if not self.exists():
            raise NotFound(f"no run repo at {self.location}", hint="create it first (Store.create / hubgrpo init)")

    # ------------------------------------------------------------------------------------------ reads

    def read(self, path: str, revision: str | None = None) -> bytes:
        return self.local_path(path, revision).read_bytes()

    def local_path(self, path: str, revision: str | None = None) -> Path:
        """A read-only file named like ``path`` under ``<cache>/snapshots/<repo>/<sha>/`` (a hard link to the
        blob, downloaded and verified once per blob under ``<cache>/blobs/``). Callers must not write to it."""
        check_path(path)
        sha = self._resolve(revision)
        entry = self._tree(sha).get(path)
        if entry is None or sha is None:  # (the empty repo has no files)
            at = "the empty repo" if sha is None else f"revision {revision or 'main'} ({sha})"
            raise NotFound(f"{path!r} not found at {at} of {self.location}")
        repo_key = hashlib.sha1(self.location.encode()).hexdigest()[:16]
        dest = self.cache_dir / "snapshots" / repo_key / sha / path
        if not dest.is_file():
            blob = self.blobs.local_file(*entry)
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.blobs.tmp()
            try:
                os.link(blob, tmp)
            except OSError:  # no hard links here (another filesystem): copy
                shutil.copyfile(blob, tmp)
            os.replace(tmp, dest)
        return dest

    def list_files(self, prefix: str = "", revision: str | None = None) -> list[str]:
        return files_under(self._tree(self._resolve(revision)), prefix)

    def file_sizes(self, prefix: str = "", revision: str | None = None) -> dict[str, int]:
        tree = self._tree(self._resolve(revision))
        return {p: tree[p][1] for p in files_under(tree, prefix)}

    def exists_file(self, path: str, revision: str | None = None) -> bool:
        return check_path(path) in self._tree(self._resolve(revision))

    def history(self, limit: int | None = None) -> list[CommitInfo]:
        """First-parent history of main, newest first."""
        return first_parents(self.head(), self._info, limit)

    def tags(self) -> dict[str, str]:
        """name → commit id; each tag object is read once (tags never move)."""
        self._require()
        names = [key[len(TAGS) :] for key, _ in self.objects.list(TAGS)]
        for name in names:
            with self._lock:
                known = name in self._tags
            if known:
                continue
            try:
                check_tag_name(name)
                data, _ = self.objects.get(TAGS + name, max_bytes=manifest.MAX_REF_BYTES)
            except (StoreError, NotFound):
                continue  # a key no hubgrpo wrote (or deleted meanwhile): not a tag
            sha = manifest.decode_ref(data, where=f"{self.location} tag {name}")
            with self._lock:
                self._tags[name] = sha
        with self._lock:
            return {n: self._tags[n] for n in names if n in self._tags}

    # ------------------------------------------------------------------------------------------ writes

    def commit(
        self, adds: Mapping[str, bytes | Path], deletes: Sequence[str] = (), *, message: str, parent: str | None = None
    ) -> str:
        """One atomic commit; see ``Store.commit`` and the module docstring. As on the other backends, deletes
        apply before adds, a missing delete raises NotFound, and a commit that changes nothing returns the head
        (except the first one of an empty repo)."""
        self._require()
        self._check_writes()
        if not isinstance(message, str) or not message.strip():
            raise StoreError("refusing a commit with an empty message", hint="say what the commit does")
        adds = {check_path(p): v for p, v in adds.items()}
        deletes = [checked_delete(d) for d in ([deletes] if isinstance(deletes, str) else deletes)]
        blobs = {p: self.blobs.put(v) for p, v in adds.items()}  # the slow part, before the head is read
        marker = str(uuid.uuid4())
        for attempt in itertools.count(1):
            head, etag = self._read_head()
            if parent is not None and not same_commit(parent, head):
                raise CommitConflict(
                    f"{self.location}: the head moved: expected parent {parent}, actual head {head}",
                    hint="re-read the repo at the new head, redo your change and commit again",
                )
            old = self._tree(head)
            new = apply_changes(old, blobs, deletes, head)
            if head is not None and new == old:
                return head
            sha, data = manifest.encode(new, head, message, marker, time.time())
            self._create(f"commits/{sha}.json", data, same_if_exists=True)
            if self._swap(sha, head, etag):
                return sha
            if parent is not None:
                raise CommitConflict(
                    f"{self.location}: another commit landed on {head} first",
                    hint="re-read the repo at the new head, redo your change and commit again",
                )
            if attempt >= self.max_commit_tries:
                raise RepoBusy(
                    f"{self.location}: the head kept moving; {attempt} tries to commit {message!r} lost",
                    hint="too many writers at once: retry later, or write less often",
                )
            self._sleep(min(1.0, 0.02 * 2 ** min(attempt, 6)) * random.uniform(0.5, 1.0))
        raise AssertionError("unreachable")

    def tag(self, name: str, revision: str, *, exist_ok: bool = False) -> None:
        """Tag ``revision`` (a commit id, a tag or 'main'). An existing tag is never moved."""
        check_tag_name(name)
        self._check_writes()
        sha = self._resolve(revision)
        if sha is None:
            raise NotFound(f"cannot tag {revision!r} in {self.location}: the repo has no commit yet")
        if self._create(TAGS + name, manifest.encode_ref(sha)):
            with self._lock:
                self._tags[name] = sha
            return
        if not exist_ok:
            raise StoreError(
                f"tag {name!r} already exists in {self.location}",
                code="exists",
                hint="pass exist_ok=True, or pick the next version number",
            )

    # ------------------------------------------------------------------------------------------ internals

    def _check_writes(self) -> None:
        """Once per store, before its first write: refuse a backend that ignores conditional writes (without
        them the head's compare-and-swap and the write-once objects protect nothing)."""
        with self._lock:
            if self._writes_checked:
                return
        self.objects.check_conditional_writes()
        with self._lock:
            self._writes_checked = True

    def _resolve(self, revision: str | None) -> str | None:
        """A commit id for a revision (None/'main' → head, a commit id, or a tag); None for an empty repo."""
        if revision is None or revision == "main":
            return self.head()
        if isinstance(revision, str) and SHA1_RE.fullmatch(revision):
            try:
                self._info(revision)
                return revision
            except NotFound:
                pass
        sha = self.tags().get(revision)
        if sha is None:
            raise NotFound(
                f"revision {revision!r} not found in {self.location}",
                hint="use a commit sha from history(), a tag from tags(), or 'main'",
            )
        return sha

    def _load(self, sha: str) -> tuple[CommitInfo, manifest.Tree]:
        data, _ = self.objects.get(f"commits/{sha}.json", max_bytes=manifest.MAX_MANIFEST_BYTES)
        info, tree = manifest.decode(sha, data, where=self.location)
        with self._lock:
            self._infos[sha] = info
            self._trees[sha] = tree
            while len(self._trees) > 16:
                self._trees.popitem(last=False)
        return info, tree

    def _info(self, sha: str) -> CommitInfo:
        with self._lock:
            info = self._infos.get(sha)
        return info if info is not None else self._load(sha)[0]

    def _tree(self, sha: str | None) -> manifest.Tree:
        """{path: (blob, size)} of a commit ({} for None). Shared: do not mutate it."""
        if sha is None:
            return {}
        with self._lock:
            tree = self._trees.get(sha)
            if tree is not None:
                self._trees.move_to_end(sha)
                return tree
        return self._load(sha)[1]

    def _create(self, rel: str, body: bytes, *, same_if_exists: bool = False) -> bool:
        """Create ``rel`` with IfNoneMatch="*": True when created (or already holding ``body``, when the answer
        to our own earlier try was lost, or always for content-addressed ``same_if_exists`` objects); False when
        another object is there."""
        uncertain = False
        for attempt in itertools.count(1):
            try:
                self.objects.put(rel, body, if_none_match=True, retry=False)
                return True
            except CommitConflict:
                if same_if_exists:
                    return True
                if not uncertain:
                    return False
                try:
                    return self.objects.get(rel, max_bytes=len(body))[0] == body
                except StoreError as e:
                    if e.code == "too_large":
                        return False
                    raise
            except (StoreUnavailable, RepoBusy) as e:
                uncertain = uncertain or isinstance(e, StoreUnavailable)
                if attempt > self.max_retries:
                    raise
                self._sleep(retry_delay(e, attempt, base_s=self.retry_base_s, cap_s=8.0) or 0.0)  # never None
        raise AssertionError("unreachable")

    def _swap(self, sha: str, head: str | None, etag: str | None) -> bool:
        """Point main at ``sha`` if it still is at ``head`` (read with ``etag``). True: done (perhaps by an
        earlier try whose answer was lost); False: another writer's commit is on top of ``head``."""
        body, uncertain = manifest.encode_ref(sha), False
        for attempt in itertools.count(1):
            try:
                self.objects.put(HEAD_REF, body, if_match=etag, if_none_match=etag is None, retry=False)
                return True
            except CommitConflict:
                return self._landed(sha, head) if uncertain else False
            except (StoreUnavailable, RepoBusy) as e:
                uncertain = uncertain or isinstance(e, StoreUnavailable)
                if attempt > self.max_retries:
                    if uncertain and self._landed(sha, head):
                        return True
                    raise
                self._sleep(retry_delay(e, attempt, base_s=self.retry_base_s, cap_s=8.0) or 0.0)  # never None
                if uncertain:
                    try:
                        now = self.head()
                    except StoreUnavailable:  # still out: try the swap again (IfMatch keeps it single)
                        continue
                    if now != head:  # moved: by our lost try, or by someone else (then ours can never land)
                        return self._landed(sha, head, now)
        raise AssertionError("unreachable")

    def _landed(self, sha: str, base: str | None, now: str | None = None) -> bool:
        """Whether commit ``sha`` (built on ``base``) is in main's first-parent history above ``base``."""
        cur = self.head() if now is None else now
        for _ in range(self.search_depth):
            if cur is None or cur == base:
                return False
            if cur == sha:
                return True
            info = self._info(cur)
            cur = info.parents[0] if info.parents else None
        return False
