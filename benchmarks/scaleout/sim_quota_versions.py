"""Versions per virtual hour under the Hub's commit quota: the issue's own setup, with ``hubgrpo simulate``.

    python benchmarks/scaleout/sim_quota_versions.py [--versions 300] [--seeds 0] [--name sim_quota_versions]
    python benchmarks/scaleout/sim_quota_versions.py --quick   # the script checked: 6 versions

Tiny model, the demo's recipe (ffa + rebase, quorum 1, 1-step rounds, staleness per worker 2), two workers,
4 virtual seconds per step (the setup a commit per version and per round made versions
100 → 300 take 3.0 virtual hours instead of 400 s under a budget of 128). Three runs per seed: free commits; the
Hub's quota of 128 per rolling virtual hour with rounds through the coordinator (``hub.submissions:
coordinator``: no commit per round); the quota with one commit per round in the run repo. Reported: virtual
seconds for all versions and for versions 100 → ``--versions``, the ratio to free commits, commits made, the most
in one rolling virtual hour, and commits the quota refused (429). Writes results/<name>.{md,json}.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.common import options, results_dir, sets, simulate, start, write  # noqa: E402

RECIPE = ["merge.method=ffa", "merge.rebase=true", "merge.quorum=1", "rounds.steps=1",
          "merge.staleness_per_worker=2"]
VARIANTS = {"free": ("off", []), "quota, rounds via the coordinator": ("128", ["hub.submissions=coordinator"]),
            "quota, a commit per round": ("128", [])}


def one(work: Path, seed: int, versions: int, label: str, since: int = 100) -> dict:
    quota, extra = VARIANTS[label]
    out = work / f"s{seed}-{label.split(',')[0]}-{len(extra)}-q{quota}"
    res = simulate(out, "configs/tiny.yaml", 2, seed, ["--step-s", "4", "--until-version", str(versions),
                                                      "--eval-every", "100000", "--eval-samples", "4",
                                                      *sets([*RECIPE, *extra])], quota=quota)
    t = {v["version"]: v["virtual_time_s"] for v in res["versions"]}
    return {"variant": label, "seed": seed, "versions": max(t), "virtual_s": t[max(t)],
            "from_100_s": t[max(t)] - t.get(since, 0.0), "quota": res["quota"], "rounds_via": res["rounds_via"],
            "real_wall_s": res.get("real_wall_s")}


def to_markdown(report: dict) -> str:
    start_v = report.get("from_version", 100)
    lines = ["# Versions under the Hub's commit quota — tiny, demo recipe, 2 workers", "",
             f"4 virtual s per step; versions {start_v} → {report['versions']}.", "",
             f"| seed | variant | virtual s, all | virtual s, {start_v} → end | × free | commits | peak / rolling hour | 429s |",
             "|---|---|---|---|---|---|---|---|"]
    for r in report["rows"]:
        free = next(x for x in report["rows"] if x["seed"] == r["seed"] and x["variant"] == "free")
        q = r["quota"]
        lines.append(f"| {r['seed']} | {r['variant']} | {r['virtual_s']:.0f} | {r['from_100_s']:.0f} | "
                     f"{r['from_100_s'] / free['from_100_s']:.2f} | {q['commits']} | {q['peak_commits_per_hour']} | "
                     f"{q['refused_429']} |")
    return "\n".join(lines) + "\n"


def headline(report: dict) -> str:
    """Each variant's time for the later versions as a multiple of free commits (mean over seeds)."""
    out = []
    for label in VARIANTS:
        xs = [r["from_100_s"] / next(x for x in report["rows"] if x["seed"] == r["seed"] and x["variant"] == "free")
              ["from_100_s"] for r in report["rows"] if r["variant"] == label]
        out.append(f"{label} {sum(xs) / len(xs):.2f}×")
    return (f"versions {report.get('from_version', 100)} → {report['versions']} under the Hub's quota, time "
            "against free commits: " + ", ".join(out[1:]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--versions", type=int, default=300)
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--name", default="sim_quota_versions")
    options(ap, __file__)
    args = ap.parse_args()
    since = 100
    if args.quick:  # a check of the script: versions 3 → 6
        args.versions, args.seeds, since = 6, "0", 3
    meta = start(args.quick)
    work = args.work or Path(tempfile.mkdtemp(prefix="hubgrpo-quota-"))
    rows = [one(work, int(s), args.versions, label, since) for s in args.seeds.split(",") for label in VARIANTS]
    report = {"rows": rows, "versions": args.versions, "from_version": since, "work": str(work)}
    md = to_markdown(report)
    write(results_dir(args, __file__), args.name, report, md, meta, headline(report))
    print(md)


if __name__ == "__main__":
    main()
