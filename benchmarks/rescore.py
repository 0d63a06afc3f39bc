"""Re-score earlier ``scaleout.py`` runs against another N = 1 reference of the same seed, from their recorded
held-out curves (no simulation is run again).

    .venv/bin/python benchmarks/rescore.py --reference results/scaleout-…-ref1-s{0,1,2}.json \
        --runs results/scaleout-…-n4-s0.json … --name rescore-ref1

Exact when a run was stopped at its own target (``--stop-at-target``) and the new target is not higher: a run's
versions up to its stop do not depend on the target, so its first version at or above the new target is found
in its curve. Where the new target is higher than every score a run recorded, the row says "not reached before
it stopped" (run it again with ``scaleout.py --reference-from``). Writes benchmarks/results/<name>.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def references(paths: list[Path]) -> dict[int, dict]:
    """seed -> {target, t1, source} of each N = 1 reference."""
    out = {}
    for p in paths:
        for s in json.loads(p.read_text())["seeds"]:
            out[s["seed"]] = {"target": s["target"], "t1": s["t1"], "source": p.name}
    return out


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
                         "speedup": hit and ref["t1"] / hit[0], "exact": ref["target"] <= s["target"] or bool(hit)})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reference", type=Path, nargs="+", required=True)
    ap.add_argument("--runs", type=Path, nargs="+", required=True)
    ap.add_argument("--name", default="rescore")
    args = ap.parse_args()
    refs = references(args.reference)
    rows = [r for p in args.runs for r in rescore(p, refs)]
    lines = [f"# Re-scored against {', '.join(sorted({v['source'] for v in refs.values()}))} "
             f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})", "",
             "| run | seed | N | old target → new | old speed-up | virtual s to the new target | speed-up | samples |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        sp = f"{r['speedup']:.2f}×" if r["speedup"] else "not reached before it stopped"
        old = f"{r['old_speedup']:.2f}×" if r["old_speedup"] else "–"
        lines.append(f"| {r['run']} | {r['seed']} | {r['workers']} | {r['old_target']:.3f} → {r['target']:.3f} | "
                     f"{old} | {r['time_to_target_s'] and round(r['time_to_target_s'], 1)} | {sp} | "
                     f"{r['samples_to_target']} |")
    for n in sorted({r["workers"] for r in rows}):
        sp = [r["speedup"] for r in rows if r["workers"] == n and r["speedup"]]
        if sp:
            sd = f" ± {statistics.stdev(sp):.2f}" if len(sp) > 1 else ""
            lines.append(f"\nN = {n}: {statistics.mean(sp):.2f}×{sd} over {len(sp)} runs re-scored here.")
    (RESULTS / f"{args.name}.json").write_text(json.dumps({"references": refs, "rows": rows}, indent=1))
    (RESULTS / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
