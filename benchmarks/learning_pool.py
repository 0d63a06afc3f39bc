"""Pool several ``learning.py`` results of one mode into one table over all their training seeds.

    cd benchmarks/results && ../../.venv/bin/python ../learning_pool.py learning-b4-tiny.json \\
        learning-add-tiny.json learning-b4-tiny-s3-8.json --name learning-b4-tiny-pooled

The tiny model's gain varies by 2-3x between seeds, so 3 seeds leave a ratio uncertain by ±20 %; runs of
``learning.py`` on other seeds (or other variants on the same seeds) add up here. Each (variant, seed) is
taken once, from the first file that has it. The runs are deterministic for a seed on one installation, so a
seed's baseline must have the same held-out gain in every file that has it (the files then share their
version-0 adapters and their evaluation); the script stops if not. Ratio = a variant's mean gain over its seeds
÷ the baseline's mean gain over the same seeds; its ± is the first-order standard error of that ratio.
Writes benchmarks/results/NAME.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def pool(reports: list[dict]) -> dict[tuple[str, int], float]:
    """(variant, seed) → held-out gain, first file wins; a seed's baseline must agree across files."""
    gains: dict[tuple[str, int], float] = {}
    for report in reports:
        if report["mode"] != reports[0]["mode"]:
            sys.exit(f"cannot pool {report['mode']} mode with {reports[0]['mode']} mode")
        for r in report["results"]:
            key = (r["name"], int(r["seed"]))
            if key[0] == "baseline" and key in gains and abs(gains[key] - r["gain"]) > 1e-6:
                sys.exit(f"seed {key[1]}'s baseline gained {gains[key]:+.4f} in one file and {r['gain']:+.4f} in "
                         "another: these runs were not made on the same installation, so they cannot be pooled")
            gains.setdefault(key, r["gain"])
    return gains


def summarise(gains: dict[tuple[str, int], float]) -> list[dict]:
    """One row per variant: seeds, mean ± sd of its gains, ratio to the baseline's mean on the same seeds."""
    rows = []
    for name in dict.fromkeys(n for n, _ in gains):
        seeds = sorted(s for n, s in gains if n == name)
        x = [gains[(name, s)] for s in seeds]
        base = [gains[("baseline", s)] for s in seeds if ("baseline", s) in gains]
        row = {"name": name, "seeds": seeds, "gain": statistics.mean(x),
               "gain_std": statistics.stdev(x) if len(x) > 1 else 0.0, "ratio": None, "ratio_se": None}
        if name == "baseline":
            row["ratio"] = 1.0
        elif len(base) == len(x) and len(x) > 1 and statistics.mean(base) > 0:
            mx, mb = statistics.mean(x), statistics.mean(base)
            row["ratio"] = mx / mb
            row["ratio_se"] = abs(row["ratio"]) * math.sqrt(
                (statistics.stdev(x) / mx) ** 2 / len(x) + (statistics.stdev(base) / mb) ** 2 / len(base)) \
                if mx else None
        rows.append(row)
    return rows


def to_markdown(name: str, files: list[str], mode: str, rows: list[dict]) -> str:
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    lines = [f"# Learning at equal samples, pooled — {mode} mode ({when})",
             "", "From: " + ", ".join(f"`{f}`" for f in files) + ".", "",
             "| variant | seeds | gain (mean ± sd over seeds) | gain vs baseline (± s.e.) |", "|---|---|---|---|"]
    for r in rows:
        ratio = "-" if r["ratio"] is None else f"{100 * r['ratio']:.0f} %" + (
            f" ± {100 * r['ratio_se']:.0f}" if r["ratio_se"] is not None else "")
        lines.append(f"| {r['name']} | {len(r['seeds'])} ({','.join(map(str, r['seeds']))}) | {r['gain']:+.4f} ± "
                     f"{r['gain_std']:.4f} | {ratio} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+", help="learning.py result JSONs of one mode")
    ap.add_argument("--name", required=True, help="results file stem")
    ap.add_argument("--results", default=str(RESULTS))
    args = ap.parse_args()
    reports = [json.loads(Path(f).read_text()) for f in args.files]
    gains = pool(reports)
    rows = summarise(gains)
    files = [Path(f).name for f in args.files]
    out = Path(args.results)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.name}.json").write_text(json.dumps(
        {"mode": reports[0]["mode"], "files": files, "summary": rows,
         "gains": [{"name": n, "seed": s, "gain": g} for (n, s), g in gains.items()]}, indent=1))
    md = to_markdown(args.name, files, reports[0]["mode"], rows)
    (out / f"{args.name}.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
