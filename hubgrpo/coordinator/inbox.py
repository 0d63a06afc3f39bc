"""Where the coordinator finds submitted rounds: the run repo (the default) or the box ``hub.submissions`` names.

- ``RepoInbox``: a round is a commit of the run repo (a folder under ``submissions/``); ``submit`` names the commit.
  Every round is one commit, so rounds count against ``coordinator.commit_budget_per_hour`` (``in_repo``).
- ``BoxInbox``: a round is four write-once objects in a ``hubgrpo.store.boxes`` box, ``submission.json`` last;
  ``submit`` names ``sha256:<hex>`` of that submission.json. Rounds cost no commit of the run repo: the budget then
  covers merges only. On S3 every lease carries presigned PUT URLs for its four keys (``upload_urls``), so a
  worker needs no bucket credentials; they are minted outside the API lock (``Coordinator.with_uploads``).

Both read a submission as untrusted input: a box folder is listed first, and refused before anything is read when
it holds other files, or more bytes than a valid submission can have (``max_bytes``); each object must have the
listed size while it is read. The scan of a box looks only at the base versions still young enough to be merged.
"""

from __future__ import annotations

import logging
import shutil
import uuid
from pathlib import Path

from hubgrpo import layout, runrepo
from hubgrpo.errors import InvalidSubmission, NotFound, StoreError
from hubgrpo.store.base import Store

log = logging.getLogger("hubgrpo.coordinator")
FILES = layout.SUBMISSION_FILES
RECORD_MAX = 8 << 20  # the largest submission.json read (as admit.read_record)


def open_inbox(cfg, store: Store):
    """The inbox of a run: ``cfg.hub.submissions`` (a box), or the run repo itself when unset."""
    spec = cfg.hub.submissions
    if not spec:
        return RepoInbox(store)
    from hubgrpo.store.boxes import open_box

    box = open_box(spec)
    if hasattr(box, "ensure"):
        box.ensure()  # the bucket exists from the start (created when missing)
    upload_ttl = int(min(7 * 86400, max(900, 3 * cfg.coordinator.heartbeat_interval_s)))
    return BoxInbox(box, upload_ttl_s=upload_ttl)


class RepoInbox:
    """Submissions committed to the run repo."""

    in_repo = True

    def __init__(self, store: Store):
        self.store = store
        self.location = store.location

    def fetch(self, base: int, sub_id: str, commit: str, dest: Path, *, max_bytes: int) -> Path:
        return runrepo.submission_at(self.store, base, sub_id, commit, dest)

    def revision(self) -> str | None:
        return self.store.head()

    def unseen(self, done: set[str], revision: str | None, bases=None) -> list[tuple[int, str]]:
        seen: dict[str, int] = {}
        for path in self.store.list_files(layout.SUBMISSIONS, revision):
            parsed = layout.parse_submission_path(path)
            if parsed and parsed[2] == layout.SUBMISSION_FILE and parsed[1] not in done:
                seen[parsed[1]] = parsed[0]
        return sorted((base, sub_id) for sub_id, base in seen.items())

    def read_record(self, base: int, sub_id: str, revision: str | None) -> bytes:
        return self.store.read(layout.submission_path(base, sub_id, layout.SUBMISSION_FILE), revision)

    def upload_urls(self, lease) -> dict[str, str]:
        return {}


class BoxInbox:
    """Submissions as write-once objects in a box (a local folder or an S3 bucket/prefix)."""

    in_repo = False

    def __init__(self, box, *, upload_ttl_s: int = 900):
        self.box, self.upload_ttl_s = box, int(upload_ttl_s)
        self.location = box.location

    def fetch(self, base: int, sub_id: str, commit: str, dest: Path, *, max_bytes: int) -> Path:
        """Copy the submission's objects into ``dest`` after checking the listing; ``commit`` (``sha256:…``)
        must be the digest of its submission.json, when given."""
        if dest.is_dir():
            return dest
        prefix = layout.submission_dir(base, sub_id)
        listed = dict(self.box.list(prefix))
        if not listed:
            raise NotFound(f"no submission at {prefix} in {self.location}",
                           hint="upload the round's files (submission.json last) before calling submit")
        names = {p[len(prefix) + 1:]: size for p, size in listed.items()}
        odd = sorted(n for n in names if n not in FILES)
        if odd:
            raise InvalidSubmission("unexpected_file", f"{prefix} holds {odd[0][:80]!r}, which is not allowed "
                                    f"(allowed: {', '.join(FILES)})", hint="upload only the submission's files")
        total = sum(names.values())
        if total > max_bytes:
            raise InvalidSubmission("too_large", f"{prefix} holds {total:,} bytes, more than a submission of this "
                                    f"run can have ({max_bytes:,}); nothing was read",
                                    hint="submit only the LoRA adapter at the run's rank")
        tmp = dest.with_name(dest.name + f".tmp-{uuid.uuid4().hex[:8]}")
        tmp.mkdir(parents=True)
        try:
            for name, size in names.items():
                self.box.fetch(f"{prefix}/{name}", tmp / name, size=size, max_bytes=max_bytes)
            self._check_token(tmp, commit, prefix)
            tmp.rename(dest)
        except StoreError as e:
            raise InvalidSubmission(e.code if e.code in ("too_large", "symlink", "corrupt") else "not_found",
                                    e.message, hint=e.hint) from None
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return dest

    def _check_token(self, folder: Path, commit: str, prefix: str) -> None:
        record = folder / layout.SUBMISSION_FILE
        if not commit.startswith("sha256:") or not record.is_file():
            return  # a scan (no token), or no record: admission says what is missing
        if layout.box_token(record.read_bytes()) != commit:
            raise InvalidSubmission("bad_commit", f"{prefix}/{layout.SUBMISSION_FILE} is not the one submitted "
                                    f"({commit[:20]}…)", hint="submit the digest of the submission.json uploaded")

    def revision(self) -> str | None:
        return None

    def unseen(self, done: set[str], revision: str | None, bases=None) -> list[tuple[int, str]]:
        """Rounds whose submission.json is in the box, neither ``done`` nor older than ``bases`` allows."""
        out = set()
        for base in bases if bases is not None else ():
            for path, _ in self.box.list(f"{layout.SUBMISSIONS}/{base:06d}"):
                parsed = layout.parse_submission_path(path)
                if parsed and parsed[2] == layout.SUBMISSION_FILE and parsed[1] not in done:
                    out.add((parsed[0], parsed[1]))
        return sorted(out)

    def read_record(self, base: int, sub_id: str, revision: str | None) -> bytes:
        return self.box.read(layout.submission_path(base, sub_id, layout.SUBMISSION_FILE), max_bytes=RECORD_MAX)

    def upload_urls(self, lease) -> dict[str, str]:
        """Presigned PUT URLs for the lease's four keys (S3 boxes); {} when the box cannot sign (a folder) or
        the coordinator has no credentials to sign with (workers then write with their own)."""
        if not self.box.can_presign:
            return {}
        sub_id = layout.submission_id(lease.worker, lease.lease_id)
        try:
            return {name: self.box.presign_put(layout.submission_path(lease.base_version, sub_id, name),
                                               self.upload_ttl_s) for name in FILES}
        except StoreError as e:
            log.warning("cannot sign upload URLs for %s: %s", sub_id, e.message)
            return {}
