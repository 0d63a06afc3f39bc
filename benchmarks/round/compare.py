"""Two settings of a worker against each other, in one run: seconds per step (the rounds of ``round.py``), and
what ``hubgrpo train`` learns with each (its reward curve, per seed).

    python benchmarks/round/compare.py --base worker.share_prompts=false --new worker.share_prompts=true
        [--config configs/demo.yaml] [--threads 1] [--rounds 6] [--repeats 2] [--train-steps 30] [--seeds 0,1,2]
        [--jobs 1] [--name sharing]
    python benchmarks/round/compare.py --quick   # the script checked: tiny model, one round, 3 train steps

**Speed.** Each arm runs in a fresh process (one thread by default): its engine, one warm-up round and
``--rounds`` timed rounds through ``RoundEngine.run_round`` (``round.py``'s measurement); s/step is the median
round's wall time over its steps. The arms alternate (base, new, then new, base, …) ``--repeats`` times, so a
change in the machine's load touches both. The change is the new arm's mean s/step against the base arm's,
measured in this run.

**Learning.** ``hubgrpo train CONFIG --steps T`` for each seed and arm (``--jobs 2``: two at a time, one thread
each; steps do not depend on the load): the per-step sampled training reward. A change that computes the same
numbers samples the same completions for a seed until float rounding flips a token: the report gives the steps
with equal rewards, and each arm's mean reward over the steps beside the spread of that mean between seeds (the
seed noise).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.common import TINY, options, results_dir, sets, start, write  # noqa: E402


def speed_part(args) -> dict:
    """One arm in this process: round.py's rounds with the arm's overrides."""
    import torch

    from benchmarks.round.round import measure_rounds

    torch.set_num_threads(args.threads)
    load = os.getloadavg()[0]
    res = measure_rounds(ROOT / args.config, args.threads, args.rounds, json.loads(args.part))
    return res | {"load_avg_1m": [load, os.getloadavg()[0]]}


def speed(args, arms: dict[str, list[str]]) -> list[dict]:
    rows = []
    for rep in range(args.repeats):
        for arm in list(arms)[:: 1 if rep % 2 == 0 else -1]:
            cmd = [sys.executable, __file__, "--part", json.dumps(arms[arm]), "--config", args.config, "--threads",
                   str(args.threads), "--rounds", str(args.rounds)]
            env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "PYTHONPATH": str(ROOT)}
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
            if proc.returncode:
                sys.exit(f"{arm} failed:\n{proc.stderr[-3000:]}")
            res = json.loads(proc.stdout.strip().splitlines()[-1])
            rows.append({"arm": arm, "repeat": rep} | res)
            print(f"{arm} (repeat {rep}): {res['s_per_step']:.2f} s/step", file=sys.stderr)
    return rows


def train_curve(args, overrides: list[str], seed: int) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "hubgrpo.cli", "train", args.config, "--steps", str(args.train_steps),
               "--output", tmp, "--eval-samples", "0",
               *sets([*overrides, "worker.threads=1", f"params.seed={seed}", "worker.device=cpu"])]
        subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
        metrics = json.loads((Path(tmp) / "metrics.json").read_text())
    return [s["reward"] for s in metrics["step_metrics"]]


def learning(args, arms: dict[str, list[str]]) -> dict:
    jobs = [(arm, seed) for seed in args.seeds for arm in arms]
    with ThreadPoolExecutor(args.jobs) as pool:
        curves = list(pool.map(lambda job: train_curve(args, arms[job[0]], job[1]), jobs))
    out: dict = {arm: {} for arm in arms}
    for (arm, seed), curve in zip(jobs, curves):
        out[arm][str(seed)] = curve
    return out


def summary(arms: dict, rows: list[dict], curves: dict) -> dict:
    base, new = list(arms)
    per = {arm: [r["s_per_step"] for r in rows if r["arm"] == arm] for arm in arms}
    out = {arm: {"s_per_step_mean": statistics.mean(xs), "s_per_step": xs} for arm, xs in per.items()}
    out["change"] = out[new]["s_per_step_mean"] / out[base]["s_per_step_mean"] - 1
    if curves:
        means = {arm: [statistics.mean(c) for c in curves[arm].values()] for arm in arms}
        equal = [sum(a == b for a, b in zip(curves[base][s], curves[new][s])) for s in curves[base]]
        out["learning"] = {
            "mean_reward": {arm: statistics.mean(m) for arm, m in means.items()},
            "seed_sd_of_mean": {arm: statistics.stdev(m) if len(m) > 1 else None for arm, m in means.items()},
            "per_seed_mean": means, "equal_steps": equal, "steps": len(next(iter(curves[base].values()))),
        }
    return out


def to_markdown(args, arms: dict, rows: list[dict], s: dict) -> str:
    base, new = list(arms)
    lines = ["# Two worker settings against each other", "",
             f"`{args.config}`, {args.threads} thread(s); base: `{' '.join(arms[base]) or 'the config'}`; "
             f"new: `{' '.join(arms[new]) or 'the config'}`.", "",
             "## Seconds per step", "", "| arm | repeat | s/step (median round) | best | load 1 min |",
             "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['arm']} | {r['repeat']} | {r['s_per_step']:.3f} | {r['s_per_step_best']:.3f} | "
                     f"{r['load_avg_1m'][0]:.1f} → {r['load_avg_1m'][1]:.1f} |")
    lines += ["", f"Mean s/step: base {s[base]['s_per_step_mean']:.3f}, new {s[new]['s_per_step_mean']:.3f}: "
                  f"**{s['change']:+.0%}**."]
    if "learning" in s:
        lr = s["learning"]
        lines += ["", "## What `hubgrpo train` learns", "",
                  f"{lr['steps']} steps per seed; per-step sampled training reward.", "",
                  "| seed | base mean reward | new mean reward | steps with equal reward |", "|---|---|---|---|"]
        for i, seed in enumerate(args.seeds):
            lines.append(f"| {seed} | {lr['per_seed_mean'][base][i]:.3f} | {lr['per_seed_mean'][new][i]:.3f} | "
                         f"{lr['equal_steps'][i]} of {lr['steps']} |")
        sd = lr["seed_sd_of_mean"][base]
        lines += ["", f"Mean over seeds: base {lr['mean_reward'][base]:.3f}, new {lr['mean_reward'][new]:.3f}; "
                      f"the spread of a seed's mean between seeds (base): {'–' if sd is None else f'{sd:.3f}'}."]
    return "\n".join(lines) + "\n"


def headline(args, arms: dict, s: dict) -> str:
    base, new = list(arms)
    text = (f"{Path(args.config).name}, {args.threads} thread(s): {s[base]['s_per_step_mean']:.2f} → "
            f"{s[new]['s_per_step_mean']:.2f} s/step ({s['change']:+.0%}) with {' '.join(arms[new])}")
    if "learning" in s:
        lr = s["learning"]
        text += (f"; train's mean reward over {lr['steps']} steps × {len(args.seeds)} seeds "
                 f"{lr['mean_reward'][base]:.3f} → {lr['mean_reward'][new]:.3f}")
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="configs/demo.yaml")
    ap.add_argument("--base", action="append", default=[], help="KEY=VALUE of the base arm (repeatable)")
    ap.add_argument("--new", action="append", default=[], help="KEY=VALUE of the new arm (repeatable)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=6, help="timed rounds per arm and repeat (after one warm-up)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--train-steps", type=int, default=30, help="0: no learning check")
    ap.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")], default=[0, 1, 2])
    ap.add_argument("--jobs", type=int, default=1, help="train runs at a time (one thread each)")
    ap.add_argument("--name", default="compare")
    ap.add_argument("--part", help=argparse.SUPPRESS)  # internal: one arm's speed, in its own process
    options(ap, __file__)
    args = ap.parse_args()
    if args.part is not None:
        print(json.dumps(speed_part(args)))
        return
    if args.quick:
        args.config, args.rounds, args.repeats, args.train_steps, args.seeds = TINY, 1, 1, 3, [0]
        args.base, args.new = args.base or ["worker.share_prompts=false"], args.new or ["worker.share_prompts=true"]
    arms = {"base": args.base, "new": args.new}
    meta = start(args.quick)
    rows = speed(args, arms)
    curves = learning(args, arms) if args.train_steps else {}
    s = summary(arms, rows, curves)
    data = {"args": {k: v for k, v in vars(args).items() if k != "part"}, "rows": rows, "curves": curves,
            "summary": s}
    write(results_dir(args, __file__), args.name, data, to_markdown(args, arms, rows, s), meta,
          headline(args, arms, s))
    print(to_markdown(args, arms, rows, s))


if __name__ == "__main__":
    main()
