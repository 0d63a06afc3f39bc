"""One merge of the coordinator: pending submissions → the next global version, live in the coordinator (its
memory, its version cache, the ``adapter`` route); the run repo gets it with the next checkpoint (``checkpoint``).

A merge runs in phases so that the coordinator holds its lock (``c.lock``) only for bookkeeping, never for tensor
work or I/O:

- ``plan_merge(c)`` (lock): pick the pending submissions; those grown too stale are refused and leave the queue
  at once; snapshot the global adapter, their base adapters and the outer momentum;
- ``MergePlan.compute()`` (no lock): pure tensor functions over the snapshot;
- ``stage(c, plan, result)`` (lock): the next state from the coordinator's state *now* (``fork_state``: new
  containers, shared records, no deep copy);
- render (no lock): the adapter's two files into the version cache, which gives the version its adapter id;
- ``adopt(c, staged)`` (lock): the new state, keeping what happened meanwhile (refusals, heartbeats).
Submissions admitted during a merge stay pending for the next one.

The merge weight of a submission is derived from its lease (completions per step × steps), discounted for
staleness; nothing the worker reports decides it. A round whose update is below the norm floor (``norms.credited``:
``merge.min_norm_factor``; an unchanged adapter always is) is merged with weight 0 and earns no leaderboard
credit: its recomputed reward proves only that its rewards match its completions, not that anyone trained. A
version whose rounds all are below it repeats the previous adapter.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeAlias

from hubgrpo import layout
from hubgrpo.coordinator import evals, verdicts
from hubgrpo.coordinator.admission import staleness_limit
from hubgrpo.coordinator.ledger import next_state
from hubgrpo.coordinator.norms import credited
from hubgrpo.errors import InvalidSubmission
from hubgrpo.layout import MergedEntry, RunState

if TYPE_CHECKING:
    import torch

    from hubgrpo.coordinator.core import Coordinator
    from hubgrpo.merge.core import MergeResult

    # the outer momentum tensors, or a function that reads them from the store (after a reload)
    Momentum: TypeAlias = dict[str, torch.Tensor] | Callable[[], dict[str, torch.Tensor] | None] | None

log = logging.getLogger("hubgrpo.coordinator")


@dataclass
class MergePlan:
    """Everything one merge needs, snapshotted from the coordinator; ``compute()`` touches nothing else."""

    version: int  # the version this merge produces
    global_: object
    items: list  # (adapter, base, weight) of the credited submissions, in the order of ``ids``
    entries: list[MergedEntry]  # every submission merged, the uncredited ones with weight 0
    options: object
    momentum: Momentum = None  # the tensors, or a function that reads them from the store (after a reload)

    fold: object = None  # an FfaFold of the submissions folded in before the quorum completed (ffa), or None
    raw_weights: dict = field(default_factory=dict)  # submission id → weight before normalisation
    start_version: int | None = None  # merge.eval_gate: the version this merge starts from instead of the last
    ids: list = field(default_factory=list)  # submission id of each of ``items``

    def compute(self):
        """The merge itself (``hubgrpo.merge.merge``); safe to run without the coordinator's lock. With a fold,
        only the submissions not folded yet are folded in and the merge finishes from the running sum."""
        from hubgrpo.merge import merge

        momentum = self.momentum() if callable(self.momentum) else self.momentum
        if callable(self.global_):  # a version to start from that is not cached: read it here, without the lock
            self.global_ = self.global_()
        if not self.items:  # nothing credited: the version repeats the adapter (and the outer momentum)
            from hubgrpo.merge import MergeResult

            return MergeResult(self.global_, momentum, {"algorithm": "none", "update_norm": 0.0, "residual": 0.0})
        if self.fold is not None:
            for (adapter, base, _), sub_id in zip(self.items, self.ids):
                self.fold.add(sub_id, adapter, base, self.raw_weights[sub_id])
            result = self.fold.result(self.raw_weights, self.options, momentum)
            if result is not None:
                return result
        return merge(self.global_, self.items, self.options, momentum=momentum)


@dataclass
class Staged:
    """A merged version ready to adopt: the state it makes, and what it already holds."""

    state: RunState
    render: Callable[[], None]  # saves the adapter into the version cache (no lock)
    message: str
    version: int
    refusals: list  # the refusals of ``c.new_refusals`` it holds (removed by identity when adopted)
    result: MergeResult
    evals_saved: dict = field(default_factory=dict)  # the held-out scores it holds (version → score)
    verdicts_saved: set = field(default_factory=set)  # the proof verdicts it holds (submission ids)
    workers_then: dict = field(default_factory=dict)  # (refused, accepted) per leaderboard row when staged


def run(c: Coordinator, plan: MergePlan) -> bool:
    """Compute ``plan`` (no lock) and finish it in this thread, then the checkpoint when one is due (no server).
    False if nothing was merged."""
    try:
        result = plan.compute()
    except BaseException:
        c.abort_merge(plan)
        raise
    merged = finish(c, plan, result)
    if merged:
        c.flush(force=False)  # inline (no server): the checkpoint too, when one is due
    return merged


def finish(c: Coordinator, plan: MergePlan, result) -> bool:
    """``stage`` under ``c.lock``, render the adapter into the version cache without it, ``adopt`` under it: the
    new version is live (served to workers); the run repo gets it with the next checkpoint (``checkpoint.run``)."""
    lock = c.lock
    with lock:
        staged = stage(c, plan, result)
        if staged is None:
            c.merging = None
            return False
    try:
        staged.render()  # tensors to files, the adapter id: no lock held
    except BaseException:
        with lock:
            c.merging = None
        raise
    with lock:
        c.merging = None
        adopted = adopt(c, staged)
    if adopted:
        _track(c, staged.state)  # a tracker may write files: not under the lock
    return adopted


def plan_merge(c: Coordinator) -> MergePlan | None:
    """Snapshot the pending submissions for a merge and mark the coordinator as merging; None if none is left."""
    from hubgrpo.coordinator.leasing import live_workers
    from hubgrpo.merge import MergeOptions

    items, entries, discount, raw = _weighted_items(c)
    if not entries:
        return None
    m = c.cfg.merge
    fleet = m.fleet_lr(live_workers(c), c.cfg.rounds.lr_scale(c.state.version + 1))
    outer_lr = fleet * (discount if m.staleness_scaling == "absolute" else 1.0)
    if m.extra_rounds == "add":  # the rounds beyond the quorum each move the version by their share, at most one
        # per distinct worker: rounds piled up behind a stalled merge (one worker's several leases) do not add up
        outer_lr *= max(1.0, len({e.worker for e in entries}) / m.quorum)
    opts = MergeOptions(
        method=m.method,
        outer_lr=outer_lr,
        outer_momentum=m.outer_momentum,
        nesterov=m.nesterov,
        momentum_every=m.momentum_every,
        rank=c.cfg.lora.r,
        max_rank=m.max_rank,
        clip_factor=m.clip_factor,
        trim_fraction=m.trim_fraction,
        svd_algorithm=m.svd_algorithm,
        factor_split=m.factor_split,
    )
    c.merging = c.state.version + 1
    fold = c.fold if foldable(c) and c.fold is not None and c.fold.version == c.state.version else None
    start = evals.gate_start(c)  # merge.eval_gate: start from the best-scored version after a bad score
    global_ = c.global_adapter() if start is None else (lambda: c.adapter(start))
    return MergePlan(
        version=c.state.version + 1,
        global_=global_,
        items=items,
        entries=entries,
        options=opts,
        momentum=_momentum(c),
        fold=fold if start is None else None,
        raw_weights=raw,
        start_version=start,
        ids=list(raw),
    )


def foldable(c: Coordinator) -> bool:
    """FFA without clipping or trimming: the merge is linear in each submission, so it can be folded in early."""
    m = c.cfg.merge
    return m.merge_method.foldable(m.clip_factor, m.trim_fraction)


def prefold(c: Coordinator) -> int:
    """Fold the pending submissions not folded yet into ``c.fold`` (FFA), so that the merge left when the quorum
    completes is one division per module. The store read of an adapter and the tensor work run outside ``c.lock``;
    only the merge thread calls this. Returns how many were folded."""
    if not foldable(c):
        return 0
    with c.lock:
        if c.merging is not None or c.state.finished or not c.pending:
            return 0
        version = c.state.version
        fold = c.fold if c.fold is not None and c.fold.version == version else None
        todo = []
        for sub_id, p in sorted(verdicts.ready_pending(c).items()):
            w = _raw_weight(c, p)
            if w is not None and (fold is None or sub_id not in fold.weights):
                todo.append((sub_id, p.adapter, p.sub.trained_base, w))
    if not todo:
        return 0
    from hubgrpo.merge.fold import FfaFold  # torch: only once there is something to fold (never at startup)

    fold = fold or FfaFold(c.adapter(version), version)
    for sub_id, adapter, base_version, w in todo:
        fold.add(sub_id, adapter, c.adapter(base_version), w)
    with c.lock:
        if c.state.version == version:
            c.fold = fold
    return len(todo)


def _raw_weight(c: Coordinator, p) -> float | None:
    """A pending submission's merge weight before normalisation (None when it has grown too stale or earns no
    weight: ``credited``)."""
    from hubgrpo.merge import staleness_weight

    m = c.cfg.merge
    if not credited(c.cfg, c.norm_history, p) or verdicts.is_excluded(c, p.sub.worker, p.sub.lease.user):
        return None
    try:
        return staleness_weight(
            p.samples,
            c.state.version - p.sub.trained_base,
            m.staleness_decay,
            max(staleness_limit(c), p.staleness_limit),
        )
    except InvalidSubmission:
        return None


def _weighted_items(c: Coordinator) -> tuple[list, list[MergedEntry], float, dict]:
    """(submission adapter, its base adapter, normalised weight) for each credited pending submission still fresh,
    every entry merged (the uncredited ones with weight 0: ``credited``), the samples-weighted mean staleness
    discount (1+τ)^(−decay) of the credited ones and their raw weights by id; the ones grown too stale are refused
    and removed from the queue."""
    from hubgrpo.merge import staleness_weight

    m, now, limit = c.cfg.merge, c.clock(), staleness_limit(c)
    raw, entries = [], []
    for sub_id, p in sorted(c.pending.items()):
        if not verdicts.ready(c, sub_id, p):  # held for its verdict (coordinator.verify: all | untrusted)
            continue
        tau = c.state.version - p.sub.trained_base
        try:
            w = staleness_weight(p.samples, tau, m.staleness_decay, max(limit, p.staleness_limit))
        except InvalidSubmission as e:
            c.pending.pop(sub_id, None)
            c.refuse(sub_id, p.sub.worker, e, now, user=p.sub.lease.user)
            continue
        w = w if credited(c.cfg, c.norm_history, p) else 0.0
        w = 0.0 if verdicts.is_excluded(c, p.sub.worker, p.sub.lease.user) else w  # a failed proof: no weight
        if w > 0:
            raw.append((p.adapter, c.adapter(p.sub.trained_base), w))
        entries.append(
            MergedEntry(
                submission_id=sub_id,
                worker=p.sub.worker,
                user=p.sub.lease.user,
                base_version=p.sub.trained_base,
                staleness=tau,
                weight=w,
                samples=p.samples,
                reward_mean=p.reward_mean,
                update_norm=p.update_norm,
                steps=p.steps,
            )
        )
    total = sum(w for _, _, w in raw) or 1.0
    items = [(a, b, w / total) for a, b, w in raw]
    raw_weights = {e.submission_id: e.weight for e in entries if e.weight > 0}
    for entry in entries:
        entry.weight = entry.weight / total
    samples = sum(e.samples for e in entries if e.weight > 0) or 1
    return items, entries, total / samples, raw_weights


def _momentum(c: Coordinator):
    """The outer-optimizer state (only with outer momentum), kept at optimizer/outer_momentum.safetensors: the
    tensors held since the last merge, or — after a reload (another coordinator may have merged) — a reader of
    the file at the head, which the compute calls without the lock (a store read)."""
    if c.cfg.merge.outer_momentum <= 0:
        return None
    if c.momentum is not None:
        return c.momentum
    store, head = c.store, c.head

    def read():
        from safetensors.torch import load

        return load(store.read(layout.MOMENTUM_FILE, head)) if store.exists_file(layout.MOMENTUM_FILE, head) else None

    return read


def stage(c: Coordinator, plan: MergePlan, result: MergeResult) -> Staged | None:
    """The merge commit's files and state (under the lock); None if the run moved on during the compute."""
    if c.state.version + 1 != plan.version or c.state.finished:
        log.warning("dropping the merge for version %d: the run is at version %d", plan.version, c.state.version)
        return None
    state = next_state(c, plan.entries, result.report)
    state.versions[-1].start_version = plan.start_version
    saved = evals.apply(state, c.new_evals)
    verdicts_saved = verdicts.apply(state, c.new_verdicts)
    staged = Staged(
        state=state,
        render=lambda: _render(c, staged),
        version=state.version,
        message=f"hubgrpo: version {state.version} ({len(plan.entries)} submissions)",
        refusals=list(c.new_refusals),
        workers_then=_worker_counts(c),
        result=result,
        evals_saved=saved,
        verdicts_saved=verdicts_saved,
    )
    return staged


def _worker_counts(c: Coordinator) -> dict:
    return {k: (w.refused, w.accepted) for k, w in c.state.workers.items()}


def _render(c: Coordinator, staged: Staged) -> None:
    """Save the merged adapter into the coordinator's version cache (no lock); its id goes into the version's
    record (a new record, not shared with the live state yet)."""
    from hubgrpo.merge.adapter import adapter_bytes

    weights, config = adapter_bytes(staged.result.adapter)
    aid = c.versions.put(staged.version, {layout.ADAPTER_WEIGHTS: weights, layout.ADAPTER_CONFIG: config})
    staged.state.versions[-1].adapter_id = aid


def adopt(c: Coordinator, staged: Staged) -> bool:
    """Adopt a merged ``staged`` state (under the lock), keeping what changed since it was staged: refusals,
    worker rows, last-seen times. The version is live from now on."""
    state = staged.state
    for key, ws in c.state.workers.items():
        refused_then, _ = staged.workers_then.get(key, (0, 0))
        row = state.workers.get(key)
        if row is None:
            state.workers[key] = ws
            continue
        if row is ws:  # a row the merge did not change is shared with the live state: already current
            continue
        row.refused += max(0, ws.refused - refused_then)
        row.last_seen = max(row.last_seen, ws.last_seen)
    merged = set(state.merged_ids)
    c.pending = {k: p for k, p in c.pending.items() if k not in merged}
    cp = c.checkpoint.version  # a checkpoint adopted since the merge was staged tagged a record of the old state
    if cp < len(state.versions) and state.versions[cp].tag is None and cp in c.shas:
        state.versions[cp] = state.versions[cp].model_copy(update={"tag": layout.version_tag(cp)})
    c.state = state
    held = {id(r) for r in staged.refusals}
    c.new_refusals = [r for r in c.new_refusals if id(r) not in held]
    c.new_evals = {v: e for v, e in c.new_evals.items() if v not in staged.evals_saved}
    c.new_verdicts = {k: v for k, v in c.new_verdicts.items() if k not in staged.verdicts_saved}
    aid = state.versions[-1].adapter_id
    assert aid is not None, "staged.render() gave the version its adapter id"
    c.ids[state.version] = aid
    result = staged.result
    # in memory: what a round may still be based on (a miss reads the version cache)
    c.adapters.put(
        state.version, result.adapter, drop_below=state.version - staleness_limit(c), keep=c.checkpoint.version
    )
    c.momentum = result.momentum
    c.last_merge_at = state.versions[-1].created_at
    c.norm_history.add_merged(state.versions[-1].merged, c.cfg.merge.max_norm_factor)
    c.evict_versions()
    log.info(
        "version %d merged from %d submissions (residual %s)",
        state.version,
        len(state.versions[-1].merged),
        result.report.get("residual"),
    )
    return True


def _track(c: Coordinator, state: RunState) -> None:
    v = state.versions[-1]
    if c.tracker is not None:
        c.tracker.log(
            {
                "version/reward": v.reward_mean,
                "version/residual": v.residual,
                "version/samples": v.samples,
                "version/submissions": len(v.merged),
                "version/update_norm": v.update_norm,
                "version/max_staleness": max((m.staleness for m in v.merged), default=0),
                "run/samples_total": state.samples_total,
            },
            step=v.version,
        )
