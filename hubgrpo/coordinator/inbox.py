"""Where the coordinator finds submitted rounds: the run's inbox, the run repo itself (the default) or the place
``hub.submissions`` names.

``hub.submissions: coordinator`` is a ``FolderInbox`` on the coordinator's own disk, ``rounds_folder``:
``$HUBGRPO_CACHE/rounds/<run repo>/<run id>``, the disk that already keeps the run's lease secret
(``$HUBGRPO_CACHE/secrets``), not the coordinator's working folder, whose per-process folder goes when the
coordinator ends. A restarted coordinator on the same disk thus finds the rounds uploaded but not
merged; a new run in the same repo (``init --force``: a new run id) starts with an empty folder. On a Space, point
``HUBGRPO_CACHE`` at its persistent storage (``/data/…``) to keep them across restarts.

- ``RepoInbox``: a round is a commit of the run repo (a folder under ``submissions/``); ``submit`` names the commit.
  Every round is one commit, so rounds count against ``coordinator.commit_budget_per_hour`` (``in_repo``).
- ``ObjectInbox``: a round is four write-once objects in a ``FolderInbox`` or ``S3Inbox`` (``hubgrpo.store.inboxes``),
  ``submission.json`` last; ``submit`` names ``sha256:<hex>`` of that submission.json. Rounds cost no commit of the
  run repo: the budget then covers merges only. On S3 every lease carries presigned PUT URLs for its four keys
  (``upload_urls``), so a worker needs no bucket credentials; they are minted outside the coordinator's lock
  (``Coordinator.with_uploads``).

Both read a submission as untrusted input: an inbox folder is listed first, and refused before anything is read when
it holds other files, or more bytes than a valid submission can have (``max_bytes``); each object must have the
listed size while it is read. The scan of an inbox looks only at the base versions still young enough to be merged.
"""

from __future__ import annotations

import logging
import shutil
import uuid
from collections import OrderedDict
from pathlib import Path
from typing import Any

from hubgrpo import layout, runrepo
from hubgrpo.errors import InvalidSubmission, NotFound, StoreError
from hubgrpo.store.base import Store

log = logging.getLogger("hubgrpo.coordinator")
FILES = layout.SUBMISSION_FILES
RECORD_MAX = 8 << 20  # the largest submission.json read (as admission.read_record)
JUDGED_MAX = 50_000  # inbox records remembered as judged (refused or ignored): about 10 MB at most


def run_inbox(cfg, store: Store, *, run_id: str | None = None):
    """The inbox of a run: ``cfg.hub.submissions`` (an inbox), or the run repo itself when unset. ``run_id``: the
    run's (read from the repo when not given), which names the folder of ``hub.submissions: coordinator``."""
    spec = cfg.hub.submissions
    if not spec:
        return RepoInbox(store)
    from hubgrpo.store.inboxes import COORDINATOR, FolderInbox, open_inbox

    if spec == COORDINATOR:
        run_id = run_id if run_id is not None else runrepo.read_state(store).run_id
        return ObjectInbox(FolderInbox(rounds_folder(store.location, run_id)))
    inbox = open_inbox(spec)
    if hasattr(inbox, "ensure"):
        inbox.ensure()  # the bucket exists from the start (created when missing)
    upload_ttl = int(min(7 * 86400, max(900, 3 * cfg.coordinator.heartbeat_interval_s)))
    return ObjectInbox(inbox, upload_ttl_s=upload_ttl)


def rounds_folder(location: str, run_id: str) -> Path:
    """The folder of ``hub.submissions: coordinator`` for the run ``run_id`` in the repo at ``location``: under
    ``$HUBGRPO_CACHE/rounds``, one folder per repo (a readable tail of its location and a digest of all of it)
    and one per run in it (the run id as it is in state.json, kept to letters and digits)."""
    import hashlib

    slug = "".join(c if c.isalnum() else "_" for c in location)[-60:].strip("_") or "run"
    digest = hashlib.sha256(location.encode()).hexdigest()[:12]
    run = "".join(c for c in str(run_id) if c.isalnum())[:64] or "run"
    return runrepo.cache_root() / "rounds" / f"{slug}-{digest}" / run


def check_listing(prefix: str, sizes: dict[str, int], max_bytes: int, allowed=None) -> None:
    """Refuse a submission folder from its listing alone (names relative to ``prefix`` → sizes), before anything
    is read, with admission's codes: ``nested_dir``, ``not_safetensors``, ``unexpected_file``, ``too_large``.
    ``allowed``: the file names a folder may hold (default: those admission allows)."""
    from hubgrpo.merge.submission_checks import ALLOWED_FILES, PICKLE_SUFFIXES

    allowed = sorted(ALLOWED_FILES) if allowed is None else allowed
    for name in sorted(sizes):
        if "/" in name:
            raise InvalidSubmission(
                "nested_dir",
                f"{prefix} holds the folder {name.split('/')[0][:80]!r}/; a submission holds only {', '.join(allowed)}",
                hint="upload only the files",
            )
        if Path(name).suffix.lower() in PICKLE_SUFFIXES:
            raise InvalidSubmission(
                "not_safetensors",
                f"{prefix}/{name[:80]} is a pickle-based weight file, which is never loaded",
                hint="save the adapter as adapter_model.safetensors",
            )
        if name not in allowed:
            raise InvalidSubmission(
                "unexpected_file",
                f"{prefix} holds {name[:80]!r}, which is not allowed (allowed: {', '.join(allowed)})",
                hint="upload only the submission's files",
            )
    total = sum(sizes.values())
    if total > max_bytes:
        raise InvalidSubmission(
            "too_large",
            f"{prefix} holds {total:,} bytes, more than a submission of this run "
            f"can have ({max_bytes:,}); nothing was read",
            hint="submit only the LoRA adapter at the run's rank",
        )


class Judged:
    """Records already judged (refused or ignored), by (path, size, version): a scan never reads one again
    while it is unchanged. Bounded (the oldest are forgotten first, and then read once more); kept in memory, so
    a restarted coordinator reads each once more."""

    def __init__(self, limit: int = JUDGED_MAX):
        self.limit = int(limit)
        self._seen: OrderedDict[Any, None] = OrderedDict()  # judged entries, oldest first

    def __contains__(self, entry) -> bool:
        return entry in self._seen

    def __len__(self) -> int:
        return len(self._seen)

    def add(self, entry) -> None:
        self._seen[entry] = None
        self._seen.move_to_end(entry)
        while len(self._seen) > self.limit:
            self._seen.popitem(last=False)


class Scanned:
    """What both inboxes share for scans: the records the last scan listed (path, size, version), refused by their
    listed size before they are read (``RECORD_MAX``), and those already judged, which no scan reads again."""

    location: str  # where the records are (each inbox sets it): what messages name

    def __init__(self) -> None:
        self.judged_records = Judged()
        self._listed: dict[tuple[int, str], tuple[str, int, str]] = {}

    def _unjudged(self, entries, done: set[str]) -> list[tuple[int, str]]:
        """(base, submission id) of the records among ``entries`` neither ``done`` nor judged as they are now."""
        listed = {}
        for entry in entries:
            parsed = layout.parse_submission_path(entry[0])
            if (
                parsed
                and parsed[2] == layout.SUBMISSION_FILE
                and parsed[1] not in done
                and entry not in self.judged_records
            ):
                listed[parsed[:2]] = entry
        self._listed = listed
        return sorted(listed)

    def _check_record_size(self, base: int, sub_id: str) -> str:
        """The record's path; refused by its listed size (nothing is downloaded) when over ``RECORD_MAX``."""
        rel = layout.submission_path(base, sub_id, layout.SUBMISSION_FILE)
        entry = self._listed.get((base, sub_id))
        if entry is not None and entry[1] > RECORD_MAX:
            raise StoreError(
                f"{self.location}/{rel} is {entry[1]:,} bytes, more than the {RECORD_MAX:,} a "
                "submission record may have",
                code="too_large",
                hint="it is not read",
            )
        return rel

    def judged(self, base: int, sub_id: str) -> None:
        """Remember the record of ``sub_id`` as the last scan listed it: refused or ignored, it is not read again
        until it changes (``Judged``)."""
        entry = self._listed.get((base, sub_id))
        if entry is not None:
            self.judged_records.add(entry)


class RepoInbox(Scanned):
    """Submissions committed to the run repo (a record's version: its size only; a repo path is written once)."""

    in_repo = True

    def __init__(self, store: Store):
        super().__init__()
        self.store = store
        self.location = store.location

    def fetch(self, base: int, sub_id: str, commit: str, dest: Path, *, max_bytes: int) -> Path:
        """Copy the submission's files at ``commit`` into ``dest``, after checking their names and sizes in the
        repo's listing (``check_listing``): an oversized or unexpected file is refused before any byte of the
        folder is downloaded."""
        prefix = layout.submission_dir(base, sub_id)
        sizes = self.store.file_sizes(prefix, commit)
        if sizes:
            check_listing(prefix, {p[len(prefix) + 1 :]: n for p, n in sizes.items()}, max_bytes)
        return runrepo.submission_at(self.store, base, sub_id, commit, dest, sizes=sizes)

    def revision(self) -> str | None:
        return self.store.head()

    def unseen(self, done: set[str], revision: str | None, bases=None) -> list[tuple[int, str]]:
        sizes = self.store.file_sizes(layout.SUBMISSIONS, revision)
        return self._unjudged(((path, size, "") for path, size in sizes.items()), done)

    def read_record(self, base: int, sub_id: str, revision: str | None) -> bytes:
        return self.store.read(self._check_record_size(base, sub_id), revision)

    def upload_urls(self, lease, max_bytes: int) -> dict[str, str]:
        return {}

    def prune(self, state, keep: int | None, max_age: int) -> int:
        """Nothing to do: a merge commit deletes the repo's finished folders (``pruning.merge_deletes``)."""
        return 0


class ObjectInbox(Scanned):
    """Submissions as write-once objects in an inbox (a local folder or an S3 bucket/prefix)."""

    in_repo = False

    def __init__(self, objects, *, upload_ttl_s: int = 900):
        super().__init__()
        self.objects, self.upload_ttl_s = objects, int(upload_ttl_s)  # a FolderInbox or an S3Inbox
        self.location = objects.location
        self.pruned_at: int | None = None  # the version whose finished rounds were last deleted (``prune``)

    def fetch(self, base: int, sub_id: str, commit: str, dest: Path, *, max_bytes: int) -> Path:
        """Copy the submission's objects into ``dest`` after checking the listing; ``commit`` (``sha256:…``)
        must be the digest of its submission.json, when given."""
        if dest.is_dir():
            return dest
        prefix = layout.submission_dir(base, sub_id)
        listed = dict(self.objects.list(prefix))
        if not listed:
            raise NotFound(
                f"no submission at {prefix} in {self.location}",
                hint="upload the round's files (submission.json last) before calling submit",
            )
        names = {p[len(prefix) + 1 :]: size for p, size in listed.items()}
        check_listing(prefix, names, max_bytes, FILES)
        tmp = dest.with_name(dest.name + f".tmp-{uuid.uuid4().hex[:8]}")
        tmp.mkdir(parents=True)
        try:
            for name, size in names.items():
                self.objects.fetch(f"{prefix}/{name}", tmp / name, size=size, max_bytes=max_bytes)
            self._check_token(tmp, commit, prefix)
            tmp.rename(dest)
        except StoreError as e:
            raise InvalidSubmission(
                e.code if e.code in ("too_large", "symlink", "corrupt") else "not_found", e.message, hint=e.hint
            ) from None
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return dest

    def _check_token(self, folder: Path, commit: str, prefix: str) -> None:
        record = folder / layout.SUBMISSION_FILE
        if not commit.startswith("sha256:") or not record.is_file():
            return  # a scan (no token), or no record: admission says what is missing
        if layout.inbox_token(record.read_bytes()) != commit:
            raise InvalidSubmission(
                "bad_commit",
                f"{prefix}/{layout.SUBMISSION_FILE} is not the one submitted ({commit[:20]}…)",
                hint="submit the digest of the submission.json uploaded",
            )

    def revision(self) -> str | None:
        return None

    def unseen(self, done: set[str], revision: str | None, bases=None) -> list[tuple[int, str]]:
        """Rounds whose submission.json is in the inbox, neither ``done``, already judged as it is now, nor older
        than ``bases`` allows."""
        entries = [
            e
            for base in (bases if bases is not None else ())
            for e in self.objects.entries(f"{layout.SUBMISSIONS}/{base:06d}")
        ]
        return self._unjudged(entries, done)

    def read_record(self, base: int, sub_id: str, revision: str | None) -> bytes:
        return self.objects.read(self._check_record_size(base, sub_id), max_bytes=RECORD_MAX)

    def prune(self, state, keep: int | None, max_age: int) -> int:
        """Delete the objects of rounds finished as ``coordinator.keep_submissions`` says for folders in the repo
        (``pruning.doomed``: merged or refused more than ``keep`` versions ago, or too old to be admitted), once
        per version of ``state``; the number of objects deleted. Store I/O: call without the coordinator's lock."""
        from hubgrpo.coordinator.pruning import doomed

        if keep is None or state.version == self.pruned_at:
            return 0
        folders: dict[tuple[str, str], list[str]] = {}
        for path, _, _ in self.objects.entries(layout.SUBMISSIONS):
            parts = path.split("/")
            if len(parts) >= 4 and parts[1].isdigit():
                folders.setdefault((parts[1], parts[2]), []).append(path)
        rounds = doomed(folders, state, keep, max_age)
        gone = [p for folder in rounds for p in folders[folder]]
        if gone:
            self.objects.delete(gone)
            log.info("deleted %d objects of %d finished rounds from %s", len(gone), len(rounds), self.location)
        self.pruned_at = state.version
        return len(gone)

    def upload_urls(self, lease, max_bytes: int) -> dict[str, str]:
        """Presigned upload URLs for the lease's four keys (S3 inboxes), each capped at ``max_bytes`` (the record at
        ``RECORD_MAX``) where the store enforces caps (``S3Inbox.presign_upload``); {} when the inbox cannot sign (a
        folder) or the coordinator has no credentials to sign with (workers then write with their own)."""
        if not self.objects.can_presign:
            return {}
        sub_id = layout.submission_id(lease.worker, lease.lease_id)
        cap = int(max_bytes)
        try:
            return {
                name: self.objects.presign_upload(
                    layout.submission_path(lease.base_version, sub_id, name),
                    min(cap, RECORD_MAX) if name == layout.SUBMISSION_FILE else cap,
                    self.upload_ttl_s,
                )
                for name in FILES
            }
        except StoreError as e:
            log.warning("cannot sign upload URLs for %s: %s", sub_id, e.message)
            return {}
