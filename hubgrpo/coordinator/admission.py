"""Admission of submissions in two phases, so that no network I/O ever runs under the coordinator's lock.

- ``prepare(c, lease, commit)`` — without the lock: verify the lease, read the submission folder at ``commit``
  from the store (network), and run every check on it. It changes nothing in the coordinator; its verdict is a
  ``Prepared`` (the admitted ``Pending`` entry, or the refusal, or "duplicate").
- ``accept(c, prepared)`` — under the lock: re-check what may have changed meanwhile (duplicate, staleness),
  then keep the submission pending or record the refusal. Milliseconds.

What is trusted: only what the coordinator derives or verifies. The merge weight comes from the lease
(completions per step × steps), never from submission.json. Each factor entry may move at most what ``steps``
AdamW steps at the lease's learning rate can move it (``step_bound``: ``|Δ| ≤ steps · lr · (5 + wd·|θ|)``; one
AdamW step moves an entry by lr·|m̂/√v̂| ≤ 3.2·lr with TRL's betas). The update norm ‖ΔWᵢ − ΔW_base‖, per step,
may be at most ``merge.max_norm_factor`` × the typical norm of recent credited rounds (``coordinator.norms``: the
median over participants, rebuilt from state.json after a restart) — from history, not from the current quorum.
"""

from __future__ import annotations

import hashlib
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from hubgrpo import layout
from hubgrpo.coordinator.kept import Staged
from hubgrpo.coordinator.norms import norm_limit
from hubgrpo.errors import HubGrpoError, InvalidSubmission, LeaseError, NotFound
from hubgrpo.layout import Lease, Submission

if TYPE_CHECKING:
    from hubgrpo.coordinator.core import Coordinator
    from hubgrpo.merge.adapter import Adapter

ADAM_RATIO = 5.0  # > the largest |m̂/√v̂| of AdamW with betas (0.9, 0.999): (1 − β1)/√(1 − β2) ≈ 3.16


@dataclass
class Pending:
    """An admitted submission waiting for the next merge."""

    sub: Submission
    adapter: Adapter
    commit: str
    samples: int = 0  # derived from the lease
    steps: int = 0
    update_norm: float | None = None
    reward_mean: float = 0.0  # recomputed from the round's rollouts (``verify``), never the reported one
    staleness_limit: int = 0  # the limit it was admitted under: a merge never holds it to a lower one
    staged: Staged | None = None  # its record and rollouts as checked, for the verifier (``coordinator.kept``)


@dataclass
class Prepared:
    """The verdict of ``prepare``: ``pending`` (admitted), ``error`` (refused) or ``duplicate``."""

    lease: Lease | None  # None: the submission record was unreadable (``error`` says why)
    sub_id: str
    commit: str
    pending: Pending | None = None
    error: HubGrpoError | None = None
    duplicate: bool = False
    notes: dict = field(default_factory=dict)


def lease_samples(cfg, lease: Lease) -> int:
    """Completions a round of ``lease`` generates: per-device batch × accumulation × steps (lease params win)."""
    p = {**cfg.params.model_dump(), **{k: v for k, v in lease.params.items() if v is not None}}
    return int(p["per_device_train_batch_size"]) * int(p["gradient_accumulation_steps"]) * int(lease.steps)


def step_bound(cfg, lease: Lease, base) -> tuple[float, str]:
    """The largest change of one LoRA factor entry that ``lease.steps`` AdamW steps can make, and why."""
    params = {**cfg.params.model_dump(), **{k: v for k, v in lease.params.items() if v is not None}}
    lr, wd, steps = float(params["learning_rate"]), float(params["weight_decay"]), int(lease.steps)
    biggest = _biggest_entry(base.weights)
    bound = steps * lr * (ADAM_RATIO + wd * biggest)
    return bound, f"{steps} AdamW steps at learning rate {lr:g} move an entry by at most {bound:.3g}"


_BIGGEST: list[tuple[dict, float]] = []  # (a version's weights, their largest |entry|): the last few versions
_BIGGEST_LOCK = threading.Lock()


def _biggest_entry(weights: dict) -> float:
    """The largest |entry| of the LoRA factors in ``weights`` (a version's: never changed once made), remembered
    for the last few versions, as every round of the same base asks for it."""
    with _BIGGEST_LOCK:
        for known, value in _BIGGEST:
            if known is weights:
                return value
    value = max((float(t.abs().max()) for k, t in weights.items() if ".lora_" in k and t.numel()), default=0.0)
    with _BIGGEST_LOCK:
        _BIGGEST[:] = [(weights, value), *_BIGGEST[:3]]
    return value


def prepare(c: Coordinator, lease: Lease, commit: str, *, check_deadline: bool = True) -> Prepared:
    """Every check of the submission of ``lease`` at ``commit``; reads the store, changes nothing in ``c``."""
    sub_id = layout.submission_id(lease.worker, lease.lease_id)
    out = Prepared(lease=lease, sub_id=sub_id, commit=commit)
    if sub_id in c.state.merged_ids or sub_id in c.pending:
        out.duplicate = True
        return out
    try:
        c.check_lease(lease, c.clock(), check_deadline=check_deadline)
        check_lineage(c, lease.base_version, lease.base_sha, sub_id)  # before anything is read
        if not c.cfg.merge.rebase:  # a rebased round's staleness counts from its record: checked after reading it
            _check_staleness(c, lease, sub_id, lease.base_version)
        out.pending = _check_folder(c, lease, sub_id, commit)
    except (InvalidSubmission, LeaseError) as e:
        out.error = e
    return out


def staleness_limit(c: Coordinator, lease: Lease | None = None) -> int:
    """Versions old a submission may be now: ``merge.max_staleness``, raised with ``merge.staleness_per_worker``
    by ``live_workers`` (the coordinator's own count, never a worker's word; at most ``merge.max_lease_age``)."""
    m = c.cfg.merge
    from hubgrpo.coordinator.leasing import live_workers

    return m.staleness_limit(live_workers(c, lease)) if m.staleness_per_worker else m.max_staleness


def _check_staleness(c: Coordinator, lease: Lease, sub_id: str, base_version: int) -> None:
    tau, limit = c.state.version - base_version, staleness_limit(c, lease)
    if tau > limit:
        why = (
            f"max_staleness {c.cfg.merge.max_staleness}"
            if limit == c.cfg.merge.max_staleness
            else f"{limit} with staleness_per_worker {c.cfg.merge.staleness_per_worker:g}"
        )
        raise InvalidSubmission(
            "stale",
            f"submission {sub_id} is {tau} versions old (base {base_version}, current {c.state.version}; limit {why})",
            hint="lease again and train on the new version",
        )


def _check_folder(c: Coordinator, lease: Lease, sub_id: str, commit: str) -> Pending:
    """Fetch the submission from the run's inbox (the repo at ``commit``, or an inbox): names and sizes are checked
    in the listing first, against ``submission_limit``, so an oversized folder is refused before it is read."""
    tag = hashlib.sha256(commit.encode()).hexdigest()[:12]  # the participant's commit never names the folder
    dest = c.scratch / "submissions" / f"{sub_id}-{tag}"  # this process's: another coordinator's never shares it
    limit = submission_limit(c, lease)
    try:
        folder = c.inbox.fetch(lease.base_version, sub_id, commit, dest, max_bytes=limit)
    except NotFound as e:
        raise InvalidSubmission("not_found", e.message, hint=e.hint) from None
    try:
        pending = check_local(c, lease, folder, commit)
        if c.cfg.coordinator.verify != "off":  # the bytes a verifier must judge, not what the folder holds later
            pending.staged = c.kept.stage(folder, sub_id)  # the round's once accepted (``accept``)
        return pending
    finally:  # the admitted adapter is in memory now: no copy of it stays on the coordinator's disk
        shutil.rmtree(folder, ignore_errors=True)


def submission_limit(c: Coordinator, lease: Lease) -> int:
    """The most bytes a submission of ``lease`` can hold: its adapter at the run's shapes (derived from the global
    adapter, capped by ``merge.max_submission_mb``) plus its rollouts' limit (``task.rollouts.size_limit``)."""
    from hubgrpo.merge.submission_checks import max_submission_bytes
    from hubgrpo.task.rollouts import size_limit

    limit = int(c.cfg.merge.max_submission_mb * 2**20)
    if lease.base_version in c.ids:
        limit = min(limit, max_submission_bytes(c.global_adapter()))
    return limit + size_limit(c.cfg, lease)


def check_local(c: Coordinator, lease: Lease, folder: Path, commit: str) -> Pending:
    """Every check of a local submission folder (also the Space's uploads, before they are committed)."""
    from hubgrpo.merge.submission_checks import check_step_bound, check_submission

    sub_id = layout.submission_id(lease.worker, lease.lease_id)
    sub = read_record(folder, lease, sub_id)
    check_lineage(c, lease.base_version, lease.base_sha, sub_id)
    base_version = check_rebase(c, lease, sub, sub_id)
    _check_staleness(c, lease, sub_id, base_version)
    global_, base = c.global_adapter(), c.adapter(base_version)
    limit = submission_limit(c, lease)
    steps = int(lease.steps)
    frozen_a = c.cfg.merge.merge_method.frozen_a  # ffa: a round may leave its A factors out (the run's)
    adapter = check_submission(
        folder, global_, max_bytes=limit, known_versions=set(c.ids), base_version=base_version, frozen_a=frozen_a
    )
    reward = c.reward_check.check(lease, folder)  # the rewards recomputed from the rollouts (``verify``)
    if frozen_a:
        check_frozen_a(adapter, global_)
    bound, why = step_bound(c.cfg, lease, base)
    check_step_bound(adapter, base, bound, why)  # elementwise first: cheap, and it names the tensor
    from hubgrpo.merge import parse_modules, update_norm

    norm = update_norm(adapter, parse_modules(adapter)[0], base, parse_modules(base)[0])
    norm_cap = norm_limit(c.norm_history, steps, c.cfg.merge.max_norm_factor)
    if norm_cap is not None and not norm <= norm_cap:
        raise InvalidSubmission(
            "norm_outlier",
            f"the update norm ‖ΔW − ΔW_base‖ = {norm:.4g} is more than "
            f"{c.cfg.merge.max_norm_factor:g}× the typical update of recent rounds "
            f"(limit {norm_cap:.4g} for {steps} steps)",
            hint="submit what the round's training produced",
        )
    return Pending(
        sub=sub,
        adapter=adapter,
        commit=commit,
        samples=lease_samples(c.cfg, lease),
        steps=steps,
        update_norm=norm,
        reward_mean=reward,
    )


def check_rebase(c: Coordinator, lease: Lease, sub: Submission, sub_id: str) -> int:
    """The version ``sub`` is an update of: its lease's base, or (merge.rebase) the newer version it moved onto
    mid-round, which must be a version of this run between the two (code ``bad_rebase``)."""
    v = sub.rebased_version
    if v is None:
        return lease.base_version
    if not c.cfg.merge.rebase:
        raise InvalidSubmission(
            "bad_rebase",
            f"submission {sub_id} was moved onto version {v} mid-round, "
            "but this run does not rebase (merge.rebase is off)",
            hint="train each round on its leased version: upgrade the worker or fix its config",
        )
    age, limit = c.state.version - lease.base_version, c.cfg.merge.lease_age_limit()
    if age > limit:  # the staleness below is the worker's word: its lease's own age is bounded too
        raise InvalidSubmission(
            "stale",
            f"submission {sub_id} was leased {age} versions ago (base "
            f"{lease.base_version}, current {c.state.version}); a rebased round's lease may be at most "
            f"{limit} versions old (merge.max_lease_age)",
            hint="lease again",
        )
    if not lease.base_version <= v <= max(c.state.version, c.checkpoint.version):
        raise InvalidSubmission(
            "bad_rebase",
            f"submission {sub_id} names version {v} as the one it was "
            f"moved onto; it must be a version between its lease's {lease.base_version} and the "
            f"current {c.state.version}",
            hint="submit what the round's training produced",
        )
    if sub.rebased_sha is None and v not in c.shas:
        raise InvalidSubmission(
            "bad_rebase",
            f"submission {sub_id} names version {v} as the one it was moved onto without its adapter id (rebased_sha)",
            hint="upgrade hubgrpo on the worker",
        )
    check_lineage(c, v, sub.rebased_sha or c.shas[v], sub_id)
    return v


def check_lineage(c: Coordinator, version: int, adapter_id: str, sub_id: str) -> None:
    """The version a round was trained on must be one of this coordinator's lineage under that adapter id: a
    version merged after the last checkpoint by a coordinator that restarted since is gone (``stale``), and the
    same number merged again is another adapter."""
    if c.ids.get(version) == adapter_id or (c.shas.get(version) == adapter_id and version in c.ids):
        return
    if version in c.ids or version > c.checkpoint.version:
        raise InvalidSubmission(
            "stale",
            f"submission {sub_id} was trained on version {version} "
            f"({str(adapter_id)[:10]}), which this coordinator does not have: it was merged after "
            f"the last checkpoint (v{c.checkpoint.version}) by a coordinator that restarted since",
            hint="lease again and train on the current version",
        )
    raise InvalidSubmission("unknown_base", f"base version {version} is not a version of this run")


def check_frozen_a(adapter, global_) -> None:
    """FFA runs: every lora_A must equal the global's (frozen since version 0); a changed one could only make
    every later merge fail, so it is refused here (code ``a_changed``)."""
    from hubgrpo.merge.frozen_a import is_a_key, same

    for key, value in global_.weights.items():
        if is_a_key(key) and not same(adapter.weights[key], value):
            raise InvalidSubmission(
                "a_changed",
                f"{key} differs from the run's frozen lora_A (merge.method ffa)",
                hint="train with lora_A frozen: hubgrpo workers do this for ffa runs",
            )


def read_record(folder: Path, lease: Lease, sub_id: str) -> Submission:
    """submission.json of ``folder``, validated (finite, bounded numbers) and matched against its lease."""
    path = folder / layout.SUBMISSION_FILE
    try:
        if path.stat().st_size > 8 << 20:
            raise InvalidSubmission("bad_record", f"{layout.SUBMISSION_FILE} of {sub_id} is larger than 8 MiB")
        sub = Submission.from_json(path.read_bytes())
    except FileNotFoundError:
        raise InvalidSubmission("no_record", f"submission {sub_id} has no {layout.SUBMISSION_FILE}") from None
    except (ValueError, RecursionError) as e:
        first = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        raise InvalidSubmission(
            "bad_record",
            f"{layout.SUBMISSION_FILE} of {sub_id} is invalid: {first}",
            hint="numbers must be finite and in range; upgrade hubgrpo on the worker",
        ) from None
    changed = sub.lease.changed_from(lease)  # a verifier replays with the record's lease: its seed, its sampling
    if changed or (sub.worker, sub.base_version) != (lease.worker, lease.base_version):
        raise InvalidSubmission(
            "lease_mismatch",
            f"{layout.SUBMISSION_FILE} of {sub_id} does not match its lease "
            f"({', '.join(changed) or 'worker, base_version'})",
            hint="write the lease as the coordinator signed it",
        )
    # who trained it is the signed lease's word, not the record's (the leaderboard and the fleet count use it)
    return sub.model_copy(update={"lease": lease, "user": lease.user})


def accept(c: Coordinator, prepared: Prepared, *, count_commit: bool = True) -> dict:
    """Keep a prepared submission pending (or record its refusal and raise it), under ``c.lock``; the answer:
    ``admitted`` (or ``duplicate``), and whether a merge is due now."""
    lease, sub_id, now = prepared.lease, prepared.sub_id, c.clock()
    assert lease is not None, "a record without a lease is never accepted (Coordinator.accept_quietly)"
    if prepared.duplicate or sub_id in c.state.merged_ids or sub_id in c.pending:
        c.kept.discard(prepared.pending.staged if prepared.pending else None)  # the first check's copy stays
        return {"status": "duplicate", "submission_id": sub_id, "version": c.state.version}
    c.active.pop(lease.lease_id, None)
    if count_commit and c.inbox.in_repo:  # a round in an inbox (hub.submissions) is no commit of the repo
        c.commit_times.append(now)
    err, pending = prepared.error, prepared.pending
    from hubgrpo.coordinator.verdicts import submission_error

    err = err or submission_error(c, lease.worker, lease.user)  # a failed proof of rollouts excluded them
    if err is None:
        assert pending is not None, "prepare() gives a pending submission or an error"
        try:  # the version may have moved while prepare ran
            _check_staleness(c, lease, sub_id, pending.sub.trained_base)
        except InvalidSubmission as e:
            err = e
    if err is not None:
        c.kept.discard(pending.staged if pending else None)
        if not any(r.submission_id == sub_id for r in (*c.new_refusals, *c.state.refused)):
            c.refuse(sub_id, lease.worker, err, now, user=lease.user)  # once: a scan may race a submit
        raise err
    assert pending is not None
    pending.staleness_limit = staleness_limit(c, lease)
    c.pending[sub_id] = pending
    if pending.staged is not None:
        c.kept.commit(sub_id, pending.staged)
        pending.staged = None
    from hubgrpo.coordinator.leasing import measure

    measure(c, lease, now)
    return admitted(c, prepared, merged=False)


def admitted(c: Coordinator, prepared: Prepared, *, merged: bool) -> dict:
    """The answer to an admitted submission (under ``c.lock``): ``merged`` when a merge took it in already."""
    pending = prepared.pending
    return {
        "status": "merged" if merged else "admitted",
        "submission_id": prepared.sub_id,
        "version": c.state.version,
        "staleness": None if merged or pending is None else c.state.version - pending.sub.trained_base,
        "merge_due": not merged and c.merge_due(),
    }


def warm_up(c: Coordinator) -> None:
    """Load now what the first admission loads lazily: torch and safetensors (the adapter checks), the merge code,
    the run's reward functions and prompt data, the current global adapter. A served coordinator calls it once,
    before its app launches (so that the tick thread's first ``gc.freeze`` covers these modules too), rather than
    in an admission thread while the first rounds' requests are in flight, competing with them for the GIL. A
    failure (say, a Hub dataset that cannot be reached now) is logged and left to the first admission, which
    retries the load."""
    import logging

    import safetensors.torch  # noqa: F401
    import torch  # noqa: F401

    import hubgrpo.merge  # noqa: F401
    import hubgrpo.merge.submission_checks  # noqa: F401

    try:
        c.reward_check.loaded()
        c.global_adapter()
    except HubGrpoError as e:
        logging.getLogger("hubgrpo.coordinator").warning("warm-up: %s (the first admission retries)", e.message)
