"""Does adding machines reach a good model sooner? Time-to-target speed-up vs N, from ``hubgrpo simulate``.

    python benchmarks/scaleout/scaleout.py --mode tiny     [--workers 1,2,4,8,16] [--fleets homog,hetero] [--seeds 0,1,2]
    python benchmarks/scaleout/scaleout.py --mode smollm2  [--workers 1,2,4,8]    [--fleets hetero] [--seeds 0]
    python benchmarks/scaleout/scaleout.py --mode tiny --rule sync_sqrt         # quorum / outer lr as a rule of N
    python benchmarks/scaleout/scaleout.py --quick     # the script checked: tiny, N = 1 and 2, a short budget

For each mode and seed: N = 1 (speed 1) runs for the single worker's budget (``--budget-steps`` GRPO steps of
virtual time); the target is ``--target-fraction`` (0.9) of its final held-out reward (the mean of its last 3
versions). Every other (fleet, N) runs until it reaches that target and at least until the time N = 1 reached
it (so "held-out at equal time" exists for all), at most the single worker's whole budget. Fleets: ``homog``
(all speed 1), ``hetero`` (``spread:2``: the fastest twice the slowest, mean speed 1, and 10 % dropouts). The
total compute of N workers is N× that of one, so parallel efficiency = speed-up / N.

Reported per (fleet, N): time to target and speed-up vs N = 1 (virtual seconds, from the cost model), parallel
efficiency, samples to target, held-out reward at the time N = 1 reached the target, the staleness histogram,
refused rounds; and the single-process ``hubgrpo train`` reference (same number of steps as N = 1, same eval).

``--commit-quota`` holds the run repo to the Hub's quota (128 commits per rolling virtual hour by default) and sets
the coordinator's budget to it; ``both`` runs every fleet under the quota and with free commits, and the report
gives, per seed, the fleet's time to target with free commits over its time under the quota: its speed-up under
the quota as a fraction of its free-commit speed-up (both against the same N = 1 reference; the target is ≥ 0.9).
Real runs replayed in the simulator: ``benchmarks/simulator/validate.py``.

Writes results/<name>.{md,json,png}. Each simulation is a ``hubgrpo simulate`` subprocess (as a user runs it); its
folder is kept under ``--work`` (default a temporary folder).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.common import cached_run, options, results_dir, same_epoch, sets, simulate, start, write  # noqa: E402

MODES = {
    # config, virtual budget of the single worker (GRPO steps), held-out eval flags, extra overrides
    "tiny": {"config": "configs/tiny.yaml", "budget_steps": 48,
             "eval": ["--eval-sampled", "2", "--eval-samples", "64"], "set": ["rounds.steps=4"]},
    "smollm2": {"config": "configs/demo.yaml", "budget_steps": 40, "eval": ["--eval-samples", "32"],
                "set": ["rounds.steps=5"]},
    # greedy held-out on 1-digit addition saturates after one round (0.56 -> ~0.94 for every N), so it cannot
    # separate fleet sizes; the sampled held-out reward (temperature 1, like training) rises over ~20 steps
    "smollm2-sampled": {"config": "configs/demo.yaml", "budget_steps": 40,
                        "eval": ["--eval-sampled", "1", "--eval-samples", "64"],
                        "set": ["rounds.steps=5", "worker.threads=1"]},
    # two or three one-digit terms (configs/addition-mixed.yaml; its headroom is seed 0's so far): 200 steps of budget
    "mixed-sampled": {"config": "configs/addition-mixed.yaml", "budget_steps": 200,
                      # scored every 2nd version (a 64-prompt sampled score costs about four training steps); N
                      # machines every N-th: once per machine step on average, finer than N = 1's two steps
                      "eval": ["--eval-sampled", "1", "--eval-samples", "64", "--eval-every", "2"],
                      # the learning rate's schedule (wsd) spans the single machine's 200 versions, as `hubgrpo
                      # train --steps 200` spans its steps (rounds.schedule_versions; results measured before it
                      # kept the peak rate: benchmarks/LOG.md, 2026-12-07, "Found: ...")
                      "every": lambda n: max(2, n), "set": ["worker.threads=1", "rounds.versions=200"]},
}
FLEETS = {"homog": ["--speeds", "1"], "hetero": ["--speeds", "spread:2", "--dropout", "0.1"]}
PLAIN = ["merge.outer_lr=1", "merge.outer_momentum=0", "merge.nesterov=false"]
# How the merge follows the fleet size N (``--rule``; N = 1 runs the config as it is, plus ``--single-set``):
RULES = {
    "fixed": lambda n: [],  # the config's own merge for every N
    "fedasync": lambda n: ["merge.staleness_scaling=absolute"],  # a round τ versions stale moves by (1+τ)^-0.5
    "fedbuff": lambda n: [f"merge.quorum={max(1, n // 2)}"],  # a buffer of half the fleet per version
    "fedbuff_sqrt": lambda n: [f"merge.quorum={max(1, n // 2)}", f"merge.outer_lr={max(1, n // 2) ** 0.5:.4g}"],
    "sync_sqrt": lambda n: [f"merge.quorum={n}", f"merge.outer_lr={n ** 0.5:.4g}"],  # every worker, then a step
    # delayed Nesterov (Liu et al. 2024): the outer momentum moves once per N merges, i.e. once per fleet round
    "dn": lambda n: [f"merge.momentum_every={n}"],
    # ... with the outer lr raised so that a steady direction moves as far per version as the plain Nesterov merge
    # of configs/demo.yaml (lr 0.3, μ 0.9): lr/(1−μ) per version there, lr·(1 + μ/((1−μ)·N)) with delayed Nesterov
    "dn_lr": lambda n: [f"merge.momentum_every={n}", f"merge.outer_lr={0.3 * n / (n * 0.1 + 0.9):.4g}"],
    # dynamic local steps (their DyLU): faster workers get more steps per lease, so rounds arrive evenly
    "balance": lambda n: ["rounds.balance=true"],
    "stale_2n": lambda n: [f"merge.max_staleness={2 * n}"],  # no round refused as stale at quorum 1
    "dn_balance": lambda n: [f"merge.momentum_every={n}", "rounds.balance=true"],
    # FFA-LoRA (A frozen), and FFA with mid-round rebase: a round moves onto each newer version between steps
    "ffa": lambda n: ["merge.method=ffa", "merge.rebase=false"],
    "ffa_rebase": lambda n: ["merge.method=ffa", "merge.rebase=true"],
    # ... without the outer momentum (outer lr 1: every round applied as it is), with and without rebase
    "ffa_plain": lambda n: ["merge.method=ffa", "merge.rebase=false", *PLAIN],
    "ffa_rebase_plain": lambda n: ["merge.method=ffa", "merge.rebase=true", *PLAIN],
    # the config's merge, and first rounds staggered (1, 1/2, 1/4, 3/4, ... of a round) so that rounds arrive spread
    "stagger": lambda n: ["rounds.stagger=true"],
    # the config's merge with the outer lr falling as 4/N beyond 4 machines (each version moves less when more
    # rounds arrive per unit of time)
    "lr_4_over_n": lambda n: [f"merge.outer_lr={min(1.0, 4 / n):.4g}"],
    # ... and the other way: every round applied half again as far (stale rounds still point the right way)
    "outer_1_5": lambda n: ["merge.outer_lr=1.5"],
    # ... through the coordinator's own count of live workers (merge.fleet_outer_lr: 1.5 from two live workers on;
    # since 9060dcc fading with the schedule as the default does; add merge.fleet_outer_lr_decays=false to hold it)
    "fleet_outer_1_5": lambda n: ["merge.fleet_outer_lr=1.5"],
    # the config's merge with shorter rounds: a round sees the other machines' steps sooner (rebase) and versions
    # flow from the first seconds on
    "spr2": lambda n: ["rounds.steps=2"],
    "spr1": lambda n: ["rounds.steps=1"],
    # ... and no round refused as stale at quorum 1 (a 1-step round has no step boundary to rebase at)
    "spr1_stale_2n": lambda n: ["rounds.steps=1", f"merge.max_staleness={2 * n}"],
    # ... the same through the coordinator's own count of live workers (merge.staleness_per_worker)
    "spr1_spw2": lambda n: ["rounds.steps=1", "merge.staleness_per_worker=2"],
}


HUB_QUOTA = "128"
TARGET_RATIO = 0.9
# where rounds go: through the coordinator (``hub.submissions: coordinator``, what a Hub-only run uses; the
# simulation keeps the box in its own folder), or one commit of the run repo each
ROUNDS = {"box": ["hub.submissions=coordinator"], "repo": []}


def parse_quotas(spec: str) -> list[str]:
    """``--commit-quota``: ``both`` → the Hub's quota and off; else the one value (N or off)."""
    spec = str(spec).strip().lower()
    if spec == "both":
        return [HUB_QUOTA, "off"]
    if spec == "off" or (spec.isdigit() and int(spec) > 0):
        return [spec]
    raise SystemExit(f"--commit-quota {spec!r}: use a number of commits an hour, off, or both")


def quota_ratios(seeds: list[dict]) -> list[dict]:
    """Per (fleet, N) run under a quota and with free commits: time to target free / under the quota, per seed."""
    out = []
    keys = sorted({(r["fleet"], r["workers"], r["quota"]) for s in seeds for r in s["rows"]
                   if r.get("quota", "off") != "off" and r["workers"] > 1})
    for fleet, n, quota in keys:
        per_seed = {}
        for s in seeds:
            mine = {r.get("quota", "off"): r for r in s["rows"] if (r["fleet"], r["workers"]) == (fleet, n)}
            held, free = mine.get(quota), mine.get("off")
            if held and free and held["time_to_target_s"] and free["time_to_target_s"]:
                per_seed[s["seed"]] = free["time_to_target_s"] / held["time_to_target_s"]
            elif held and free:
                per_seed[s["seed"]] = None  # one of them did not reach the target
        if not per_seed:
            continue  # nothing ran with free commits to compare with
        ratios = [x for x in per_seed.values() if x is not None]
        out.append({"fleet": fleet, "workers": n, "quota": quota, "ratio_per_seed": per_seed,
                    "ratio_mean": statistics.mean(ratios) if ratios else None,
                    "met": bool(ratios) and len(ratios) == len(per_seed) and min(ratios) >= TARGET_RATIO})
    return out


def quota_sentence(report: dict) -> str:
    quotas = report["args"].get("quotas") or ["off"]
    said = " and ".join("free commits (quota off)" if q == "off" else f"the Hub's quota of {q} commits per rolling "
                        "virtual hour on the run repo (the coordinator's budget the same)" for q in quotas)
    rounds = report["args"].get("rounds", "repo")
    return (f"Commits: {said}; rounds {'off the commit path (hub.submissions)' if rounds == 'box' else 'one commit each'}"
            ". " + (f"N = 1 from {report['args']['reference_from']} (recorded earlier, {_single_quota(report)})."
                    if report["args"].get("reference_from") else f"N = 1 ran with quota {quotas[0]}."))


def _single_quota(report: dict) -> str:
    """How the recorded N = 1 reference held its commits (its row's quota)."""
    quotas = {r.get("quota", "off") for s in report["seeds"] for r in s["rows"] if r["workers"] == 1}
    return "free commits" if quotas == {"off"} else f"commit quota {' / '.join(sorted(map(str, quotas)))}"


def ratio_markdown(report: dict) -> list[str]:
    rows = report.get("quota_ratios") or []
    if not rows:
        return []
    lines = ["", f"Speed-up under the quota as a fraction of the free-commit speed-up (time to target free / under "
             f"the quota; target >= {TARGET_RATIO}):", "", "| fleet | N | quota | per seed | mean | met |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        seeds = " / ".join(f"s{k} " + ("–" if v is None else f"{v:.2f}×") for k, v in r["ratio_per_seed"].items())
        mean = "–" if r["ratio_mean"] is None else f"{r['ratio_mean']:.2f}×"
        lines.append(f"| {r['fleet']} | {r['workers']} | {r['quota']} | {seeds} | {mean} | {'yes' if r['met'] else 'no'} |")
    return lines


def eval_at(result: dict, t: float) -> float | None:
    """Held-out reward of the newest evaluated version at virtual time ``t``."""
    rows = [v for v in result["versions"] if v["eval_reward"] is not None and v["virtual_time_s"] <= t + 1e-9]
    return rows[-1]["eval_reward"] if rows else None


def one_seed(mode: dict, args, seed: int, work: Path) -> dict:
    from hubgrpo.config import load_config
    from hubgrpo.sim.fleet import default_step_s

    common = [*mode["eval"], *sets([*mode["set"], *args.set, *ROUNDS[args.rounds]])]
    step_s = default_step_s(load_config(ROOT / mode["config"], overrides=[*mode["set"], *args.set]).base_model)
    budget_s = mode["budget_steps"] * step_s
    if args.reference_from:
        single_row, single_final = recorded_reference(args, seed)
        target = args.target_fraction * single_final
        t1 = single_row["time_to_target_s"]
        rows = [single_row]
    else:
        q1 = args.quotas[0]
        single = simulate(work / (f"s{seed}-homog-1" + "".join(f"-{r}" for r in args.single_set) + f"-q{q1}"),
                          mode["config"], 1, seed, [*common, *sets(args.single_set), "--max-virtual-s", str(budget_s)],
                          quota=q1)
        finals = [v["eval_reward"] for v in single["versions"] if v["eval_reward"] is not None][-3:]
        single_final = statistics.mean(finals)
        target = args.target_fraction * single_final
        hit = next((v for v in single["versions"] if v["eval_reward"] is not None and v["eval_reward"] >= target), None)
        t1 = hit["virtual_time_s"] if hit else budget_s
        rows = [{**row("homog", 1, single, target, t1, t1), "quota": q1}]
    for fleet, n, quota in ((f, n, q) for f in args.fleets for n in args.workers for q in args.quotas):
        if n == 1 and fleet == "homog":
            continue
        rule = RULES[args.rule](n)
        until = ["--until-reward", str(target), "--max-virtual-s", str(budget_s)]
        if not args.stop_at_target:
            until += ["--min-virtual-s", str(t1)]
        # N machines publish versions N times as often: score every k-th (``every``: a mode's own rule of N, else
        # N/4 from N = 8; either overrides the mode's --eval-every)
        k = mode["every"](n) if "every" in mode else (max(1, n // 4) if n >= 8 else None)
        every = ["--eval-every", str(k)] if args.stop_at_target and k else []
        res = simulate(work / (f"s{seed}-{fleet}-{n}" + "".join(f"-{r}" for r in rule) + f"-q{quota}"),
                       mode["config"], n, seed, [*common, *every, *sets(rule), *FLEETS[fleet], *until], quota=quota)
        rows.append({**row(fleet, n, res, target, t1, res.get("time_to_target_s")), "quota": quota})
    return {"seed": seed, "target": target, "single_final": single_final, "t1": t1,
            "budget_s": budget_s, "step_s": step_s, "rows": rows}


def recorded_reference(args, seed: int) -> tuple[dict, float]:
    """The N = 1 row and final held-out reward of ``seed`` from an earlier result (``--reference-from``): the same
    simulation, not run again; its mode, ``--set`` and ``--single-set`` must be this run's."""
    old = json.loads(args.reference_from.read_text())
    same_epoch(old, f"--reference-from {args.reference_from}")
    theirs = (old["args"]["mode"], old["args"]["set"], old["args"].get("single_set", []))
    if theirs != (args.mode, args.set, args.single_set):
        sys.exit(f"--reference-from {args.reference_from}: it ran (mode, --set, --single-set) {theirs}, this run "
                 f"{(args.mode, args.set, args.single_set)}")
    for s in old["seeds"]:
        if s["seed"] == seed:
            single = next(r for r in s["rows"] if (r["fleet"], r["workers"]) == ("homog", 1))
            return single, s["single_final"]
    sys.exit(f"--reference-from {args.reference_from} has no seed {seed}")


def row(fleet: str, n: int, res: dict, target: float, t1: float, t_hit: float | None) -> dict:
    evals = [v["eval_reward"] for v in res["versions"] if v["eval_reward"] is not None]
    # samples merged when this benchmark's target was first reached (the simulation's own target can differ:
    # N = 1 runs without one and derives it)
    hit = next((v for v in res["versions"] if v["eval_reward"] is not None and v["eval_reward"] >= target), None)
    return {"fleet": fleet, "workers": n, "time_to_target_s": t_hit, "speedup": (t1 / t_hit) if t_hit else None,
            "efficiency": (t1 / t_hit / n) if t_hit else None, "samples_to_target": hit["samples"] if hit else None,
            "eval_at_t1": eval_at(res, t1) if res["virtual_wall_s"] >= t1 - 1e-9 else None,  # stopped early: none
            "eval_initial": evals[0] if evals else None,
            "eval_final": evals[-1] if evals else None, "versions": res["versions"][-1]["version"],
            "virtual_wall_s": res["virtual_wall_s"], "staleness_histogram": res["staleness_histogram"],
            "rounds_by_status": res["rounds_by_status"], "refusal_codes": res["refusal_codes"],
            "real_wall_s": res.get("real_wall_s"), "compute": res["compute"], "commits": res.get("quota"),
            "rounds_via": res.get("rounds_via"),
            "curve": [(v["virtual_time_s"], v["samples"], v["eval_reward"]) for v in res["versions"]]}


def train_reference(mode: dict, args, seed: int, work: Path) -> dict:
    """``hubgrpo train`` for the single worker's budget of steps, scored like the simulations (reused from an
    earlier run of the same command on the same config contents under ``--work``)."""
    out = work / f"train-s{seed}"
    cached_run(out, ["train", mode["config"], "--steps", str(mode["budget_steps"]), "--eval-samples", "0",
                     *sets([*mode["set"], *args.set, f"params.seed={seed}"])], "metrics.json")
    from hubgrpo.config import load_config
    from hubgrpo.worker.engine import RoundEngine

    cfg = load_config(ROOT / mode["config"], overrides=[*mode["set"], *args.set, f"params.seed={seed}"])
    engine = RoundEngine(cfg, worker="eval")
    flags = dict(zip(mode["eval"][::2], mode["eval"][1::2]))
    n, k = int(flags.get("--eval-samples", 32)), int(flags.get("--eval-sampled", 0))
    if k:
        engine.load_adapter(out)
        final = sum(engine.evaluate(n=n, greedy=False, seed=1000 + i) for i in range(k)) / k
    else:
        final = engine.evaluate(out, n=n)
    return {"seed": seed, "steps": mode["budget_steps"], "eval_final": final}


def summarise(seeds: list[dict]) -> list[dict]:
    key = lambda r: (r["fleet"], r["workers"], str(r.get("quota", "off")))  # noqa: E731
    keys = sorted({key(r) for s in seeds for r in s["rows"]}, key=lambda k: (k[0] != "homog", k))
    out = []
    for fleet, n, quota in keys:
        rs = [r for s in seeds for r in s["rows"] if key(r) == (fleet, n, quota)]
        sp = [r["speedup"] for r in rs if r["speedup"]]
        out.append({"fleet": fleet, "workers": n, "quota": quota, "seeds": len(rs), "reached": len(sp),
                    "peak_commits_per_hour": max((r["commits"]["peak_commits_per_hour"] for r in rs if r.get("commits")),
                                                 default=None),
                    "refused_429": sum(r["commits"]["refused_429"] for r in rs if r.get("commits")),
                    "speedup_mean": statistics.mean(sp) if sp else None,
                    "speedup_sd": statistics.stdev(sp) if len(sp) > 1 else None,
                    "efficiency_mean": statistics.mean(x / n for x in sp) if sp else None,
                    "samples_to_target": _mean([r["samples_to_target"] for r in rs]),
                    "eval_at_t1": _mean([r["eval_at_t1"] for r in rs]),
                    "max_staleness": max((int(k) for r in rs for k in r["staleness_histogram"]), default=0),
                    "refused": sum(r["rounds_by_status"].get("refused", 0) for r in rs)})
    return out


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return statistics.mean(xs) if xs else None


def fmt(x, spec=".2f"):
    return "–" if x is None else format(x, spec)


def to_markdown(report: dict) -> str:
    a = report["args"]
    lines = [f"# Scale-out: time to target vs workers — {a['mode']}", "",
             f"Config `{report['config']}`{' with ' + ', '.join(a['set']) if a['set'] else ''}; seeds {a['seeds']}; "
             f"merge rule `{a.get('rule', 'fixed')}` (N > 1: {', '.join(RULES[a.get('rule', 'fixed')](8)) or 'the config as it is'} at N = 8); "
             f"N = 1 {'with ' + ', '.join(a['single_set']) if a.get('single_set') else 'as configured'}; "
             f"virtual seconds from the cost model ({report['seeds'][0]['step_s']} s per GRPO step at speed 1). "
             f"Target: {a['target_fraction']:.0%} of the single worker's final held-out reward "
             f"(per seed: {', '.join(fmt(s['target'], '.3f') for s in report['seeds'])}).",
             quota_sentence(report),
             "", "| fleet | N | commit quota | speed-up (mean ± sd) | efficiency | reached | samples to target | held-out "
             "at N=1's time to target | max τ | refused | peak commits / virtual hour | 429s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["summary"]:
        sd = f" ± {r['speedup_sd']:.2f}" if r["speedup_sd"] is not None else ""
        lines.append(f"| {r['fleet']} | {r['workers']} | {r.get('quota', 'off')} | {fmt(r['speedup_mean'])}×{sd} | "
                     f"{fmt(r['efficiency_mean'] and 100 * r['efficiency_mean'], '.0f')} % | {r['reached']}/{r['seeds']} | "
                     f"{fmt(r['samples_to_target'], '.0f')} | {fmt(r['eval_at_t1'], '.3f')} | {r['max_staleness']} | "
                     f"{r['refused']} | {fmt(r.get('peak_commits_per_hour'), 'd')} | "
                     f"{fmt(r.get('refused_429') if r.get('peak_commits_per_hour') is not None else None, 'd')} |")
    lines += ratio_markdown(report)
    if report.get("train"):
        t = report["train"]
        lines += ["", "Single-process `hubgrpo train` with the same steps as N = 1 (same held-out eval): "
                  + ", ".join(f"seed {x['seed']} {x['eval_final']:.3f}" for x in t) + "; N = 1 simulated final: "
                  + ", ".join(f"seed {s['seed']} {s['single_final']:.3f}" for s in report["seeds"]) + "."]
    lines += ["", "homog: every worker speed 1; hetero: speeds spread 2× (mean 1) and 10 % of rounds abandoned "
              "(the machine rejoins a round later). Plot: `" + report["name"] + ".png`."]
    return "\n".join(lines) + "\n"


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    seed = report["seeds"][0]
    for r in seed["rows"]:
        pts = [(t / 60, e) for t, _, e in r["curve"] if e is not None]
        axes[0].plot(*zip(*pts), label=f"{r['fleet']} N={r['workers']}", marker=".")
    axes[0].axhline(seed["target"], color="grey", linestyle="--", linewidth=0.8)
    axes[0].set_xlabel("virtual minutes")
    axes[0].set_ylabel("held-out reward")
    axes[0].set_title(f"seed {seed['seed']}")
    axes[0].legend(fontsize=7)
    for fleet in sorted({r["fleet"] for r in report["summary"]}):
        rs = [r for r in report["summary"] if r["fleet"] == fleet and r["speedup_mean"]]
        axes[1].plot([r["workers"] for r in rs], [r["speedup_mean"] for r in rs], marker="o", label=fleet)
    ns = sorted({r["workers"] for r in report["summary"]})
    axes[1].plot(ns, ns, color="grey", linestyle=":", label="linear")
    axes[1].set_xscale("log", base=2)
    axes[1].set_yscale("log", base=2)
    axes[1].set_xlabel("workers")
    axes[1].set_ylabel("speed-up to target")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def headline(report: dict) -> str:
    """Mean speed-up to target per fleet and N (the first quota when several)."""
    quota = (report["args"].get("quotas") or ["off"])[0]
    parts = []
    for fleet in dict.fromkeys(r["fleet"] for r in report["summary"]):
        rows = [r for r in report["summary"] if r["fleet"] == fleet and r["workers"] > 1
                and str(r.get("quota", "off")) == str(quota)]
        if rows:
            parts.append(f"{fleet} " + ", ".join(f"N = {r['workers']} " + (
                f"{r['speedup_mean']:.2f}×" if r["speedup_mean"] else "not reached") for r in rows))
    if not parts:  # an N = 1 reference alone
        return f"{report['args']['mode']}, N = 1 reference: " + ", ".join(
            f"seed {s['seed']} reached its target {s['target']:.3f} at {s['t1']:.0f} virtual s" for s in report["seeds"])
    ratios = [f"{r['ratio_mean']:.2f} at N = {r['workers']}" for r in report.get("quota_ratios") or []
              if r["ratio_mean"] is not None]
    return (f"{report['args']['mode']}, {len(report['seeds'])} seed(s), speed-up to target: " + "; ".join(parts)
            + (f"; under the quota as a fraction of free commits: {', '.join(ratios)}" if ratios else ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mode", choices=sorted(MODES), default="tiny")
    ap.add_argument("--workers", default=None, help="comma-separated N (default 1,2,4,8,16 tiny; 1,2,4,8 smollm2)")
    ap.add_argument("--fleets", default="homog,hetero")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--target-fraction", type=float, default=0.9)
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--single-set", action="append", default=[],
                    help="overrides for the N = 1 reference only, e.g. rounds.steps=1: one worker scored "
                    "after every step, so its time to target is not rounded up to a 5-step round")
    ap.add_argument("--rule", choices=sorted(RULES), default="fixed", help="how the merge follows N (RULES)")
    ap.add_argument("--no-train", action="store_true", help="skip the hubgrpo train reference")
    ap.add_argument("--stop-at-target", action="store_true",
                    help="stop each N > 1 at the target (no held-out at equal time then): the SmolLM2 runs' cost "
                    "is mostly the versions after it")
    ap.add_argument("--reference-from", type=Path, default=None,
                    help="take each seed's N = 1 run from this earlier result of the same mode and --set")
    ap.add_argument("--commit-quota", default="128",
                    help="the Hub's commits per rolling virtual hour on the run repo (hubgrpo simulate "
                    "--commit-quota): N, off, or both (each fleet under 128 and off: speed-up ratios)")
    ap.add_argument("--rounds", choices=sorted(ROUNDS), default="box",
                    help="box: rounds off the commit path (hub.submissions, as a Hub-only run sends them through "
                    "the coordinator); repo: one commit per round")
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--name", default=None)
    options(ap, __file__)
    args = ap.parse_args()
    mode = dict(MODES[args.mode])
    if args.quick:  # a check of the script: tiny, one homogeneous pair against one worker, 8 steps of budget
        args.mode, args.workers, args.fleets, args.seeds, args.no_train = "tiny", "1,2", "homog", "0", True
        args.stop_at_target = True
        mode = {**MODES["tiny"], "budget_steps": 8, "eval": ["--eval-samples", "4"]}
    meta = start(args.quick)  # the code these simulations run (the tree may move on while they do)
    args.workers = [int(x) for x in (args.workers or ("1,2,4,8,16" if args.mode == "tiny" else "1,2,4,8")).split(",")]
    args.fleets = args.fleets.split(",")
    args.quotas = parse_quotas(args.commit_quota)
    name = args.name or f"scaleout-{args.mode}"
    work = args.work or Path(tempfile.mkdtemp(prefix="hubgrpo-scaleout-"))
    seeds = []
    for seed in [int(s) for s in args.seeds.split(",")]:
        seeds.append(one_seed(mode, args, seed, work))
        print(json.dumps({k: v for k, v in seeds[-1].items() if k != "rows"}), flush=True)
    train = [] if args.no_train else [train_reference(mode, args, s["seed"], work) for s in seeds]
    report = {"name": name, "args": {**vars(args), "work": str(work), "results": str(args.results),
                                     "reference_from": args.reference_from and str(args.reference_from)},
              "config": mode["config"], "seeds": seeds, "summary": summarise(seeds), "train": train,
              "quota_ratios": quota_ratios(seeds)}
    out = results_dir(args, __file__)
    write(out, name, report, to_markdown(report), meta, headline(report))
    plot(report, out / f"{name}.png")
    print(to_markdown(report))


if __name__ == "__main__":
    main()
