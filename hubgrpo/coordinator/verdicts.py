"""Proof-of-rollouts verdicts on admitted rounds, recorded by a verifier (``hubgrpo evaluate --verify``), and what a
failed one does (``coordinator.verify: sample``).

A verifier asks the status which admitted rounds have no verdict yet (``todo``: the pending ones first, then the
merged ones, newest first), replays a sample of each round's completions with the leased version
(``hubgrpo.proof``), and reports a ``VerdictReport`` through the ``record_verdict`` endpoint. The report is hostile
input until checked (``parse``: the record's types and bounds, ``bad_verdict``); it must name a round the coordinator
admitted (``unknown_submission``), and only the first verdict of a round counts (``duplicate``). Who may report is
the server's business (``coordinator.evaluators``, default the repo owner, as for held-out scores).

With ``coordinator.verify: all`` (or ``untrusted``, for participants not in ``coordinator.trusted``) a pending round
is merged only once it passed (``ready``): the merge's quorum and deadline count ready rounds only.

A failed verdict excludes the round's participant — its user when the round was leased to one, else its worker
name: its pending rounds get no merge weight (merged with weight 0, a running FFA fold is dropped), its leaderboard
row ranks last and is marked ``excluded``, and its later leases and submissions are refused (``excluded``). What it
merged before the verdict stays merged. Verdicts wait in ``c.new_verdicts`` (the status shows them at once) and reach
state.json with the next merge or checkpoint, like held-out scores (``evals``): an exclusion survives a restart.
"""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from hubgrpo import layout
from hubgrpo.errors import InvalidSubmission, NotFound, Refused
from hubgrpo.layout import RunState, VerdictRecord, VerdictReport

if TYPE_CHECKING:
    from hubgrpo.coordinator.core import Coordinator

MAX_TODO = 256  # rounds the status lists for a verifier
TODO_VERSIONS = 64  # merged rounds of the newest this many versions are listed (older folders left the head)
MAX_KEPT = 50_000  # verdicts state.json keeps: every failed one, then the newest passed ones
HINT = "a verifier replayed this participant's round and the leased policy did not write it; ask the run's owner"


def participant(worker: str, user: str | None) -> str:
    """Who a verdict excludes: the user a round was leased to, else its worker name (runs without auth)."""
    return user or worker


def known(state: RunState, pending: dict | None = None) -> dict[str, VerdictRecord]:
    """submission id → verdict: state.json's, then the unsaved ones."""
    return {**{v.submission_id: v for v in state.verdicts}, **(pending or {})}


def excluded(state: RunState, pending: dict | None = None) -> set[str]:
    """The participants a failed verdict excluded."""
    return {participant(v.worker, v.user) for v in known(state, pending).values() if not v.report.passed}


def is_excluded(c: Coordinator, worker: str, user: str | None) -> bool:
    return c.cfg.coordinator.verify != "off" and participant(worker, user) in excluded(c.state, c.new_verdicts)


def refuse_lease(c: Coordinator, worker: str, user: str | None) -> None:
    """``Refused`` (``excluded``) when a failed verdict excluded this participant."""
    if is_excluded(c, worker, user):
        raise Refused(
            "excluded",
            f"{participant(worker, user)} is excluded from this run: a round of theirs failed its proof of rollouts",
            hint=HINT,
        )


def submission_error(c: Coordinator, worker: str, user: str | None) -> InvalidSubmission | None:
    """The refusal of a round an excluded participant submits, else None."""
    if not is_excluded(c, worker, user):
        return None
    return InvalidSubmission(
        "excluded",
        f"{participant(worker, user)} is excluded from this run: a round of theirs failed its proof of rollouts",
        hint=HINT,
    )


def ready(c: Coordinator, sub_id: str, p) -> bool:
    """Whether a pending round may be merged: always, unless ``coordinator.verify`` holds it for its verdict
    (``all``; ``untrusted`` for participants not in ``coordinator.trusted``) and it has not passed. An excluded
    participant's round is ready: it merges with weight 0 and leaves the queue."""
    co = c.cfg.coordinator
    if co.verify not in ("all", "untrusted"):
        return True
    who = participant(p.sub.worker, p.sub.lease.user)
    if co.verify == "untrusted" and who.lower() in {t.lower() for t in co.trusted}:
        return True
    v = c.new_verdicts.get(sub_id) or next((v for v in c.state.verdicts if v.submission_id == sub_id), None)
    return (v is not None and v.report.passed) or who in excluded(c.state, c.new_verdicts)


def ready_pending(c: Coordinator) -> dict:
    """The pending rounds a merge may take now (``ready``)."""
    return {k: p for k, p in c.pending.items() if ready(c, k, p)}


def parse(c: Coordinator, submission_id: Any, report: Any) -> tuple[str, VerdictReport]:
    """Check a reported verdict's types and bounds; ``InvalidSubmission`` (``bad_verdict``) naming the problem."""

    def bad(why: str):
        raise InvalidSubmission(
            "bad_verdict",
            f"verdict refused: {why}",
            hint="report what `hubgrpo evaluate --verify` found: a submission id and its verdict record",
        )

    if c.cfg.coordinator.verify == "off":
        bad("this run records no verdicts (coordinator.verify: off)")
    if not isinstance(submission_id, str) or not 0 < len(submission_id) <= 200:
        bad(f"submission id {str(submission_id)[:40]!r} is not one")
    if not isinstance(report, dict):
        bad(f"the report is a {type(report).__name__}, not an object")
    try:
        parsed = VerdictReport.model_validate(report)
    except ValidationError as e:
        errs = e.errors()
        where = ".".join(str(p) for p in errs[0]["loc"]) if errs else "report"
        bad(f"{where}: {errs[0]['msg'] if errs else 'invalid'}"[:300])
    if parsed.mismatches > parsed.checked or parsed.checked > parsed.tokens:
        bad(f"{parsed.mismatches} mismatches of {parsed.checked} checked of {parsed.tokens} tokens do not add up")
    return submission_id, parsed


def record(c: Coordinator, submission_id: str, report: VerdictReport) -> dict:
    """Keep a parsed verdict (under ``c.lock``); the first verdict of a round wins. A failed one excludes."""
    if submission_id in known(c.state, c.new_verdicts):
        return {"status": "duplicate", "submission_id": submission_id}
    who = _round_of(c, submission_id)
    if who is None:
        raise InvalidSubmission(
            "unknown_submission",
            f"no admitted round {submission_id[:80]!r}",
            hint="verify the rounds the status lists under verify.todo",
        )
    worker, user = who
    c.new_verdicts[submission_id] = VerdictRecord(
        submission_id=submission_id, worker=worker, user=user, report=report, at=c.clock()
    )
    if not report.passed:
        c.fold = None  # a running FFA sum may hold the participant's rounds: the merge recomputes it
    return {
        "status": "recorded",
        "submission_id": submission_id,
        "passed": report.passed,
        "excluded": None if report.passed else participant(worker, user),
    }


def _round_of(c: Coordinator, submission_id: str) -> tuple[str, str | None] | None:
    """(worker, user) of an admitted round: pending or merged."""
    p = c.pending.get(submission_id)
    if p is not None:
        return p.sub.worker, p.sub.lease.user
    if submission_id in set(c.state.merged_ids):
        for v in reversed(c.state.versions):
            for m in v.merged:
                if m.submission_id == submission_id:
                    return m.worker, m.user
    return None


def todo(c: Coordinator) -> list[dict]:
    """Admitted rounds without a verdict, for a verifier: pending ones, then merged ones (newest first); each with
    the folder its files are in (``submissions/<base_version>/<submission_id>``)."""
    if c.cfg.coordinator.verify == "off":
        return []
    done = known(c.state, dict(c.new_verdicts))
    out = [
        {"submission_id": k, "base_version": p.sub.lease.base_version, "worker": p.sub.worker}
        for k, p in sorted(list(c.pending.items()))
        if k not in done
    ]
    for v in reversed(list(c.state.versions)[-TODO_VERSIONS:]):
        for m in v.merged:
            if m.submission_id not in done and m.weight > 0:
                out.append({"submission_id": m.submission_id, "base_version": m.base_version, "worker": m.worker})
    out = out[:MAX_TODO]
    for row in out:  # what admission read: a verifier judges those bytes, not what the folder holds now
        row["sha256"] = c.kept.digests(str(row["submission_id"]))
    return out


def round_files(c: Coordinator, submission_id: Any, base_version: Any) -> dict:
    """The record and rollouts of a round awaiting its verdict (``todo``) as admission read them (``kept``), for a
    verifier: ``{submission_id, files: {name: base64}}``. Hostile input: only a round ``todo`` lists; a round not
    kept (admitted before a restart, or long ago) is ``not_found`` (admission refuses a verified round over
    ``kept.MAX_SERVED`` bytes)."""
    if c.cfg.coordinator.verify == "off":
        raise InvalidSubmission("bad_verdict", "this run verifies no rounds (coordinator.verify: off)")
    listed = False
    if layout.is_name(submission_id) and type(base_version) is int:
        with c.lock:
            listed = any(r["submission_id"] == submission_id for r in todo(c))
    if not listed:
        raise InvalidSubmission(
            "unknown_submission",
            f"round {str(submission_id)[:80]!r} awaits no verdict here",
            hint="ask for a round the status lists under verify.todo",
        )
    files = c.kept.files(submission_id)
    if files is None:
        raise NotFound(
            f"round {submission_id} is not kept by this coordinator process",
            hint="it was admitted before a restart (or long ago): it cannot be verified as admitted",
        )
    return {"submission_id": submission_id, "files": {n: base64.b64encode(b).decode("ascii") for n, b in files.items()}}


def apply(state: RunState, pending: dict) -> set[str]:
    """Write the unsaved verdicts into ``state`` (a copy being staged); returns the ids it wrote."""
    have = {v.submission_id for v in state.verdicts}
    new = [v for k, v in pending.items() if k not in have]
    kept = state.verdicts + new
    if len(kept) > MAX_KEPT:  # bounded: the oldest passed verdicts go first, never a failed one (an exclusion)
        oldest_passed = [i for i, v in enumerate(kept) if v.report.passed][: len(kept) - MAX_KEPT]
        gone = set(oldest_passed)
        kept = [v for i, v in enumerate(kept) if i not in gone]
    state.verdicts = kept
    return {v.submission_id for v in new}


def summary(c: Coordinator) -> dict:
    """The status's ``verify`` section."""
    all_ = known(c.state, dict(c.new_verdicts))
    return {
        "mode": c.cfg.coordinator.verify,
        "checked": len(all_),
        "failed": sum(not v.report.passed for v in all_.values()),
        "excluded": sorted(excluded(c.state, dict(c.new_verdicts))),
        "todo": todo(c),
    }
