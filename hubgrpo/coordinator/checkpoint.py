"""Checkpoints: the versions a coordinator commits to the run repo, and the only commits it makes.

A merge makes a **live** version: in the coordinator's memory and on its disk (``versions.VersionCache``), served
to workers by the ``adapter`` route, never committed by itself. A **checkpoint** is one compare-and-swap commit of
the current version — adapter, ``state.json`` (with every version record, refusal and held-out score so far),
model card, outer momentum — tagged ``vNNNNNN``, made when

- ``interval_s(c)`` seconds passed since the last one (``coordinator.checkpoint_every_s``; by default half the
  commit budget on a store with an hourly commit quota (the Hub): 7200 / ``commit_budget_per_hour`` seconds, and
  every version on a local folder or S3, where commits cost nothing), or
  ``coordinator.checkpoint_every_versions`` versions were merged since, or the run finished;
- and the commit budget has room (checkpoints never go past ``commit_budget_per_hour``).
Refusals and held-out scores ride on the next checkpoint; alone, they are committed after ``refusal_flush_s``, at
most once per interval. A restarted coordinator resumes from the last checkpoint: what it loses is the versions
merged since (their rounds' records too); rounds based on them are refused as stale (``admission`` checks the id of
a round's base version against its own lineage), never merged twice into the history that stays.

Phases as for merges: ``stage`` under the coordinator's lock, ``commit`` without it (store writes), ``adopt`` under
it. A served coordinator commits checkpoints from a thread of their own (``space.ticker``), so a commit waiting out
the Hub's 429 never holds a merge; where commits are free and the interval is 0 (a local folder, S3) the merge thread
checkpoints each version right after its merge instead, so that none is skipped (``Coordinator.checkpoints_inline``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hubgrpo import layout, runrepo
from hubgrpo.card import run_card
from hubgrpo.config.sections import FREE_COMMITS
from hubgrpo.coordinator import evals, verdicts
from hubgrpo.coordinator.ledger import MAX_REFUSALS_KEPT, fork_state
from hubgrpo.coordinator.pruning import merge_deletes
from hubgrpo.errors import CommitConflict, HubGrpoError

if TYPE_CHECKING:
    from pathlib import Path

    from hubgrpo.coordinator.core import Coordinator
    from hubgrpo.layout import RunState

log = logging.getLogger("hubgrpo.coordinator")
MAX_CAS_RETRIES = 20


@dataclass
class Checkpoint:
    """The last checkpoint: the version of the state.json at the repo's head, that commit, when it was made."""

    version: int
    sha: str
    at: float


def quota_bound(store) -> bool:
    """Whether commits to ``store`` count against an hourly quota (the Hub's); a local folder or S3 has none."""
    return bool(getattr(store, "hourly_commit_quota", None))


def interval_s(c: Coordinator) -> float:
    """Seconds between checkpoints (0: every version): ``checkpoint_every_s``, else from the budget on a store
    with a commit quota, else 0."""
    co = c.cfg.coordinator
    if co.checkpoint_every_s is not None:
        return float(co.checkpoint_every_s)
    if not quota_bound(c.store) or co.commit_budget_per_hour >= FREE_COMMITS:
        return 0.0
    return co.checkpoint_interval_s


def due(c: Coordinator, *, force: bool = False) -> bool:
    """Whether a checkpoint should be committed now (under the lock; ``force``: whatever is unsaved, now)."""
    if c.merging is not None and not force:
        return False
    now, co = c.clock(), c.cfg.coordinator
    behind = c.state.version - c.checkpoint.version
    if behind <= 0 and not (c.new_refusals or c.new_evals or c.new_verdicts):
        return False
    if force:
        return True
    if len([t for t in c.commit_times if t > now - 3600]) >= co.commit_budget_per_hour:
        return False
    waited = now - c.checkpoint.at
    every = interval_s(c)
    if behind > 0:
        many = co.checkpoint_every_versions is not None and behind >= co.checkpoint_every_versions
        return c.state.finished or many or waited >= every
    oldest = min(
        [r.at for r in c.new_refusals] + [e[2] for e in c.new_evals.values()] + [v.at for v in c.new_verdicts.values()]
    )
    return now - oldest >= co.refusal_flush_s and waited >= every


@dataclass
class Staged:
    """A checkpoint ready to commit: the state it writes, its files' sources, what it saves."""

    state: RunState
    tagged: bool  # the version is new since the last checkpoint: adapter files, a tag
    momentum: dict[str, Any] | None  # outer momentum tensors by key, written with a tagged checkpoint
    refusals: list
    evals_saved: dict
    workers_then: dict
    verdicts_saved: set
    message: str
    sha: str | None = None


def stage(c: Coordinator) -> Staged:
    """The next checkpoint's state (under the lock): the current state with the unsaved refusals and scores."""
    st = fork_state(c.state)
    st.refused = (st.refused + c.new_refusals)[-MAX_REFUSALS_KEPT:]
    st.next_prompt = max(st.next_prompt, c.pool.next_index)
    saved = evals.apply(st, c.new_evals)
    verdicts_saved = verdicts.apply(st, c.new_verdicts)
    now = c.clock()
    st.commit_times = [t for t in c.commit_times if t > now - 3600] + [now]
    tagged = st.version > c.checkpoint.version or st.version not in c.shas
    if tagged and st.versions:
        st.versions[-1] = st.versions[-1].model_copy(update={"tag": layout.version_tag(st.version)})
    since = [v for v in st.versions if v.version > c.checkpoint.version]
    message = (
        f"hubgrpo: version {st.version} (checkpoint: {len(since)} version(s) since v{c.checkpoint.version}, "
        f"{sum(len(v.merged) for v in since)} submissions)"
        if tagged
        else f"hubgrpo: {len(c.new_refusals)} refusal(s), {len(saved)} held-out score(s) at version {st.version}"
    )
    momentum = c.momentum if tagged and c.cfg.merge.outer_momentum > 0 and not callable(c.momentum) else None
    c.checkpointing = st.version  # its folder stays in the version cache until the commit read it
    return Staged(
        state=st,
        tagged=tagged,
        momentum=momentum,
        refusals=list(c.new_refusals),
        evals_saved=saved,
        verdicts_saved=verdicts_saved,
        workers_then={k: (w.refused, w.accepted) for k, w in c.state.workers.items()},
        message=message,
    )


def files(c: Coordinator, staged: Staged) -> dict[str, bytes | Path]:
    """The checkpoint's files (no lock: the adapter comes from the version cache, the rest is rendered here)."""
    st = staged.state
    out: dict[str, bytes | Path] = {layout.STATE_FILE: st.to_json(), layout.MODEL_CARD: run_card(c.cfg, st).encode()}
    if staged.tagged:
        folder = c.versions.path(st.version)
        if folder is None:
            folder = c.version_dir(st.version, c.ids[st.version])
        out[layout.ADAPTER_WEIGHTS] = folder / layout.ADAPTER_WEIGHTS
        out[layout.ADAPTER_CONFIG] = folder / layout.ADAPTER_CONFIG
    if staged.momentum is not None:
        from safetensors.torch import save

        out[layout.MOMENTUM_FILE] = save({k: v.contiguous() for k, v in staged.momentum.items()})
    return out


def commit(c: Coordinator, staged: Staged) -> dict | None:
    """The compare-and-swap commit (+ tag) of ``staged`` (WITHOUT the lock; ``staged.sha`` is its commit). Retried
    when only worker commits moved the head. None once committed; when another coordinator checkpointed first, what
    ``c.read_repo`` read (the caller adopts it under the lock)."""
    adds = files(c, staged)
    for _ in range(MAX_CAS_RETRIES):
        head = c.store.head()
        if head != c.head and runrepo.read_state(c.store, head).version != c.checkpoint.version:
            log.warning(
                "another coordinator wrote the run repo (its head is no longer checkpoint v%d); reloading",
                c.checkpoint.version,
            )
            return c.read_repo()
        try:
            deletes = merge_deletes(c.store, c.cfg, staged.state, head) if staged.tagged else []
            staged.sha = sha = c.store.commit(adds, deletes, message=staged.message, parent=head)
        except CommitConflict:
            continue
        if staged.tagged:
            try:  # the commit landed: a tag that failed is re-created from it at the next load (reconcile)
                c.store.tag(layout.version_tag(staged.state.version), sha, exist_ok=True)
            except HubGrpoError as e:
                log.warning(
                    "checkpoint v%d committed (%s) but not tagged: %s", staged.state.version, sha[:10], e.message
                )
        return None
    raise CommitConflict(
        f"could not commit the checkpoint of version {staged.state.version} after "
        f"{MAX_CAS_RETRIES} tries: the head keeps moving",
        hint="too many concurrent commits",
    )


def adopt(c: Coordinator, staged: Staged) -> None:
    """Adopt a committed checkpoint (under the lock), keeping what happened meanwhile."""
    st, now, sha = staged.state, c.clock(), staged.sha
    assert sha is not None, "adopt() takes a committed checkpoint"
    c.head = sha
    c.commit_times.append(now)
    saved = {id(r) for r in staged.refusals}
    c.new_refusals = [r for r in c.new_refusals if id(r) not in saved]
    c.new_evals = {v: e for v, e in c.new_evals.items() if v not in staged.evals_saved}
    c.new_verdicts = {k: v for k, v in c.new_verdicts.items() if k not in staged.verdicts_saved}
    if c.state.version == st.version:
        for key, ws in c.state.workers.items():  # rows changed since staging (heartbeats, refusals)
            refused_then, _ = staged.workers_then.get(key, (0, 0))
            row = st.workers.get(key)
            if row is None or row is ws:
                st.workers[key] = ws
                continue
            row.refused += max(0, ws.refused - refused_then)
            row.last_seen = max(row.last_seen, ws.last_seen)
        c.state = st
    else:  # a merge was adopted meanwhile (its state holds these refusals): tag the record in the live state
        c.state.versions = [
            r.model_copy(update={"tag": layout.version_tag(st.version)})
            if r.version == st.version and staged.tagged
            else r
            for r in c.state.versions
        ]
    if staged.tagged:
        c.shas[st.version] = sha
    c.checkpoint = Checkpoint(version=st.version, sha=sha, at=now)
    log.info("checkpoint: version %d committed (%s)", st.version, sha[:10])


def run(c: Coordinator, *, force: bool = False) -> bool:
    """Commit a checkpoint when one is due (``force``: now): stage under ``c.lock``, commit without it, adopt under
    it. True when one was committed; False when none was due or another coordinator won (then ``c`` reloaded)."""
    with c.lock:
        if not due(c, force=force):
            return False
        staged = stage(c)
    try:
        lost_to = commit(c, staged)
    finally:
        c.checkpointing = None
    with c.lock:
        if lost_to is None:
            adopt(c, staged)
        else:
            c.apply_repo(lost_to)
    return lost_to is None
