"""HubStore: the run repo as a Hugging Face Hub model repo, through the unmodified ``HfApi``.

Hub HTTP answers become ``hubgrpo.errors`` in ``hubgrpo.store.hub_errors`` (``map_error``); this module is the only
place with a retry policy for the Hub (``retry_delay``, shared with ``hubgrpo.store.s3``):

- 412 → ``CommitConflict`` (the head moved: never retried here, the caller re-reads and decides);
- 409 on a commit → ``RepoBusy`` (one commit per repo at a time; the head has not moved) → retried with backoff;
- 429 → ``RateLimited`` with the server's wait (``RateLimit: "api";r=0;t=N`` or ``Retry-After``) → waited, retried;
- 5xx, 408, timeouts, dropped connections → ``StoreUnavailable`` → retried with bounded exponential backoff;
- 401/403 → ``AuthError``; missing repo / revision / file → ``NotFound``.

``POST …/commit`` is not idempotent and its answer can be lost after the commit landed. Every commit therefore
carries a unique marker (``MARKER_PREFIX + uuid4``) in its description; after an uncertain failure the recent
history is searched for it before any retry, so a commit is never made twice. When ``parent`` was given and the
head moved because *our* commit landed, that is success, not a conflict. Without ``parent``, a retry after an
uncertain failure is pinned to the head just inspected, so a late landing of the first try makes the retry fail
(412) instead of duplicating it.

Downloads go through ``hf_hub_download`` into the HF cache; a 40-hex revision is immutable there, so reading at a
sha is served from disk after the first time. ``HF_ENDPOINT``/``HF_TOKEN`` are honoured when endpoint/token are None.
"""

from __future__ import annotations

import itertools
import os
import re
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi, RepoFile, constants, hf_hub_download
from huggingface_hub.errors import (
    EntryNotFoundError,
)
from huggingface_hub.utils import build_hf_headers, paginate, parse_datetime

from hubgrpo.errors import (
    CommitConflict,
    NotFound,
    StoreError,
    StoreUnavailable,
)
from hubgrpo.store.base import MARKER_PREFIX, CommitInfo, Store, check_path, check_tag_name
from hubgrpo.store.hub_errors import HUB_ERRORS, exists_error, map_error  # the first and last: also from here
from hubgrpo.store.retry import retry_delay

T = TypeVar("T")
PARENT_RE = re.compile(r"[0-9a-fA-F]{5,40}")


class HubStore(Store):
    """A run repo on the Hugging Face Hub (or any Hub-compatible endpoint, such as the test emulator)."""

    hourly_commit_quota = 128  # commits per repo per hour the Hub allows (a 429 past it): checkpoint.interval_s

    def __init__(
        self,
        repo_id: str,
        *,
        token: str | bool | None = None,  # as HfApi takes it (True: the saved login)
        endpoint: str | None = None,
        repo_type: str = "model",
        api: HfApi | None = None,
        sleep: Callable[[float], None] = time.sleep,
        max_retries: int = 8,
        max_wait_s: float = 900.0,
        cache_dir: str | Path | None = None,
        marker_search_depth: int = 200,
        retry_base_s: float = 1.0,
    ):
        """``api`` replaces the HfApi built from endpoint/token; ``sleep`` is injected for tests; ``cache_dir``
        defaults to the HF cache; ``marker_search_depth`` bounds the lost-answer search in recent history."""
        if api is not None:
            endpoint, token = endpoint or api.endpoint, token if token is not None else api.token
        self.endpoint = (endpoint or os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")
        self.token = token if token is not None else os.environ.get("HF_TOKEN") or None
        self.api = api or HfApi(endpoint=self.endpoint, token=self.token, library_name="hubgrpo")
        self.repo_id, self.repo_type = repo_id, repo_type
        self.max_retries, self.max_wait_s = int(max_retries), float(max_wait_s)
        self.cache_dir = str(cache_dir) if cache_dir is not None else None
        self.marker_search_depth = int(marker_search_depth)
        self.retry_base_s = float(retry_base_s)
        self._sleep = sleep
        prefix = "" if repo_type == "model" else f"{repo_type}s/"
        self.location = f"{self.endpoint}/{prefix}{repo_id}"

    def __repr__(self) -> str:
        return f"HubStore({self.location!r})"

    # -- the retry loop ------------------------------------------------------------------------------------
    def _run(
        self,
        what: str,
        fn: Callable[[bool], T],
        *,
        recover: Callable[[], T | None] | None = None,
        on_409: Callable[[str], StoreError] | None = None,
        guard_conflicts: bool = False,
    ) -> T:
        """Call ``fn(uncertain)`` until it succeeds, retrying transient errors per ``retry_delay``.

        ``uncertain`` turns True after a failure whose outcome is unknown (5xx, timeout, dropped connection);
        from then on ``recover()`` runs before each retry and before giving up: a non-None result means the
        earlier try landed after all and is returned. ``guard_conflicts``: a 412 after an uncertain failure comes
        from our own pinned retry (see ``commit``) and just means "look again".
        """
        uncertain = False
        for attempt in itertools.count(1):
            try:
                if uncertain and recover is not None:
                    found = recover()
                    if found is not None:
                        return found
                return fn(uncertain)
            except HUB_ERRORS as exc:
                err = map_error(exc, what=what, repo=self.location, on_409=on_409)
            except StoreUnavailable as exc:  # already mapped by a nested call (e.g. ``recover``)
                err = exc
            uncertain = uncertain or isinstance(err, StoreUnavailable)
            delay = retry_delay(err, attempt, base_s=self.retry_base_s)
            if guard_conflicts and uncertain and isinstance(err, CommitConflict):
                delay = 0.0
            if delay is None or attempt > self.max_retries or delay > self.max_wait_s:
                found = self._last_look(recover) if uncertain else None
                if found is not None:
                    return found
                raise err
            self._sleep(delay)
        raise AssertionError("unreachable")

    def _last_look(self, recover: Callable[[], T | None] | None) -> T | None:
        """One final ``recover()`` before giving up; its own failures are ignored (the original error wins)."""
        if recover is None:
            return None
        try:
            return recover()
        except HUB_ERRORS + (StoreError,):
            return None

    # -- repo ----------------------------------------------------------------------------------------------
    def create(self, *, exist_ok: bool = True, private: bool = True) -> None:
        """Create the repo (private by default). A lost answer is recognised by the repo existing afterwards."""
        self._run(
            "create repo",
            lambda _u: self.api.create_repo(
                self.repo_id, repo_type=self.repo_type, private=private, exist_ok=exist_ok, token=self.token
            ),
            recover=lambda: True if self.exists() else None,
            on_409=exists_error("the repo"),
        )

    def exists(self) -> bool:
        return self._run(
            "check repo", lambda _u: self.api.repo_exists(self.repo_id, repo_type=self.repo_type, token=self.token)
        )

    def head(self) -> str | None:
        """The sha of ``main`` (None for a repo without commits, which the Hub never has)."""
        info = self._run(
            "read head", lambda _u: self.api.repo_info(self.repo_id, repo_type=self.repo_type, token=self.token)
        )
        return info.sha

    # -- reading -------------------------------------------------------------------------------------------
    def _revision(self, revision: str | None) -> str:
        if revision is not None:
            return revision
        head = self.head()
        if head is None:
            raise NotFound(f"{self.location} has no commit yet", hint="commit something first")
        return head

    def local_path(self, path: str, revision: str | None = None) -> Path:
        """The cached file for ``path`` at ``revision`` (downloaded once per revision into the HF cache)."""
        check_path(path)
        rev = self._revision(revision)
        return Path(
            self._run(
                f"download {path}@{rev[:12]}",
                lambda _u: hf_hub_download(
                    self.repo_id,
                    path,
                    repo_type=self.repo_type,
                    revision=rev,
                    endpoint=self.endpoint,
                    token=self.token,
                    cache_dir=self.cache_dir,
                ),
            )
        )

    def read(self, path: str, revision: str | None = None) -> bytes:
        return self.local_path(path, revision).read_bytes()

    def list_files(self, prefix: str = "", revision: str | None = None) -> list[str]:
        """All files under folder ``prefix`` (recursive, sorted); a missing folder is an empty list."""
        return sorted(self.file_sizes(prefix, revision))

    def file_sizes(self, prefix: str = "", revision: str | None = None) -> dict[str, int]:
        """{path: size} of the files under folder ``prefix``, from the repo's tree listing (no download)."""
        folder = prefix.strip("/")
        if folder:
            check_path(folder)

        def list_once(_uncertain: bool) -> dict[str, int]:
            try:
                entries = list(
                    self.api.list_repo_tree(
                        self.repo_id,
                        folder or None,
                        recursive=True,
                        revision=revision,
                        repo_type=self.repo_type,
                        token=self.token,
                    )
                )
            except EntryNotFoundError:
                return {}
            return {e.path: int(e.size) for e in entries if isinstance(e, RepoFile)}

        return self._run(f"list {folder or '/'}", list_once)

    # -- history and tags ----------------------------------------------------------------------------------
    def _commits(self):
        """Raw commit items of ``main``, newest first, fetched page by page (lazily)."""
        url = f"{self.endpoint}/api/{self.repo_type}s/{self.repo_id}/commits/main"
        return paginate(url, params={}, headers=build_hf_headers(token=self.token, library_name="hubgrpo"))

    def history(self, limit: int | None = None) -> list[CommitInfo]:
        """Commits of main, newest first (``parents`` from the linear history of the branch)."""

        def fetch(_uncertain: bool) -> list[dict]:
            return list(itertools.islice(self._commits(), None if limit is None else limit + 1))

        items = self._run("read history", fetch)
        out = []
        for i, item in enumerate(items[:limit] if limit is not None else items):
            parents = (items[i + 1]["id"],) if i + 1 < len(items) else ()
            out.append(
                CommitInfo(
                    sha=item["id"],
                    message=item.get("title") or "",
                    created_at=parse_datetime(item["date"]).timestamp(),
                    marker=_marker_of(item.get("message") or ""),
                    parents=parents,
                )
            )
        return out

    def tag(self, name: str, revision: str, *, exist_ok: bool = False) -> None:
        """Tag ``revision``. A lost answer is recognised by the tag pointing at ``revision`` afterwards."""
        check_tag_name(name)
        self._run(
            f"tag {name}",
            lambda _u: self.api.create_tag(
                self.repo_id, tag=name, revision=revision, repo_type=self.repo_type, token=self.token, exist_ok=exist_ok
            ),
            recover=lambda: True if self.tags().get(name) == revision else None,
            on_409=exists_error(f"tag {name}"),
        )

    def tags(self) -> dict[str, str]:
        refs = self._run(
            "list tags", lambda _u: self.api.list_repo_refs(self.repo_id, repo_type=self.repo_type, token=self.token)
        )
        return {t.name: t.target_commit for t in refs.tags}

    # -- committing ----------------------------------------------------------------------------------------
    def commit(
        self, adds: Mapping[str, bytes | Path], deletes: Sequence[str] = (), *, message: str, parent: str | None = None
    ) -> str:
        """One atomic commit (see the module docstring for CAS, retries and lost answers)."""
        self._check_commit(adds, deletes, message, parent)
        marker = f"{MARKER_PREFIX}{uuid.uuid4()}"
        pin: list[str | None] = [parent]  # what we send as parent_commit; re-pinned after uncertain failures

        def recover() -> str | None:
            found, head = self._find_marker(marker, stop_at=parent)
            if parent is None:
                pin[0] = head
            return found

        def attempt(_uncertain: bool) -> str:
            """One ``create_commit``; a client-side no-op while the head moved past ``parent`` is a conflict."""
            ops = _operations(adds, deletes)
            info = self.api.create_commit(
                self.repo_id,
                ops,
                commit_message=message,
                commit_description=marker,
                parent_commit=pin[0],
                repo_type=self.repo_type,
                token=self.token,
            )
            if parent is not None and info.oid.lower() != parent.lower() and _all_unchanged(ops):
                raise CommitConflict(
                    f"commit on {self.location}: nothing changed, but the head moved past {parent}",
                    hint="re-read the head and decide again",
                )
            return info.oid

        return self._run(f"commit {message!r}", attempt, recover=recover, guard_conflicts=parent is None)

    def _check_commit(
        self, adds: Mapping[str, bytes | Path], deletes: Sequence[str], message: str, parent: str | None
    ) -> None:
        """Refuse, before any request, what the Hub or the client would refuse (or what could never succeed)."""
        where = f"commit on {self.location}"
        if not isinstance(message, str) or not message.strip():
            raise StoreError(f"{where}: refusing an empty commit message", hint="say what the commit does")
        for p in list(adds) + [d.rstrip("/") for d in deletes]:
            check_path(p)
        for p, value in adds.items():
            if not isinstance(value, (bytes, bytearray, memoryview, os.PathLike)):
                raise StoreError(
                    f"{where}: values must be bytes or a Path, not {type(value).__name__} (for {p})",
                    hint="wrap file names in pathlib.Path; encode text with .encode()",
                )
            if isinstance(value, os.PathLike) and not Path(value).is_file():
                raise StoreError(f"{where}: cannot upload {value}: no such local file", hint="check the path")
        if parent is not None and not PARENT_RE.fullmatch(parent):
            raise CommitConflict(
                f"{where}: {parent!r} is not a commit sha, so it cannot be the head",
                hint="pass the sha returned by head() or commit()",
            )

    def _find_marker(self, marker: str, *, stop_at: str | None) -> tuple[str | None, str | None]:
        """(sha of the commit carrying ``marker`` or None, current head), searching newest commits first."""
        head = None
        for item in itertools.islice(self._commits(), self.marker_search_depth):
            head = head or item["id"]
            if marker in (item.get("message") or "").splitlines():
                return item["id"], head
            if stop_at is not None and item["id"].lower().startswith(stop_at.lower()):
                break
        return None, head


def _marker_of(description: str) -> str | None:
    """The id after ``MARKER_PREFIX`` in a commit description, if any."""
    for line in description.splitlines():
        if line.startswith(MARKER_PREFIX):
            return line[len(MARKER_PREFIX) :].strip()
    return None


def _operations(adds: Mapping[str, bytes | Path], deletes: Sequence[str]) -> list:
    """Fresh commit operations (the client mutates them, so they are rebuilt for every try)."""
    ops: list = []
    for path, content in adds.items():
        src = os.fspath(content) if isinstance(content, os.PathLike) else bytes(content)
        ops.append(CommitOperationAdd(path_in_repo=path, path_or_fileobj=src))
    for path in deletes:
        ops.append(CommitOperationDelete(path_in_repo=path, is_folder=path.endswith("/")))
    return ops


def _all_unchanged(ops: list) -> bool:
    """True when the client skipped the commit because every add matched the remote file (and nothing is deleted)."""
    if any(isinstance(op, CommitOperationDelete) for op in ops):
        return False
    try:
        return all(op._remote_oid is not None and op._remote_oid == op._local_oid for op in ops)
    except AttributeError:  # client internals changed: assume a real commit happened
        return False
