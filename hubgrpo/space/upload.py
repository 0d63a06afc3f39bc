"""Submissions through the coordinator, for workers without write access to the run repo (no gradio here).

A worker calls the ``upload`` endpoint with its lease and its submission folder as ``{file name: base64}``, or
on the plain route as a binary body with the files as they are (``hubgrpo.upload_body``;
``CoordinatorClient.upload``). The coordinator then

1. checks the lease (signature, run, deadline, staleness) and the upload (only ``adapter_model.safetensors``,
   ``adapter_config.json``, ``rollouts.json.gz`` and ``submission.json``; at most what a round of the run can weigh
   decoded, ``round_bytes``: the global adapter's size and the rollouts limit) and runs every
   ``hubgrpo.merge.submission_checks`` check and the submission-record check on a temporary copy — BEFORE anything is
   committed, so junk never reaches the repo (a refusal is recorded like any other, with its reason);
2. queues it in a ``SubmissionBatcher``, which commits every queued submission in ONE commit (no parent:
   submission paths are disjoint) when ``batch_size`` are waiting or ``batch_wait_s`` after the first arrived;
3. calls ``Coordinator.submit(lease, <batch commit>)`` for each (it takes its lock itself) and answers the worker with
   that result (``admitted`` / ``merged`` / ``duplicate``) plus ``commit`` and ``batch`` (submissions in it).

The call blocks until its batch is committed and submitted (≈ ``batch_wait_s`` at most, plus the commit). A retry
of an upload still in its batch joins it; a retry after it was submitted answers ``duplicate``. The batch commit
is made with the coordinator's own token. Budget: ``Coordinator.submit`` still counts one commit per submission in
its live ``commit_times`` (conservative); after a restart the count comes from the repo history, which holds one
commit per batch.

When ``hub.submissions`` names an inbox (``hub.submissions: coordinator``: a folder on the coordinator's own disk; or
a folder or S3 inbox of the run) there is no commit to share, so nothing is batched: in the request's own thread the
decoded round is put in the inbox (its record last: a coordinator that dies now finds the round by its next scan)
and submitted (from memory: nothing is written twice), and ``submit`` runs every check once, on the copy it reads
back from the inbox. A refused round is
deleted from the inbox at once; the worker gets the verdict (``commit`` is the round's ``sha256:`` token).
"""

from __future__ import annotations

import base64
import binascii
import logging
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from hubgrpo import layout
from hubgrpo.errors import CoordinatorError, HubGrpoError, InvalidSubmission, LeaseError
from hubgrpo.layout import Lease

if TYPE_CHECKING:
    from hubgrpo.coordinator.core import Coordinator

log = logging.getLogger("hubgrpo.space.app")

UPLOAD_FILES = layout.SUBMISSION_FILES


@dataclass
class QueuedSubmission:
    """One checked submission waiting for its batch commit; ``done`` is set with ``result`` or ``error``."""

    lease: Lease
    sub_id: str
    folder: Path
    done: threading.Event = field(default_factory=threading.Event)
    result: dict | None = None
    error: BaseException | None = None


class SubmissionBatcher:
    """Commits queued submissions in batches (one commit each), then submits every one to the coordinator."""

    def __init__(self, coord: Coordinator, *, batch_size: int = 8, batch_wait_s: float = 5.0, on_merge_due=None):
        """``on_merge_due()`` is called when a submit makes a merge due (the server's tick thread then merges)."""
        if batch_size < 1 or batch_wait_s < 0:
            raise ValueError("batch_size must be >= 1 and batch_wait_s >= 0")
        self.coord, self.on_merge_due = coord, on_merge_due
        self.batch_size, self.batch_wait_s = int(batch_size), float(batch_wait_s)
        self.commits: list[tuple[str, int]] = []  # (sha, submissions in it), for the status page and tests
        self._queue: list[QueuedSubmission] = []
        self._by_id: dict[str, QueuedSubmission] = {}  # queued or being committed
        self._first_at: float | None = None
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    def add(self, item: QueuedSubmission) -> QueuedSubmission:
        """Queue ``item`` (or return the one already queued for the same submission id)."""
        with self._cond:
            if self._closed:
                raise CoordinatorError("the coordinator is shutting down", code="closing", hint="retry in a minute")
            known = self._by_id.get(item.sub_id)
            if known is not None:
                shutil.rmtree(item.folder, ignore_errors=True)
                return known
            self._by_id[item.sub_id] = item
            self._queue.append(item)
            self._first_at = self._first_at or time.monotonic()
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="hubgrpo-upload-batcher", daemon=True)
                self._thread.start()
            self._cond.notify_all()
        return item

    def wait(self, item: QueuedSubmission, timeout: float) -> dict:
        """Block until ``item``'s batch is committed and submitted; its result or its error."""
        if not item.done.wait(timeout):
            raise CoordinatorError(
                f"submission {item.sub_id} is still being committed after {timeout:.0f} s",
                code="upload_timeout",
                hint="retry the upload: it joins the pending batch",
            )
        if item.error is not None:
            raise item.error
        return dict(item.result or {})

    def _run(self) -> None:
        """The flusher thread: waits until a batch is full or old enough, then flushes it."""
        while True:
            with self._cond:
                while not self._due():
                    if self._closed and not self._queue:
                        return
                    timeout = (
                        None
                        if self._first_at is None
                        else max(0.0, self._first_at + self.batch_wait_s - time.monotonic())
                    )
                    self._cond.wait(timeout if timeout is not None else 1.0)
                batch, self._queue, self._first_at = (
                    self._queue[: self.batch_size],
                    self._queue[self.batch_size :],
                    None,
                )
                if self._queue:
                    self._first_at = time.monotonic()
            self.flush(batch)

    def _due(self) -> bool:
        if not self._queue:
            return False
        full = len(self._queue) >= self.batch_size
        return full or self._closed or time.monotonic() >= (self._first_at or 0.0) + self.batch_wait_s

    def flush(self, batch: list[QueuedSubmission]) -> None:
        """One commit with every submission folder of ``batch``, then ``coord.submit`` for each."""
        adds = {
            layout.submission_path(it.lease.base_version, it.sub_id, f.name): f
            for it in batch
            for f in sorted(it.folder.iterdir())
        }
        try:
            sha = self.coord.store.commit(adds, message=f"hubgrpo: {len(batch)} submission(s) via the coordinator")
            self.commits.append((sha, len(batch)))
        except HubGrpoError as e:
            log.warning("batch commit of %d submissions failed: %s", len(batch), e.message)
            return self._finish(batch, error=e)
        except Exception as e:  # deliberate: every waiting worker must get an answer
            log.exception("batch commit failed")
            return self._finish(
                batch,
                error=CoordinatorError(
                    f"the batch commit failed: {type(e).__name__}", code="internal", hint="retry the upload"
                ),
            )
        for i, it in enumerate(batch):
            try:  # one commit for the whole batch: count it once in the commit budget
                answer = self.coord.submit(it.lease, sha, count_commit=i == 0)
                it.result = {**answer, "commit": sha, "batch": len(batch)}
                if answer.get("merge_due") and self.on_merge_due is not None:
                    self.on_merge_due()
            except Exception as e:  # deliberate: the error goes back to that worker only
                it.error = e
        self._finish(batch)

    def _finish(self, batch: list[QueuedSubmission], error: BaseException | None = None) -> None:
        with self._cond:
            for it in batch:
                self._by_id.pop(it.sub_id, None)
        for it in batch:
            if error is not None:
                it.error = error
            shutil.rmtree(it.folder, ignore_errors=True)
            it.done.set()

    def close(self, timeout: float = 30.0) -> None:
        """Flush what is queued and stop the thread."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)


# ------------------------------------------------------------------------------------------------ the endpoint


def decode_files(files, limit_bytes: int) -> dict[str, bytes]:
    """The uploaded files as ``{name: bytes}``, from base64 text (the JSON body) or bytes (the binary body,
    ``hubgrpo.upload_body``); only the submission's files, at most ``limit_bytes`` decoded. Raises
    ``InvalidSubmission`` (``bad_upload`` / ``unexpected_file`` / ``too_large``)."""
    if not isinstance(files, dict) or not files:
        raise InvalidSubmission(
            "bad_upload", "the upload holds no files", hint=f"send {{file name: base64}} for {', '.join(UPLOAD_FILES)}"
        )
    for name, data in files.items():
        if name not in UPLOAD_FILES:
            raise InvalidSubmission(
                "unexpected_file",
                f"{str(name)[:80]!r} may not be uploaded (allowed: {', '.join(UPLOAD_FILES)})",
                hint="upload only the submission's files",
            )
        if not isinstance(data, (str, bytes)):
            raise InvalidSubmission("bad_upload", f"{name} is not a base64 string")
    size = sum(len(v) * 3 // 4 if isinstance(v, str) else len(v) for v in files.values())
    if size > limit_bytes:
        raise InvalidSubmission(
            "too_large",
            f"the upload holds about {size:,} bytes, more than a round of this run can weigh ({limit_bytes:,})",
            hint="submit only the LoRA adapter at the run's rank",
        )
    out = {}
    for name, data in files.items():
        try:
            out[name] = base64.b64decode(data, validate=True) if isinstance(data, str) else data
        except (binascii.Error, ValueError):
            raise InvalidSubmission("bad_upload", f"{name} is not valid base64", hint="encode with base64.b64encode")
    return out


def write_files(files: dict[str, bytes], dest: Path) -> Path:
    """The decoded files written into the folder ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (dest / name).write_bytes(data)
    return dest


def round_bytes(coord: Coordinator) -> int:
    """The most a round of this run can weigh: a submission of the global adapter's size (at most
    ``merge.max_submission_mb``) plus the largest rollouts file a lease can ask for (``rounds.balance``
    leases up to 4 × ``rounds.steps`` steps), with 1 % for gzip's overhead on what does not compress."""
    from types import SimpleNamespace

    from hubgrpo.merge.submission_checks import max_submission_bytes
    from hubgrpo.task.rollouts import size_limit

    cfg = coord.cfg
    files = min(int(cfg.merge.max_submission_mb * 2**20), max_submission_bytes(coord.global_adapter()))
    longest = SimpleNamespace(steps=4 * cfg.rounds.steps, params={})
    return files + size_limit(cfg, longest) * 101 // 100


def upload_body_limit(coord: Coordinator) -> int:
    """The largest ``upload`` request body: a round (``round_bytes``) in base64, and 1 MiB for the lease and JSON."""
    return -(-round_bytes(coord) // 3) * 4 + (1 << 20)


def binary_body_limit(coord: Coordinator) -> int:
    """The largest binary ``upload`` body (``hubgrpo.upload_body``): a round as it is, and its JSON head."""
    from hubgrpo.upload_body import MAX_HEAD

    return round_bytes(coord) + MAX_HEAD + 4


class Uploads:
    """The ``upload`` endpoint's logic: check before committing, then hand over to the batcher and wait; or, with
    rounds in an inbox, put the round there and submit it (``_into_inbox``)."""

    def __init__(
        self,
        coord: Coordinator,
        *,
        batch_size: int = 8,
        batch_wait_s: float = 5.0,
        workdir: Path | None = None,
        wait_timeout_s: float = 300.0,
        on_merge_due=None,
    ):
        self.coord, self.on_merge_due = coord, on_merge_due
        self.batcher = SubmissionBatcher(
            coord, batch_size=batch_size, batch_wait_s=batch_wait_s, on_merge_due=on_merge_due
        )
        scratch = getattr(coord, "scratch", None)  # the coordinator process's own folder: cleared after it
        self.workdir = Path(
            workdir or (scratch / "uploads" if scratch else tempfile.mkdtemp(prefix="hubgrpo-uploads-"))
        )
        self.wait_timeout_s = float(wait_timeout_s)

    def handle(self, lease: Lease, files) -> dict:
        """Check ``files`` for ``lease`` (already authenticated and parsed), queue, wait for the batch's answer."""
        c = self.coord
        sub_id = layout.submission_id(lease.worker, lease.lease_id)
        if not c.upload_precheck(lease):
            return {"status": "duplicate", "submission_id": sub_id, "version": c.state.version}
        limit = round_bytes(c)
        folder = self.workdir / f"{sub_id}-{time.monotonic_ns()}"
        inbox = c.inbox
        outside_repo = not inbox.in_repo
        try:
            decoded = decode_files(files, limit)
            if not outside_repo:
                c.check_upload(lease, write_files(decoded, folder))  # every check first: no junk in the repo
            elif layout.SUBMISSION_FILE not in decoded:
                raise InvalidSubmission(
                    "no_record",
                    f"the upload of {sub_id} holds no {layout.SUBMISSION_FILE}",
                    hint="upload every file of the round, submission.json included",
                )
        except InvalidSubmission as e:
            shutil.rmtree(folder, ignore_errors=True)
            c.record_refusal(lease, e)
            raise
        except BaseException:  # an expired lease, a version the coordinator lost, ...: no bytes left behind
            shutil.rmtree(folder, ignore_errors=True)
            raise
        if outside_repo:
            return self._into_inbox(inbox.objects, lease, sub_id, decoded)
        item = self.batcher.add(QueuedSubmission(lease=lease, sub_id=sub_id, folder=folder))
        return self.batcher.wait(item, self.wait_timeout_s)

    def _into_inbox(self, inbox, lease: Lease, sub_id: str, files: dict[str, bytes]) -> dict:
        """Put the decoded round in ``inbox`` (the record last) and submit its token: ``submit`` reads it back and
        checks it (once). A refused round leaves the inbox at once; a coordinator error leaves it for the scan."""
        names = [n for n in UPLOAD_FILES if n in files]  # UPLOAD_FILES: the record last
        paths = [layout.submission_path(lease.base_version, sub_id, n) for n in names]
        for rel, name in zip(paths, names):
            inbox.put(rel, files[name])
        token = layout.inbox_token(files[layout.SUBMISSION_FILE])
        try:
            answer = self.coord.submit(lease, token)
        except (InvalidSubmission, LeaseError):
            inbox.delete(paths)  # a verdict on this round: nothing of it stays
            raise
        if answer.get("merge_due") and self.on_merge_due is not None:
            self.on_merge_due()
        return {**answer, "commit": token, "batch": 1}

    def close(self) -> None:
        """Flush queued submissions and stop the batcher."""
        self.batcher.close()
