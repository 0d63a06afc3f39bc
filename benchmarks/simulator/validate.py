"""The simulator against reality: replays each real ``hubgrpo run --workers 2`` of ``speedup_real.py`` results in
``hubgrpo simulate`` — the run's own config
(its ``--set`` and ``--run-set``), its measured median seconds per step and per-round overhead, and the timing of
its two machines (``replay_timing``: each one's speed from its mean seconds between deliveries, its phase, and
the jitter that gives the round-to-round change of the gap between their deliveries) — and
compares the staleness histograms, the time to the training-reward target, seconds per version and the reward
curves; over seeds, whether the simulated mean lies within the real runs' standard deviation ("within seed
noise"). ``--timing median`` replays as before this timing existed: both machines at one speed, started together,
jitter 0.1.

    python benchmarks/simulator/validate.py benchmarks/speedup/results/speedup-real-decay-s01.json … \
        [--timing replay|median] [--name NAME] [--work DIR]
    python benchmarks/simulator/validate.py --quick REAL.json   # the script checked: 4 versions of each seed

Writes results/<name>.{md,json,png}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.common import options, results_dir, sets, simulate, start, write  # noqa: E402


def fmt(x, spec=".2f"):
    return "–" if x is None else format(x, spec)


def validate(real_paths: list[Path], work: Path, timing: str = "replay", versions: int | None = None) -> dict:
    """Replay each seed of real ``hubgrpo run --workers 2`` runs (speedup_real.py JSONs) in the simulator (its
    first ``versions`` only, when given)."""
    out = []
    for real_path in real_paths:
        real = json.loads(real_path.read_text())
        for raw in real["raw"]:
            folder = f"validate-{real_path.stem}-s{raw['run']['seed']}" + ("" if timing == "replay" else f"-{timing}")
            run = {**raw["run"], "curve": raw["run"]["curve"][:versions]} if versions else raw["run"]
            out.append(_validate_seed(real, run, work / folder, timing))
    return {"timing": timing, "seeds": out, "summary": _validation_summary(out)}


class ReplayError(SystemExit):
    """A real run whose timing cannot be replayed (the benchmark stops with this message)."""


def replay_timing(rounds: list[dict]) -> dict:
    """The fleet's timing as the real run had it, from its delivered rounds (``at``: when each submit returned):
    ``speeds`` (mean seconds between a machine's deliveries, from its second on, relative to the machines' mean:
    the first round also loads the model), ``starts`` (each machine's phase: when it delivered its second
    round, from the earlier of the two — real machines never start in the same instant, and the first rounds
    and merges, slower than the rest, set how far apart they run) and ``jitter`` (``hubgrpo simulate
    --jitter``: a uniform factor in [1 − J, 1 + J] on each round gives the gap between two machines' k-th
    deliveries a change of standard deviation D·J·√(2/3) per round, D the mean period; J is solved from the real
    gaps' changes, so noise that slows both machines at once — this machine's load — is left out, as it moves no
    phase).

    Two approximations, both small on the demo's rounds: the simulator puts the jitter on a round's training time
    only, which is ~96 % of the period D, so J is ~4–7 % lower than the exact solution; and the offsets of the
    second deliveries are given to the first leases, so the simulated machines' second deliveries are apart by
    the offset plus twice the difference of their periods (±0.1–0.3 s on the demo's runs)."""
    by: dict[str, list[float]] = {}
    for r in rounds:
        by.setdefault(r["worker"], []).append(r["at"])
    times = [sorted(ts) for _, ts in sorted(by.items())]
    if len(times) != 2 or min(len(ts) for ts in times) < 4:
        raise ReplayError(f"the real run has {len(times)} worker names ({', '.join(sorted(by))}); a replay needs "
                          "exactly two machines with at least 4 delivered rounds each (a worker that restarted "
                          "under a new name cannot be replayed: use --validate-timing median)")
    periods = [(ts[-1] - ts[1]) / (len(ts) - 2) for ts in times]
    mean = statistics.mean(periods)
    second = min(ts[1] for ts in times)
    first, other = times
    gaps = [other[k] - first[k] for k in range(1, min(len(first), len(other)))]  # from the second delivery on
    changes = [b - a for a, b in zip(gaps, gaps[1:])]
    jitter = statistics.stdev(changes) * (3 / 2) ** 0.5 / mean
    return {"speeds": [mean / p for p in periods], "starts": [ts[1] - second for ts in times],
            "jitter": min(0.9, jitter), "period_s": periods}


def _timing_flags(timing: str, rounds: list[dict]) -> tuple[list[str], dict | None]:
    if timing == "median":
        return [], None
    t = replay_timing(rounds)
    return ["--speeds", ",".join(f"{x:.5f}" for x in t["speeds"]), "--starts",
            ",".join(f"{x:.3f}" for x in t["starts"]), "--jitter", f"{t['jitter']:.4f}"], t


def _validate_seed(real: dict, run: dict, out: Path, timing: str = "replay") -> dict:
    from hubgrpo.config import load_config

    # the run's own config; one torch thread, as each of the run's two workers had on the 2 cores
    settings = [*real["args"]["set"], *real["args"].get("run_set", []), "worker.threads=1"]
    steps = load_config(ROOT / real["args"]["config"], overrides=settings).rounds.steps
    rounds = [r for r in run["rounds"] if "train_s" in r]
    step_s = statistics.median(r["train_s"] for r in rounds) / steps
    overhead = statistics.median(r.get("lease_s", 0) + r.get("download_s", 0) + r.get("upload_s", 0)
                                 + r.get("submit_s", 0) for r in rounds)
    versions = len(run["curve"])
    flags, replay = _timing_flags(timing, rounds)
    sim = simulate(out, real["args"]["config"], 2, run["seed"],
                   [*sets(settings), *_eval_flags(real), "--step-s", f"{step_s:.4f}",
                    "--latency-s", f"{overhead / 4:.4f}", "--until-version", str(versions), *flags])
    real_hist = dict(Counter(str(s) for c in run["curve"] for s in c["staleness"]))
    target = real["args"].get("target", 0.9)
    real_hit = next((c["t"] for c in run["curve"] if c["reward"] is not None and c["reward"] >= target), None)
    sim_hit = next((v["virtual_time_s"] for v in sim["versions"][1:]
                    if v["train_reward"] is not None and v["train_reward"] >= target), None)
    return {"seed": run["seed"], "source": real["args"].get("name"), "settings": settings, "step_s": step_s,
            "latency_s": overhead / 4, "versions": versions, "replay": replay, "target": target,
            "real_staleness": real_hist, "sim_staleness": sim["staleness_histogram"],
            "real_s_to_target": real_hit, "sim_s_to_target": sim_hit,
            "real_curve": [(c["t"], c.get("eval"), c["reward"]) for c in run["curve"]],
            "sim_curve": [(v["virtual_time_s"], v["eval_reward"], v["train_reward"]) for v in sim["versions"][1:]],
            "real_wall_s": run["curve"][-1]["t"] if run["curve"] else None,
            "sim_virtual_s": sim["virtual_wall_s"]}


def _validation_summary(rows: list[dict]) -> dict:
    """Mean ± sd over seeds of the real and the simulated time to the training-reward target and of the share of
    fresh (τ = 0) rounds: "within seed noise" when the means differ by at most the real runs' sd."""
    def stats(xs):
        xs = [x for x in xs if x is not None]
        return {"mean": statistics.mean(xs) if xs else None, "sd": statistics.stdev(xs) if len(xs) > 1 else None,
                "n": len(xs)}

    def fresh(hist):
        total = sum(hist.values())
        return hist.get("0", 0) / total if total else None

    out = {}
    for key, real, sim in (("s_to_target", [r["real_s_to_target"] for r in rows], [r["sim_s_to_target"] for r in rows]),
                           ("fresh_share", [fresh(r["real_staleness"]) for r in rows],
                            [fresh(r["sim_staleness"]) for r in rows]),
                           ("s_per_version", [r["real_wall_s"] / r["versions"] for r in rows if r["real_wall_s"]],
                            [r["sim_virtual_s"] / r["versions"] for r in rows])):
        rs, ss = stats(real), stats(sim)
        within = (None if rs["mean"] is None or ss["mean"] is None or rs["sd"] is None
                  else abs(rs["mean"] - ss["mean"]) <= rs["sd"])
        out[key] = {"real": rs, "sim": ss, "within_seed_noise": within}
    return out


def _eval_flags(real: dict) -> list[str]:
    a = real["args"]
    return ["--eval-samples", str(a.get("eval", 16)), "--eval-sampled", str(a.get("eval_sampled", 0))]


def validation_markdown(v: dict) -> str:
    timing = {"replay": "each machine's speed, phase and the jitter of the gap between the two replayed "
              "from the real run (speeds / starts s / jitter in the last column)",
              "median": "both machines at the run's median seconds per step, started together, jitter 0.1"}
    lines = ["# Simulator vs real `hubgrpo run --workers 2` runs", "",
             f"Timing: {timing[v.get('timing', 'median')]}.", "",
             "| source | seed | s/step (real, median) | versions | staleness real | staleness simulated | real s to "
             "target | simulated s to target | real s to last version | simulated s | held-out real (last) | "
             "held-out simulated (last) | replayed timing |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in v["seeds"]:
        lines.append(f"| {s.get('source')} | {s['seed']} | {s['step_s']:.3f} | {s['versions']} | {s['real_staleness']} | "
                     f"{s['sim_staleness']} | {fmt(s.get('real_s_to_target'), '.1f')} | "
                     f"{fmt(s.get('sim_s_to_target'), '.1f')} | {fmt(s['real_wall_s'], '.1f')} | "
                     f"{fmt(s['sim_virtual_s'], '.1f')} | {fmt(s['real_curve'][-1][1], '.3f')} | "
                     f"{fmt(s['sim_curve'][-1][1], '.3f')} | {_timing_cell(s.get('replay'))} |")
    summary = v.get("summary") or {}
    if summary:
        lines += ["", "| over seeds | real mean ± sd | simulated mean ± sd | within the real runs' sd |", "|---|---|---|---|"]
        for key, row in summary.items():
            r, s = row["real"], row["sim"]
            lines.append(f"| {key} | {fmt(r['mean'])} ± {fmt(r['sd'])} (n = {r['n']}) | {fmt(s['mean'])} ± "
                         f"{fmt(s['sd'])} (n = {s['n']}) | {row['within_seed_noise']} |")
    return "\n".join(lines) + "\n"


def _timing_cell(t: dict | None) -> str:
    if not t:
        return "–"
    return (" / ".join(f"{x:.3f}" for x in t["speeds"]) + "; " + " / ".join(f"{x:.1f}" for x in t["starts"])
            + f"; {t['jitter']:.3f}")


def validation_plot(v: dict, path: Path) -> None:
    """Training reward and held-out reward vs seconds, each real run (solid) and its simulation (dashed); the
    staleness of merged rounds, real against simulated, over all seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for i, s in enumerate(v["seeds"]):
        color = f"C{i}"
        for ax, k in ((axes[0], 2), (axes[1], 1)):
            for curve, style, who in ((s["real_curve"], "-", "real"), (s["sim_curve"], "--", "simulated")):
                pts = [(c[0], c[k]) for c in curve if c[k] is not None]
                if pts:
                    ax.plot(*zip(*pts), style, color=color, marker=".", label=f"{who} {s.get('source')} s{s['seed']}")
    axes[0].set_ylabel("training reward of a version's rounds")
    axes[1].set_ylabel("held-out reward")
    for ax in axes[:2]:
        ax.set_xlabel("seconds from the first lease (real) / virtual seconds")
    axes[1].legend(fontsize=6)
    _staleness_bars(axes[2], v["seeds"])
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _staleness_bars(ax, seeds: list[dict]) -> None:
    real, sim = Counter(), Counter()
    for s in seeds:
        real.update({int(k): n for k, n in s["real_staleness"].items()})
        sim.update({int(k): n for k, n in s["sim_staleness"].items()})
    taus = sorted(set(real) | set(sim))
    for offset, counts, who in ((-0.2, real, "real"), (0.2, sim, "simulated")):
        total = sum(counts.values()) or 1
        ax.bar([t + offset for t in taus], [counts[t] / total for t in taus], width=0.4, label=who)
    ax.set_xticks(taus)
    ax.set_xlabel("staleness τ of a merged round (all seeds)")
    ax.set_ylabel("share of merged rounds")
    ax.set_yscale("log")
    ax.legend(fontsize=7)


def headline(v: dict) -> str:
    """Real against simulated over seeds: time to the training target and the fresh (τ = 0) share."""
    sm = v["summary"]

    def pair(key, spec):
        r, s = sm[key]["real"], sm[key]["sim"]
        sd = (lambda x: f" ± {x['sd']:{spec}}" if x["sd"] is not None else "")
        return f"{fmt(r['mean'], spec)}{sd(r)} real against {fmt(s['mean'], spec)}{sd(s)} simulated"
    within = {k: {True: "within", False: "outside", None: "?"}[sm[k]["within_seed_noise"]] for k in sm}
    return (f"{len(v['seeds'])} real N = 2 runs replayed: s to target {pair('s_to_target', '.1f')} "
            f"({within['s_to_target']} the real sd); fresh share {pair('fresh_share', '.2f')} "
            f"({within['fresh_share']})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("real", nargs="+", type=Path, help="speedup_real.py result JSONs (every seed of each)")
    ap.add_argument("--timing", choices=["replay", "median"], default="replay",
                    help="replay: each machine's own speed, phase and the real gaps' jitter; median: one "
                    "speed for both, started together, jitter 0.1")
    ap.add_argument("--work", type=Path, default=None, help="simulation folders (kept: a rerun reuses them)")
    ap.add_argument("--name", default="validate")
    options(ap, __file__)
    args = ap.parse_args()
    meta = start(args.quick)
    work = args.work or Path(tempfile.mkdtemp(prefix="hubgrpo-validate-"))
    v = validate(args.real, work, args.timing, versions=6 if args.quick else None)
    v["sources"] = [str(p) for p in args.real]
    out = results_dir(args, __file__)
    write(out, args.name, v, validation_markdown(v), meta, headline(v))
    validation_plot(v, out / f"{args.name}.png")
    print(validation_markdown(v))


if __name__ == "__main__":
    main()
