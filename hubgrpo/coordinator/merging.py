"""One merge of the coordinator: pending submissions → the next global version, in one CAS commit + a tag.

A merge has three phases so that a server can run the tensor work without holding its API lock:

- ``plan_merge(c)`` (under the lock): pick the pending submissions, refuse the ones grown too stale, snapshot
  the global adapter, their base adapters and the outer momentum;
- ``MergePlan.compute()`` (no lock: pure tensor functions over the snapshot);
- ``finish_merge(c, plan, result)`` (under the lock): the next ``state.json`` from the coordinator's state *now*
  (so heartbeats, refusals and leases made during the compute are kept), one CAS commit, the tag, adoption.
Submissions admitted while a merge computes stay pending for the next one.
"""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path

from hubgrpo import layout, runrepo
from hubgrpo.card import run_card
from hubgrpo.errors import CommitConflict, InvalidSubmission
from hubgrpo.layout import MergedEntry, RunState, VersionRecord

log = logging.getLogger("hubgrpo.coordinator.core")
MAX_CAS_RETRIES = 20


@dataclass
class MergePlan:
    """Everything one merge needs, snapshotted from the coordinator; ``compute()`` touches nothing else."""

    version: int  # the version this merge produces
    global_: object
    items: list
    entries: list[MergedEntry]
    options: object
    momentum: object = None

    def compute(self):
        """The merge itself (``hubgrpo.merge.merge``); safe to run without the coordinator's lock."""
        from hubgrpo.merge import merge

        return merge(self.global_, self.items, self.options, momentum=self.momentum)


def merge_version(c) -> bool:
    """Merge ``c.pending`` (a Coordinator) into version ``c.state.version + 1``. False if nothing was merged."""
    plan = plan_merge(c)
    if plan is None:
        return False
    try:
        result = plan.compute()
    except BaseException:
        c.abort_merge(plan)
        raise
    return finish_merge(c, plan, result)


def plan_merge(c) -> MergePlan | None:
    """Snapshot the pending submissions for a merge and mark the coordinator as merging; None if none is left."""
    from hubgrpo.merge import MergeOptions

    items, entries = _weighted_items(c)
    if not items:
        c.pending.clear()
        return None
    m = c.cfg.merge
    opts = MergeOptions(method=m.method, outer_lr=m.outer_lr, outer_momentum=m.outer_momentum, nesterov=m.nesterov,
                        rank=c.cfg.lora.r, max_rank=m.max_rank, clip_factor=m.clip_factor,
                        trim_fraction=m.trim_fraction, svd_algorithm=m.svd_algorithm)
    c.merging = c.state.version + 1
    return MergePlan(version=c.state.version + 1, global_=c._global(), items=items, entries=entries, options=opts,
                     momentum=_momentum(c))


def finish_merge(c, plan: MergePlan, result) -> bool:
    """Commit and adopt a computed merge; False (nothing changed) if the run moved on meanwhile."""
    try:
        if c.state.version + 1 != plan.version or c.state.finished:
            log.warning("dropping the merge for version %d: the run is at version %d", plan.version, c.state.version)
            return False
        state = _next_state(c, plan.entries, result.report)
        sha = _commit(c, result, state)
        if sha is None:
            return False
        _adopt(c, sha, state, result)
    finally:
        c.merging = None
    log.info("version %d merged from %d submissions (residual %s)", state.version, len(plan.entries),
             result.report.get("residual"))
    return True


def _weighted_items(c) -> tuple[list, list[MergedEntry]]:
    """(submission adapter, its base adapter, normalised weight) for each pending submission still fresh."""
    from hubgrpo.merge import staleness_weight

    m, now = c.cfg.merge, c.clock()
    raw, entries = [], []
    for sub_id, p in sorted(c.pending.items()):
        tau = c.state.version - p.sub.base_version
        try:
            w = staleness_weight(p.sub.samples, tau, m.staleness_decay, m.max_staleness)
        except InvalidSubmission as e:
            c._refuse(sub_id, p.sub.worker, e, now)
            continue
        raw.append((p.adapter, c._adapter(p.sub.base_version), w))
        entries.append(MergedEntry(submission_id=sub_id, worker=p.sub.worker, user=p.sub.user,
                                   base_version=p.sub.base_version, staleness=tau, weight=w, samples=p.sub.samples,
                                   reward_mean=p.sub.reward_mean))
    total = sum(w for _, _, w in raw) or 1.0
    items = [(a, b, w / total) for a, b, w in raw]
    for e in entries:
        e.weight = e.weight / total
    return items, entries


def _momentum(c):
    """The outer-optimizer state (only with outer momentum), kept at optimizer/outer_momentum.safetensors."""
    if c.cfg.merge.outer_momentum <= 0:
        return None
    if getattr(c, "momentum", None) is None and c.store.exists_file(layout.MOMENTUM_FILE, c.head):
        from safetensors.torch import load

        c.momentum = load(c.store.read(layout.MOMENTUM_FILE, c.head))
    return getattr(c, "momentum", None)


def _next_state(c, entries: list[MergedEntry], report: dict) -> RunState:
    now = c.clock()
    st = c.state.model_copy(deep=True)
    st.version += 1
    samples = sum(e.samples for e in entries)
    reward = sum(e.weight * e.reward_mean for e in entries)
    st.versions.append(VersionRecord(
        version=st.version, tag=layout.version_tag(st.version), created_at=now, method=c.cfg.merge.method,
        algorithm=report.get("algorithm"), residual=_num(report.get("residual")),
        update_norm=_num(report.get("update_norm")), outer_lr=c.cfg.merge.outer_lr, merged=entries,
        reward_mean=reward, samples=samples))
    st.merged_ids += [e.submission_id for e in entries]
    st.refused = (st.refused + c.new_refusals)[-500:]
    for e in entries:
        ws = st.workers.get(e.worker) or layout.WorkerStats(worker=e.worker, user=e.user, first_seen=now)
        ws.accepted += 1
        ws.samples += e.samples
        ws.reward_sum += e.reward_mean
        ws.reward_first = e.reward_mean if ws.reward_first is None else ws.reward_first
        ws.reward_last = e.reward_mean
        st.workers[e.worker] = ws
    st.samples_total += samples
    st.next_prompt = c.pool.next_index
    st.commit_times = [t for t in c.commit_times if t > now - 3600] + [now]
    st.finished = st.version >= c.cfg.params.versions
    return st


def _num(x) -> float | None:
    return None if x is None else float(x)


def _files(c, result, state: RunState, tmp: Path) -> dict:
    from hubgrpo.merge import save_adapter_dir

    folder = save_adapter_dir(result.adapter, tmp / "adapter")
    adds = {layout.ADAPTER_WEIGHTS: folder / layout.ADAPTER_WEIGHTS,
            layout.ADAPTER_CONFIG: folder / layout.ADAPTER_CONFIG,
            layout.STATE_FILE: state.to_json(),
            layout.MODEL_CARD: run_card(c.cfg, state).encode()}
    if result.momentum is not None and c.cfg.merge.outer_momentum > 0:
        from safetensors.torch import save

        adds[layout.MOMENTUM_FILE] = save({k: v.contiguous() for k, v in result.momentum.items()})
    return adds


def _commit(c, result, state: RunState) -> str | None:
    """One compare-and-swap commit; retried on a head moved by worker commits, abandoned if another merge won."""
    with tempfile.TemporaryDirectory(prefix="hubgrpo-merge-") as tmp:
        adds = _files(c, result, state, Path(tmp))
        msg = f"hubgrpo: version {state.version} ({len(state.versions[-1].merged)} submissions)"
        for _ in range(MAX_CAS_RETRIES):
            head = c.store.head()
            if head != c.head and runrepo.read_state(c.store, head).version != c.state.version:
                log.warning("another coordinator merged version %d first; reloading", c.state.version + 1)
                c.reload()
                return None
            try:
                sha = c.store.commit(adds, message=msg, parent=head)
            except CommitConflict:
                continue
            c.store.tag(state.versions[-1].tag, sha, exist_ok=True)
            return sha
    raise CommitConflict(f"could not commit version {state.version} after {MAX_CAS_RETRIES} tries: the head keeps "
                         "moving", hint="too many concurrent commits; lower the number of workers or raise quorum")


def _adopt(c, sha: str, state: RunState, result) -> None:
    merged = set(state.merged_ids)
    c.pending = {k: p for k, p in c.pending.items() if k not in merged}
    c.state, c.head = state, sha
    c.shas[state.version] = sha
    c._adapters[state.version] = result.adapter
    c.momentum = result.momentum
    c.new_refusals = []
    c.last_merge_at = state.versions[-1].created_at
    c.commit_times.append(state.versions[-1].created_at)
    v = state.versions[-1]
    if c.tracker is not None:
        c.tracker.log({"version/reward": v.reward_mean, "version/residual": v.residual, "version/samples": v.samples,
                       "version/submissions": len(v.merged), "version/update_norm": v.update_norm,
                       "version/max_staleness": max((m.staleness for m in v.merged), default=0),
                       "run/samples_total": state.samples_total}, step=v.version)


