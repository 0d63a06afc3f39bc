"""Pool the seeds of several ``scaleout.py`` results of one mode, rule and ``--set`` into one result: each seed's
rows from every file (a row measured twice, such as a shared N = 1 reference, counted once), the summary over
them, and the samples to target of each N against N = 1's (the mean of the per-seed ratios, and the ratio of the
means).

    python benchmarks/scaleout/pool.py RESULT.json [RESULT.json …] --name scaleout-mixed-fleet15
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
from benchmarks.scaleout.scaleout import headline, plot, quota_ratios, summarise, to_markdown  # noqa: E402

SAME = ("mode", "rule", "set", "single_set", "stop_at_target", "quotas")


def pool(reports: list[dict]) -> list[dict]:
    """The seeds of ``reports``, each with the rows of every report that ran it (first one kept per row)."""
    first = reports[0]["args"]
    for r in reports[1:]:
        differ = [k for k in SAME if r["args"].get(k) != first.get(k)]
        if differ:
            raise SystemExit(f"{r['name']} differs from {reports[0]['name']} in {', '.join(differ)}: pool results "
                             "of one mode, rule and --set only")
    seeds: dict[int, dict] = {}
    for r in reports:
        for s in r["seeds"]:
            into = seeds.setdefault(s["seed"], {**s, "rows": []})
            have = {(x["fleet"], x["workers"], str(x.get("quota"))) for x in into["rows"]}
            into["rows"] += [x for x in s["rows"] if (x["fleet"], x["workers"], str(x.get("quota"))) not in have]
    return [seeds[k] for k in sorted(seeds)]


def samples(seeds: list[dict]) -> list[dict]:
    """Per N > 1: samples to target against N = 1's, per seed, their mean, and the ratio of the means."""
    out = []
    for n in sorted({r["workers"] for s in seeds for r in s["rows"] if r["workers"] > 1}):
        pairs = []
        for s in seeds:
            one = next((r["samples_to_target"] for r in s["rows"] if r["workers"] == 1), None)
            many = next((r["samples_to_target"] for r in s["rows"] if r["workers"] == n), None)
            if one and many:
                pairs.append((s["seed"], many, one))
        if pairs:
            out.append({"workers": n, "per_seed": {str(k): m / o for k, m, o in pairs},
                        "mean_of_ratios": statistics.mean(m / o for _, m, o in pairs),
                        "ratio_of_means": statistics.mean(m for _, m, _ in pairs) / statistics.mean(o for *_, o in pairs)})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("inputs", nargs="+", type=Path, help="scaleout.py result JSONs")
    ap.add_argument("--name", required=True)
    options(ap, __file__)
    args = ap.parse_args()
    meta = start()
    reports = [json.loads(p.read_text()) for p in args.inputs]
    seeds = pool(reports)
    report = {"name": args.name, "args": {**reports[0]["args"], "seeds": ",".join(str(s["seed"]) for s in seeds),
                                          "pooled_from": [str(p) for p in args.inputs]},
              "config": reports[0]["config"], "seeds": seeds, "summary": summarise(seeds), "train": [],
              "quota_ratios": quota_ratios(seeds), "samples": samples(seeds),
              "sources": {r["name"]: r["meta"]["commit"] for r in reports}}
    lines = [to_markdown(report).rstrip("\n"), "", "Samples to target against N = 1's (per seed; mean of the ratios; "
             "ratio of the means):", ""]
    lines += [f"- N = {x['workers']}: " + ", ".join(f"s{k} {v:.2f}" for k, v in x["per_seed"].items())
              + f"; mean {x['mean_of_ratios']:.2f}, ratio of means {x['ratio_of_means']:.2f}" for x in report["samples"]]
    lines += ["", "Pooled from " + ", ".join(f"`{n}` ({c})" for n, c in report["sources"].items()) + "."]
    out = results_dir(args, __file__)
    write(out, args.name, report, "\n".join(lines), meta, headline(report))
    plot(report, out / f"{args.name}.png")


if __name__ == "__main__":
    main()
