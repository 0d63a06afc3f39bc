"""Real N = 2 under the Hub's commit quota against the same run with free commits, seed by seed.

For each seed it runs ``benchmarks/speedup_real.py`` twice, back to back so that the machine's state is alike for
both: the run repo on the Hub emulator with the quota on (``--hub-quota``), then on a local folder (commits free).
Both arms share the same ``hubgrpo train`` reference (``--train-from``), so the figure that matters, the ratio of the
two speed-ups, is the ratio of the two runs' times to the training target::

    python benchmarks/speedup_quota.py --seeds 0,1,2 --versions 300 \\
        --train-from benchmarks/results/speedup-real-gcfreeze-s01.json \\
        --train-from benchmarks/results/speedup-real-gcfreeze-s2.json

Writes ``results/<name>-s<seed>-{quota,free}.{json,md}`` (one per arm and seed) and ``results/<name>.md``; an arm
whose result is there already (same ``--versions``) is kept, so a stopped series resumes. ``--report-only``
rewrites the summary from the per-seed files.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def run_arm(args, seed: int, arm: str) -> None:
    cmd = [sys.executable, "benchmarks/speedup_real.py", "--seeds", str(seed), "--versions", str(args.versions),
           "--name", f"{args.name}-s{seed}-{arm}"]
    cmd += [a for f in args.train_from for a in ("--train-from", str(f))]
    cmd += ["--eval", str(args.eval)]
    if arm == "quota":
        cmd += ["--hub-quota", str(args.quota)]
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True)


def row(name: str, seed: int, arm: str) -> dict | None:
    path = RESULTS / f"{name}-s{seed}-{arm}.json"
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    return {**data["rows"][0], "commit": data["meta"]["commit"], "date": data["meta"]["date"],
            "wall_s": data["raw"][0]["run"]["wall_s"], "versions": data["args"]["versions"]}


def ratio(q: dict | None, f: dict | None) -> float | None:
    if not q or not f or not q.get("speedup_train_reward") or not f.get("speedup_train_reward"):
        return None
    return q["speedup_train_reward"] / f["speedup_train_reward"]


def report(args, seeds: list[int]) -> str:
    lines = [f"# Real N = 2: the Hub's commit quota ({args.quota} per rolling hour) against free commits", "",
             f"Each seed: `benchmarks/speedup_real.py --versions {args.versions}` with `--hub-quota {args.quota}` "
             "(run repo on the Hub emulator), then without (a local folder), back to back; one `hubgrpo train` "
             "reference per seed for both arms. Ratio = quota speed-up / free speed-up = free run's seconds to the "
             "training target / quota run's. Target: ratio ≥ 0.9 (mean over seeds).", "",
             "| seed | quota: run s to target (version) | speed-up | free: run s to target (version) | speed-up | "
             "ratio | quota: commits in busiest hour | run wall s (quota / free) | commit (quota / free) |",
             "|---|---|---|---|---|---|---|---|---|"]
    ratios, fmt = [], (lambda x, s=".1f": "–" if x is None else format(x, s))
    times = {"quota": [], "free": []}
    for seed in seeds:
        q, f = row(args.name, seed, "quota"), row(args.name, seed, "free")
        r = ratio(q, f)
        if r is not None:
            ratios.append(r)
            times["quota"].append(q["run_s_to_target"])
            times["free"].append(f["run_s_to_target"])
        q, f = q or {}, f or {}
        lines.append(f"| {seed} | {fmt(q.get('run_s_to_target'))} ({q.get('run_version_at_target')}) | "
                     f"{fmt(q.get('speedup_train_reward'), '.2f')}× | {fmt(f.get('run_s_to_target'))} "
                     f"({f.get('run_version_at_target')}) | {fmt(f.get('speedup_train_reward'), '.2f')}× | "
                     f"{fmt(r, '.2f')} | {q.get('hub_peak_commits_per_hour', '–')} | "
                     f"{fmt(q.get('wall_s'), '.0f')} / {fmt(f.get('wall_s'), '.0f')} | "
                     f"{q.get('commit', '–')} / {f.get('commit', '–')} |")
    if ratios:
        spread = f", min {min(ratios):.2f}, max {max(ratios):.2f}"
        sd = f", sd {statistics.stdev(ratios):.2f}" if len(ratios) > 1 else ""
        mean_q, mean_f = statistics.mean(times["quota"]), statistics.mean(times["free"])
        lines += ["", f"Mean ratio over {len(ratios)} seed(s): **{statistics.mean(ratios):.2f}**{sd}{spread}. "
                  f"Ratio of the mean times to target (free {mean_f:.1f} s / quota {mean_q:.1f} s): "
                  f"**{mean_f / mean_q:.2f}**. Written {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}."]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--versions", type=int, default=300)
    ap.add_argument("--quota", type=int, default=128)
    ap.add_argument("--train-from", type=Path, action="append", default=[])
    ap.add_argument("--name", default="speedup-real-quota")
    ap.add_argument("--eval", type=int, default=16, help="held-out prompts to score each version on (0: none; "
                    "the quota's effect is measured on the training target)")
    ap.add_argument("--report-only", action="store_true")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    if not args.report_only:
        for seed in seeds:
            for arm in ("quota", "free"):
                done = row(args.name, seed, arm)
                if done and done["versions"] == args.versions:
                    print(f"seed {seed} {arm}: kept from {done['date']} ({done['commit']})", flush=True)
                    continue
                run_arm(args, seed, arm)
                (RESULTS / f"{args.name}.md").write_text(report(args, seeds))
    text = report(args, seeds)
    (RESULTS / f"{args.name}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
