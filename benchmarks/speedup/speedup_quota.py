"""Real N = 2 under the Hub's commit quota against the same run with free commits, seed by seed.

For each seed it runs ``speedup_real.py`` twice, back to back so that the machine's state is alike for
both: the run repo on the Hub emulator with the quota on (``--hub-quota``), then on a local folder (commits free).
Both arms share the same ``hubgrpo train`` reference (``--train-from``), so the figure that matters, the ratio of the
two speed-ups, is the ratio of the two runs' times to the training target::

    python benchmarks/speedup/speedup_quota.py --seeds 0,1,2 --versions 300 --eval 0 \\
        --train-from benchmarks/speedup/results/speedup-real-quota-s0-quota.json …-s1-quota.json …-s2-quota.json
    python benchmarks/speedup/speedup_quota.py --quick   # the script checked: one tiny seed, both arms

Writes ``results/<name>-s<seed>-{quota,free}.{json,md}`` (one per arm and seed) and ``results/<name>.{json,md}``;
an arm whose result is there already (same ``--versions``) is kept, so a stopped series resumes.
``--report-only`` rewrites the summary from the per-seed files.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.common import options, results_dir, start, write  # noqa: E402

REAL = Path(__file__).resolve().parent / "speedup_real.py"


def run_arm(args, seed: int, arm: str) -> None:
    cmd = [sys.executable, str(REAL.relative_to(ROOT)), "--seeds", str(seed), "--versions", str(args.versions),
           "--name", f"{args.name}-s{seed}-{arm}", "--results", str(args.out)]
    cmd += [a for f in args.train_from for a in ("--train-from", str(f))]
    cmd += ["--eval", str(args.eval)]
    if args.quick:
        cmd += ["--quick"]
    if arm == "quota":
        cmd += ["--hub-quota", str(args.quota)]
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True)


def row(out: Path, name: str, seed: int, arm: str) -> dict | None:
    path = out / f"{name}-s{seed}-{arm}.json"
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    return {**data["rows"][0], "commit": data["meta"]["commit"], "date": data["meta"]["date"],
            "wall_s": data["raw"][0]["run"]["wall_s"], "versions": data["args"]["versions"]}


def ratio(q: dict | None, f: dict | None) -> float | None:
    if not q or not f or not q.get("speedup_train_reward") or not f.get("speedup_train_reward"):
        return None
    return q["speedup_train_reward"] / f["speedup_train_reward"]


def report(args, seeds: list[int]) -> tuple[str, dict]:
    """The markdown and the data: per seed both arms' times and speed-ups, their ratio; the means."""
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
    data = {"args": {k: v for k, v in vars(args).items() if k != "out"}, "seeds": []}
    for seed in seeds:
        q, f = row(args.out, args.name, seed, "quota"), row(args.out, args.name, seed, "free")
        r = ratio(q, f)
        data["seeds"].append({"seed": seed, "quota": q, "free": f, "ratio": r})
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
                  f"**{mean_f / mean_q:.2f}**."]
        data.update(ratio_mean=statistics.mean(ratios), ratio_of_mean_times=mean_f / mean_q)
    return "\n".join(lines) + "\n", data


def headline(data: dict) -> str:
    """Both arms' speed-ups against one process, mean over seeds, and their ratio."""
    def mean(arm):
        xs = [s[arm]["speedup_train_reward"] for s in data["seeds"] if s[arm] and s[arm].get("speedup_train_reward")]
        return f"{statistics.mean(xs):.2f}×" if xs else "–"
    return (f"N = 2 against one process, {len(data['seeds'])} seed(s): {mean('quota')} under the Hub's quota, "
            f"{mean('free')} with free commits (local folder); ratio of mean times "
            + (f"{data['ratio_of_mean_times']:.2f}" if data.get("ratio_of_mean_times") else "–"))


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
    options(ap, __file__)
    args = ap.parse_args()
    if args.quick:  # one seed of speedup_real.py --quick in each arm
        args.seeds, args.versions, args.eval = "0", 12, 0
    meta = start(args.quick)
    args.out = results_dir(args, __file__)
    seeds = [int(s) for s in args.seeds.split(",")]
    if not args.report_only:
        for seed in seeds:
            for arm in ("quota", "free"):
                done = row(args.out, args.name, seed, arm)
                if done and done["versions"] == args.versions:
                    print(f"seed {seed} {arm}: kept from {done['date']} ({done['commit']})", flush=True)
                    continue
                run_arm(args, seed, arm)
                write(args.out, args.name, *reversed(report(args, seeds)), meta)  # the series so far
    text, data = report(args, seeds)
    write(args.out, args.name, data, text, meta, headline(data))
    print(text)


if __name__ == "__main__":
    main()
