"""Run status as plain JSON: what `hubgrpo status`, the coordinator API and the Space UI show."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hubgrpo import layout
from hubgrpo.layout import RunState

if TYPE_CHECKING:
    from hubgrpo.coordinator.core import Coordinator


def leaderboard(state: RunState, pending_verdicts: dict | None = None) -> list[dict]:
    """One row per worker, ranked by what the coordinator verified rather than by reward: completions of its
    rounds merged with weight (credited ``samples``, derived from the leases), then credited rounds, then fewer
    refusals. ``mean_reward`` (the credited rounds' recomputed reward) is shown, never ranked on: a round of
    completions copied from the data set scores 1.0 too. ``uncredited``: rounds merged with weight 0. Proof of
    rollouts (``verdicts``): ``checked`` and ``failed`` rounds of the worker; an ``excluded`` participant's rows
    rank last, whatever they merged."""
    from hubgrpo.coordinator import verdicts

    known = verdicts.known(state, pending_verdicts)
    out = verdicts.excluded(state, pending_verdicts)
    checked: dict[str, list[int]] = {}
    for v in known.values():
        row = checked.setdefault(f"{v.user}/{v.worker}" if v.user else v.worker, [0, 0])
        row[0] += 1
        row[1] += not v.report.passed
    rows: list[dict[str, Any]] = []
    for w in list(state.workers.values()):  # copies: status runs unlocked
        mean = w.reward_sum / w.accepted if w.accepted else None
        gain = None if w.reward_first is None or w.reward_last is None else w.reward_last - w.reward_first
        rows.append(
            {
                "worker": w.worker,
                "user": w.user,
                "accepted": w.accepted,
                "refused": w.refused,
                "uncredited": w.uncredited,
                "samples": w.samples,
                "mean_reward": mean,
                "reward_gain": gain,
                "last_seen": w.last_seen,
                "checked": checked.get(f"{w.user}/{w.worker}" if w.user else w.worker, [0, 0])[0],
                "failed": checked.get(f"{w.user}/{w.worker}" if w.user else w.worker, [0, 0])[1],
                "excluded": verdicts.participant(w.worker, w.user) in out,
            }
        )
    rows.sort(key=lambda r: (r["excluded"], -r["samples"], -r["accepted"], r["refused"], r["worker"], r["user"] or ""))
    return rows


def versions_table(state: RunState, evals: dict | None = None) -> list[dict]:
    """One row per version: ``reward`` is the merged rounds' recomputed training reward, ``eval_reward`` the
    held-out score (state.json's, or an unsaved one from ``evals``: version → (reward, samples, when))."""
    evals = evals or {}
    return [
        {
            "version": v.version,
            "tag": v.tag,
            "adapter_id": v.adapter_id,
            "created_at": v.created_at,
            "reward": v.reward_mean,
            "eval_reward": v.eval_reward if v.eval_reward is not None else evals.get(v.version, (None,))[0],
            "eval_samples": v.eval_samples if v.eval_reward is not None else evals.get(v.version, (0, None))[1],
            "start_version": v.start_version,
            "samples": v.samples,
            "submissions": len(v.merged),
            "residual": v.residual,
            "max_staleness": max((m.staleness for m in v.merged), default=0),
            "method": v.method,
            "algorithm": v.algorithm,
            "contributors": sorted({m.worker for m in v.merged}),
        }
        for v in state.versions
    ]


def _excluded(state: RunState) -> set[str]:
    from hubgrpo.coordinator.verdicts import excluded

    return excluded(state)


UNSAVED_SHOWN = 5000  # cap on the unsaved refusals a live status lists (all of them in any realistic run)


def state_status(state: RunState, target_versions: int | None = None) -> dict:
    """Status computed from state.json alone (no live coordinator): for `hubgrpo status` on a repo."""
    return {
        "project": state.project_name,
        "run_id": state.run_id,
        "version": state.version,
        "target_versions": target_versions,
        "finished": state.finished,
        "samples_total": state.samples_total,
        "leaderboard": leaderboard(state),
        "versions": versions_table(state),
        "verify": {
            "checked": len(state.verdicts),
            "failed": sum(not v.report.passed for v in state.verdicts),
            "excluded": sorted(_excluded(state)),
        },
        "refusals": [r.model_dump() for r in state.refused[-50:]],
    }


def run_status(c: Coordinator) -> dict:
    """Live status of a Coordinator: state plus leases, pending submissions and the commit budget."""
    now = c.clock()
    out = state_status(c.state, c.cfg.rounds.versions)
    out["versions"] = versions_table(c.state, dict(c.new_evals))  # with the held-out scores not saved yet
    from hubgrpo.coordinator import verdicts

    out["leaderboard"] = leaderboard(c.state, dict(c.new_verdicts))  # with the verdicts not saved yet
    out["verify"] = verdicts.summary(c)
    # the last 50 saved refusals, plus every refusal not yet in state.json (saved with the next merge), so that
    # none is out of sight — e.g. a round refused as stale when a merge was planned, after which no merge came
    out["refusals"] = [r.model_dump() for r in c.state.refused[-50:] + c.new_refusals[-UNSAVED_SHOWN:]]
    out["refusals_unsaved"] = len(c.new_refusals)
    out["leases"] = [
        {
            "lease_id": lid,
            "worker": lease.worker,
            "user": lease.user,
            "base_version": lease.base_version,
            "expires_in_s": round(lease.deadline - now, 1),
        }
        for lid, lease in list(c.active.items())
    ]
    out["pending"] = sorted(list(c.pending))
    out["merging"] = c.merging
    out["commits_last_hour"] = len([t for t in list(c.commit_times) if t > now - 3600])
    out["commit_budget_per_hour"] = c.cfg.coordinator.commit_budget_per_hour
    out["prompts_returned"] = c.pool.returned
    out["head"] = c.head
    out["version_sha"] = c.shas.get(c.state.version)  # the commit of the current version (None until checkpointed)
    out["version_id"] = c.ids.get(c.state.version)  # its adapter id: what a rebasing worker (merge.rebase) fetches
    cp = c.checkpoint
    out["checkpoint"] = {"version": cp.version, "tag": layout.version_tag(cp.version), "sha": cp.sha, "at": cp.at}
    return out
