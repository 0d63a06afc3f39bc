"""Re-score earlier ``scaleout.py`` runs against another N = 1 reference of the same seed, from their recorded
held-out curves (no simulation is run again).

    python benchmarks/scaleout/rescore.py --reference benchmarks/scaleout/results/scaleout-…-ref1-s{0,1,2}.json \
        --runs RUN.json … --name NAME

Exact when a run was stopped at its own target (``--stop-at-target``) and the new target is not higher: a run's
versions up to its stop do not depend on the target, so its first version at or above the new target is found
in its curve. Where the new target is higher than every score a run recorded, the row says "not reached before
it stopped" (run it again with ``scaleout.py --reference-from``).

Also the table over seeds per (fleet, N) — speed-up mean ± sd, parallel efficiency, samples to target, and the
held-out reward at equal virtual time: the N = 1 reference's score at the moment the fleet reached the target
(runs stopped at their target have no later score of their own, the reference ran its whole budget). The same
(seed, fleet, N) in several runs counts once: the first of ``--runs`` that reaches the target.
Seconds: it reads result files only (its test re-scores the output of ``scaleout.py --quick``). Writes
results/<name>.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.common import options, results_dir, start, write  # noqa: E402


def references(paths: list[Path]) -> dict[int, dict]:
    """seed -> {target, t1, source, samples, curve} of each N = 1 reference."""
    out = {}
    for p in paths:
        for s in json.loads(p.read_text())["seeds"]:
            single = next(r for r in s["rows"] if (r["fleet"], r["workers"]) == ("homog", 1))
            out[s["seed"]] = {"target": s["target"], "t1": s["t1"], "source": p.name,
                              "samples": single["samples_to_target"], "curve": single["curve"]}
    return out


def score_at(curve: list, t: float) -> float | None:
    """The newest held-out score at or before virtual time ``t`` of a recorded (time, samples, score) curve."""
    scores = [e for tt, _, e in curve if e is not None and tt <= t + 1e-9]
    return scores[-1] if scores else None


def rescore(path: Path, refs: dict[int, dict]) -> list[dict]:
    rows = []
    for s in json.loads(path.read_text())["seeds"]:
        ref = refs.get(s["seed"])
        if ref is None:
            sys.exit(f"{path}: no reference for seed {s['seed']}")
        for r in s["rows"]:
            if r["workers"] == 1:
                continue
            hit = next(((t, n) for t, n, e in r["curve"] if e is not None and e >= ref["target"]), None)
            rows.append({"run": path.name, "seed": s["seed"], "fleet": r["fleet"], "workers": r["workers"],
                         "old_target": s["target"], "old_speedup": r["speedup"], "target": ref["target"],
                         "t1": ref["t1"], "time_to_target_s": hit and hit[0], "samples_to_target": hit and hit[1],
                         "speedup": hit and ref["t1"] / hit[0], "exact": ref["target"] <= s["target"] or bool(hit),
                         "single_at_hit": hit and score_at(ref["curve"], hit[0])})
    return rows


def summary(rows: list[dict], refs: dict[int, dict]) -> list[dict]:
    """Per (fleet, N) over seeds, each (seed, fleet, N) once (the first run that reached the target)."""
    chosen: dict[tuple, dict] = {}
    for r in rows:
        key = (r["fleet"], r["workers"], r["seed"])
        if key not in chosen or (not chosen[key]["speedup"] and r["speedup"]):
            chosen[key] = r
    out = [{"fleet": "homog", "workers": 1, "seeds": sorted(refs), "speedup": [1.0] * len(refs),
            "samples": [refs[k]["samples"] for k in sorted(refs)],
            "single_at_hit": [score_at(refs[k]["curve"], refs[k]["t1"]) for k in sorted(refs)],
            "not_reached": []}]
    for fleet, n in sorted({k[:2] for k in chosen}, key=lambda k: (k[0] != "homog", k[1])):
        rs = [chosen[k] for k in sorted(chosen) if k[:2] == (fleet, n)]
        ok = [r for r in rs if r["speedup"]]
        out.append({"fleet": fleet, "workers": n, "seeds": [r["seed"] for r in ok],
                    "speedup": [r["speedup"] for r in ok], "samples": [r["samples_to_target"] for r in ok],
                    "single_at_hit": [r["single_at_hit"] for r in ok],
                    "not_reached": [r["seed"] for r in rs if not r["speedup"]]})
    return out


def summary_markdown(table: list[dict]) -> list[str]:
    def mean_sd(xs, spec=".2f"):
        xs = [x for x in xs if x is not None]
        if not xs:
            return "–"
        return format(statistics.mean(xs), spec) + (f" ± {statistics.stdev(xs):{spec}}" if len(xs) > 1 else "")

    lines = ["", "| fleet | N | seeds | speed-up (mean ± sd) | per seed | efficiency | samples to target | N = 1's "
             "held-out at the fleet's time to target (target = 90 % of its final) |",
             "|---|---|---|---|---|---|---|---|"]
    for t in table:
        per = " / ".join(f"{x:.2f}×" for x in t["speedup"]) + (
            f" (seed {', '.join(map(str, t['not_reached']))}: not reached)" if t["not_reached"] else "")
        eff = mean_sd([x / t["workers"] for x in t["speedup"]], ".0%") if t["speedup"] else "–"
        lines.append(f"| {t['fleet']} | {t['workers']} | {', '.join(map(str, t['seeds']))} | "
                     f"{mean_sd(t['speedup'])}× | {per} | {eff} | {mean_sd(t['samples'], '.0f')} | "
                     f"{mean_sd(t['single_at_hit'], '.3f')} |")
    return lines


def headline(table: list[dict]) -> str:
    """Mean speed-up per N over seeds, one fleet after the other."""
    seeds = max((len(t["seeds"]) for t in table), default=0)
    parts = []
    for fleet in sorted({t["fleet"] for t in table if t["workers"] > 1}, key=lambda f: f != "hetero"):
        parts.append(f"{fleet} " + ", ".join(
            f"N = {t['workers']} " + (f"{statistics.mean(t['speedup']):.2f}×" if t["speedup"] else "–")
            for t in table if t["fleet"] == fleet and t["workers"] > 1))
    return f"speed-up to target, mean of up to {seeds} seed(s): " + "; ".join(parts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reference", type=Path, nargs="+", required=True)
    ap.add_argument("--runs", type=Path, nargs="+", required=True)
    ap.add_argument("--name", default="rescore")
    options(ap, __file__)
    args = ap.parse_args()
    meta = start(args.quick)
    refs = references(args.reference)
    rows = [r for p in args.runs for r in rescore(p, refs)]
    lines = [f"# Re-scored against {', '.join(sorted({v['source'] for v in refs.values()}))}", "",
             "| run | seed | fleet | N | old target → new | old speed-up | virtual s to the new target | speed-up | "
             "samples |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        sp = f"{r['speedup']:.2f}×" if r["speedup"] else "not reached before it stopped"
        old = f"{r['old_speedup']:.2f}×" if r["old_speedup"] else "–"
        lines.append(f"| {r['run']} | {r['seed']} | {r['fleet']} | {r['workers']} | {r['old_target']:.3f} → "
                     f"{r['target']:.3f} | "
                     f"{old} | {r['time_to_target_s'] and round(r['time_to_target_s'], 1)} | {sp} | "
                     f"{r['samples_to_target']} |")
    table = summary(rows, refs)
    lines += summary_markdown(table)
    write(results_dir(args, __file__), args.name, {"references": refs, "rows": rows, "summary": table},
          "\n".join(lines), meta, headline(table))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
