"""What a simulation writes: ``simulation.json`` and ``simulation.png`` (held-out reward vs virtual wall-clock and
vs samples), and the time to a target reward."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hubgrpo.sim.loop import Simulation


def time_to_target(versions: list[dict], target: float, key: str = "eval_reward") -> dict | None:
    """The first version whose ``key`` reaches ``target``: {version, virtual_time_s, samples}; None if none did."""
    hit = next((v for v in versions if v.get(key) is not None and v[key] >= target), None)
    return (
        None
        if hit is None
        else {"version": hit["version"], "virtual_time_s": hit["virtual_time_s"], "samples": hit["samples"]}
    )


def derived_target(versions: list[dict], fraction: float = 0.9) -> float | None:
    """``fraction`` of the way from the version-0 held-out reward to the best one reached (None without evals)."""
    evals = [v["eval_reward"] for v in versions if v.get("eval_reward") is not None]
    if len(evals) < 2:
        return None
    return evals[0] + fraction * (max(evals) - evals[0])


def finish(result: dict, output: Path, target: float | None = None) -> dict:
    """Add ``target``/``time_to_target_s`` to ``result``, write simulation.json and simulation.png."""
    versions = result["versions"]
    given = target is not None
    target = target if given else derived_target(versions)
    hit = time_to_target(versions, target) if target is not None else None
    result.update(
        target_reward=target,
        target_source="given" if given else "90% of the way to the best reached",
        time_to_target_s=hit and hit["virtual_time_s"],
        version_at_target=hit and hit["version"],
        samples_to_target=hit and hit["samples"],
    )
    output.mkdir(parents=True, exist_ok=True)
    (output / "simulation.json").write_text(json.dumps(result, indent=1))
    plot(result, output / "simulation.png")
    return result


def plot(result: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [v for v in result["versions"] if v.get("eval_reward") is not None]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.plot([v["virtual_time_s"] / 60 for v in rows], [v["eval_reward"] for v in rows], marker=".")
    a.set_xlabel("virtual wall-clock (minutes)")
    a.set_ylabel("held-out reward (greedy)")
    b.plot([v["samples"] for v in rows], [v["eval_reward"] for v in rows], marker=".")
    b.set_xlabel("completions merged")
    for ax in (a, b):
        if result.get("target_reward") is not None:
            ax.axhline(result["target_reward"], color="grey", linestyle="--", linewidth=0.8)
    fig.suptitle(
        f"hubgrpo simulate: {result['workers']} workers, speeds "
        f"{min(result['speeds']):.2f}–{max(result['speeds']):.2f}, dropout {result['dropout']:g}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def summary_lines(result: dict) -> list[str]:
    last = result["versions"][-1]
    evals = [v["eval_reward"] for v in result["versions"] if v.get("eval_reward") is not None]
    tt = result.get("time_to_target_s")
    return [
        f"{result['workers']} workers, {last['version']} versions in {result['virtual_wall_s'] / 60:.1f} "
        f"virtual minutes ({result['rounds_total']} rounds: {result['rounds_by_status']})",
        f"held-out reward {evals[0]:.3f} → {evals[-1]:.3f} (best {max(evals):.3f})" if evals else "no evaluation",
        f"staleness of merged rounds: {result['staleness_histogram']}" + _moved(result),
        f"target {result['target_reward']:.3f}: "
        + (f"reached at version {result['version_at_target']}, {tt:.0f} virtual s" if tt is not None else "not reached")
        if result.get("target_reward") is not None
        else "no target",
        quota_line(result),
        f"real compute: {result['compute']}",
    ]


def quota_line(result: dict) -> str:
    """Which commit quota the run repo had, and how many commits the run made in its busiest virtual hour."""
    q = result.get("quota") or {}
    if not q:
        return "Hub commit quota: not recorded"
    quota = f"{q['quota_per_hour']} commits per rolling virtual hour" if q["in_force"] else "off (commits free)"
    mean = q.get("commits_per_hour_mean")
    return (
        f"Hub commit quota: {quota}; coordinator budget {q['commit_budget_per_hour']}/hour; {q['commits']} "
        f"commits, peak {q['peak_commits_per_hour']} commits in a rolling virtual hour"
        + (f" ({mean:g}/hour on average)" if mean is not None else "")
        + f"; {q['refused_429']} refused by the quota (429); rounds via the {result.get('rounds_via', 'repo')}"
    )


def _moved(result: dict) -> str:
    """merge.rebase: how many trained rounds moved onto a newer version mid-round."""
    trained = [r for r in result["rounds"] if r.get("t_deliver") is not None]
    moved = sum(r.get("rebased_version") is not None for r in trained)
    return (
        f"; {moved} of {len(trained)} delivered rounds moved onto a newer version mid-round"
        if result["config"]["merge"].get("rebase")
        else ""
    )


def simulation_result(sim: Simulation) -> dict:
    """Everything ``finish`` writes of a simulation that ran; ``compute`` (real seconds) is its only
    non-deterministic part."""
    from hubgrpo.sim.store import quota_report

    merged = [s for v in sim.versions for s in v["staleness"]]
    return {
        "workers": len(sim.fleet),
        "speeds": [w.speed for w in sim.fleet],
        "starts": sim.starts,
        "seed": sim.opts.seed,
        "dropout": sim.opts.dropout,
        "latency_s": sim.opts.latency_s,
        "step_s": sim.cost.step_s,
        "jitter": sim.opts.jitter,
        "eval": "greedy" if sim.opts.eval_sampled <= 0 else f"sampled x{sim.opts.eval_sampled}",
        "eval_samples": sim.opts.eval_samples,
        "rejoin_s": sim.rejoin_s,
        "virtual_wall_s": round(sim.now, 6),
        "versions": sim.versions,
        "staleness_histogram": {str(k): merged.count(k) for k in sorted(set(merged))},
        "rounds": [r.__dict__ for r in sim.rounds],
        "rounds_total": len(sim.rounds),
        "stalled": sim.stalled,
        "rounds_by_status": {s: sum(r.status == s for r in sim.rounds) for s in sorted({r.status for r in sim.rounds})},
        "refusal_codes": sorted({r.code for r in sim.rounds if r.code}),
        "config": {
            "base_model": sim.cfg.base_model,
            "steps_per_round": sim.cfg.rounds.steps,
            "completions_per_step": sim.cfg.params.per_device_train_batch_size,
            "fleet_batch": sim.cfg.rounds.fleet_batch,
            "merge": sim.cfg.merge.model_dump(),
            "quorum": sim.cfg.merge.quorum,
        },
        "quota": {
            **quota_report(sim.store, sim.now, sim.cfg.coordinator.commit_budget_per_hour),
            "waits": dict(sim.quota_waits),
        },
        "rounds_via": "inbox" if sim.cfg.hub.submissions else "repo",
        "compute": {k: round(v, 2) for k, v in sim.compute.items()},
    }
