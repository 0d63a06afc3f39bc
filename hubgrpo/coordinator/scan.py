"""The scan: rounds in the run's inbox that the coordinator has not seen, prepared for admission.

A worker that crashed after its commit or upload, a submit answer that was lost, a restart: the round is in the
inbox, and nobody submits it. ``prepare_unseen`` finds every round that is neither merged, refused nor pending and
prepares it as ``admission.prepare`` does (store reads, no lock); the coordinator then accepts each under its lock.
Finished rounds leave an inbox as the scan passes (``inbox.ObjectInbox.prune``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from hubgrpo import layout
from hubgrpo.coordinator.admission import Prepared, prepare
from hubgrpo.errors import HubGrpoError, InvalidSubmission
from hubgrpo.layout import Submission

if TYPE_CHECKING:
    from hubgrpo.coordinator.core import Coordinator

log = logging.getLogger("hubgrpo.coordinator")


def unseen_submissions(c: Coordinator, revision: str | None = None) -> list[tuple[int, str]]:
    """(base version, submission id) of rounds in the inbox that are neither merged, refused nor pending (in a
    inbox: only those on base versions still young enough to be merged)."""
    done = (
        set(c.state.merged_ids)
        | {r.submission_id for r in c.state.refused}
        | set(c.pending)
        | {r.submission_id for r in c.new_refusals}
        | set(c.in_flight())
    )
    bases = range(max(0, c.state.version - c.cfg.merge.lease_age_limit()), c.state.version + 1)
    return c.inbox.unseen(done, revision, bases)


def prepare_unseen(c: Coordinator, *, check_deadline: bool = True) -> list[Prepared]:
    """Prepare every submitted round the coordinator has not seen (a worker that crashed after its commit or
    upload, a lost submit answer, a restart). Reads the store; call without the lock, then ``accept`` each under it.
    A record refused or ignored here is remembered by the inbox and not read again while it is unchanged."""
    head = c.inbox.revision()
    _prune_inbox(c)
    out = []
    for base, sub_id in unseen_submissions(c, head):
        try:
            lease = Submission.from_json(c.inbox.read_record(base, sub_id, head)).lease
        except (HubGrpoError, ValueError, RecursionError) as e:  # not even a readable record: skip it, say so
            out.append(
                Prepared(
                    lease=None,
                    sub_id=sub_id,
                    commit=head or "",
                    error=InvalidSubmission("bad_record", f"unreadable submission {sub_id}: {str(e)[:200]}"),
                )
            )
            c.inbox.judged(base, sub_id)
            continue
        if layout.submission_id(lease.worker, lease.lease_id) != sub_id:
            c.inbox.judged(base, sub_id)
            continue  # a folder that claims another submission's lease: ignored (its lease is someone else's)
        prepared = prepare(c, lease, head or "scan", check_deadline=check_deadline)
        if prepared.error is not None and prepared.error.code != "not_found":  # not_found: an upload under way
            c.inbox.judged(base, sub_id)
        out.append(prepared)
    return out


def _prune_inbox(c: Coordinator) -> None:
    """An inbox's finished rounds go as a merge commit's deletes take the repo's (``inbox.ObjectInbox.prune``)."""
    try:
        c.inbox.prune(c.state, c.cfg.coordinator.keep_submissions, c.cfg.merge.lease_age_limit())
    except HubGrpoError as e:  # the next scan tries again
        log.warning("could not delete finished rounds: %s", e.message)
