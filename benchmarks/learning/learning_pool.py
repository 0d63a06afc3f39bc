"""Pool several ``learning.py`` results of one mode into one table over all their training seeds.

    python benchmarks/learning/learning_pool.py A.json B.json … --name learning-b4-tiny-pooled

The tiny model's gain varies by 2-3x between seeds, so 3 seeds leave a ratio uncertain by ±20 %; runs of
``learning.py`` on other seeds (or other variants on the same seeds) add up here. Each (variant, seed) is
taken once, from the first file that has it. The runs are deterministic for a seed on one installation, so a
seed's baseline must have the same held-out gain in every file that has it (the files then share their
version-0 adapters and their evaluation); the script stops if not. An input may be an earlier pooled result (its
gains per variant and seed), so a kept pool grows without its input files. Ratio = a variant's mean gain over its
seeds ÷ the baseline's mean gain over the same seeds; its ± is the first-order standard error of that ratio.
Writes results/NAME.{md,json}. Seconds: its test pools the output of ``learning.py --quick``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.common import options, results_dir, start, write  # noqa: E402


def pool(reports: list[dict]) -> dict[tuple[str, int], float]:
    """(variant, seed) → held-out gain, first file wins; a seed's baseline must agree across files."""
    gains: dict[tuple[str, int], float] = {}
    for report in reports:
        if report["mode"] != reports[0]["mode"]:
            sys.exit(f"cannot pool {report['mode']} mode with {reports[0]['mode']} mode")
        for r in report.get("results") or report["gains"]:  # a learning.py result, or a pooled one
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
    lines = [f"# Learning at equal samples, pooled — {mode} mode",
             "", "From: " + ", ".join(f"`{f}`" for f in files) + ".", "",
             "| variant | seeds | gain (mean ± sd over seeds) | gain vs baseline (± s.e.) |", "|---|---|---|---|"]
    for r in rows:
        ratio = "-" if r["ratio"] is None else f"{100 * r['ratio']:.0f} %" + (
            f" ± {100 * r['ratio_se']:.0f}" if r["ratio_se"] is not None else "")
        lines.append(f"| {r['name']} | {len(r['seeds'])} ({','.join(map(str, r['seeds']))}) | {r['gain']:+.4f} ± "
                     f"{r['gain_std']:.4f} | {ratio} |")
    return "\n".join(lines) + "\n"


def headline(mode: str, rows: list[dict]) -> str:
    """Each fleet variant's gain as a share of the baseline's (the single-process references left out)."""
    fleet = [r for r in rows if not r["name"].startswith(("baseline", "single", "sync")) and r["ratio"] is not None]
    return f"{'tiny' if mode == 'quick' else 'SmolLM2'}, pooled: " + ", ".join(
        f"{r['name']} {100 * r['ratio']:.0f} %" + (f" ± {100 * r['ratio_se']:.0f}" if r["ratio_se"] else "")
        + f" ({len(r['seeds'])} seeds)" for r in fleet) + " of one process's gain at equal samples"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+", help="learning.py result JSONs of one mode (or pooled ones)")
    ap.add_argument("--name", required=True, help="results file stem")
    options(ap, __file__)
    args = ap.parse_args()
    meta = start(args.quick)
    reports = [json.loads(Path(f).read_text()) for f in args.files]
    gains = pool(reports)
    rows = summarise(gains)
    files = [Path(f).name for f in args.files]
    md = to_markdown(args.name, files, reports[0]["mode"], rows)
    data = {"mode": reports[0]["mode"], "files": files, "summary": rows,
            "gains": [{"name": n, "seed": s, "gain": g} for (n, s), g in gains.items()]}
    write(results_dir(args, __file__), args.name, data, md, meta, headline(reports[0]["mode"], rows))
    print(md)


if __name__ == "__main__":
    main()
