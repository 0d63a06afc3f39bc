"""One report over several ``scaleout.py --commit-quota`` results (e.g. one per seed and N): their rows, the summary
and the speed-up ratios (free commits / the Hub's quota) over all seeds.

    python benchmarks/scaleout/sim_quota.py --runs A.json B.json … --name scaleout-smollm2-quota

Seconds: it reads result files only (its test combines the output of ``scaleout.py --quick``). Writes
results/<name>.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.common import options, results_dir, start, write  # noqa: E402
from benchmarks.scaleout.scaleout import headline, quota_ratios, summarise, to_markdown  # noqa: E402


def combine(paths: list, name: str) -> dict:
    """The combined report: rows of the same seed from several runs (N = 4, N = 8) together, N = 1 once."""
    runs = [json.loads(Path(p).read_text()) for p in paths]
    seeds = {}
    for run in runs:
        for s in run["seeds"]:
            mine = seeds.setdefault(s["seed"], {**s, "rows": []})
            have = {(r["fleet"], r["workers"], r.get("quota", "off")) for r in mine["rows"]}
            mine["rows"] += [r for r in s["rows"] if (r["fleet"], r["workers"], r.get("quota", "off")) not in have]
    first = {k: v for k, v in runs[0].items() if k not in ("meta", "headline")}
    report = {**first, "name": name, "seeds": [seeds[k] for k in sorted(seeds)],
              "combined_from": [str(p) for p in paths],
              "commits": sorted({(r.get("meta") or {}).get("commit") or r.get("commit", "?") for r in runs})}
    report["args"] = {**first["args"], "seeds": ",".join(str(k) for k in sorted(seeds)), "reference_from": ", ".join(
        sorted({str(r["args"]["reference_from"]) for r in runs if r["args"].get("reference_from")})) or None}
    report["summary"], report["quota_ratios"] = summarise(report["seeds"]), quota_ratios(report["seeds"])
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", nargs="+", required=True)
    ap.add_argument("--name", required=True)
    options(ap, __file__)
    a = ap.parse_args()
    meta = start(a.quick)
    report = combine(a.runs, a.name)
    md = to_markdown(report) + "\nMeasured at commits " + ", ".join(report["commits"]) + " (the combined runs).\n"
    write(results_dir(a, __file__), a.name, report, md, meta, headline(report))
    print(md)


if __name__ == "__main__":
    main()
