"""Which merge makes 2 asynchronous workers learn fastest? The variants behind configs/demo.yaml's merge section.

    python benchmarks/merge/merge_choice.py [--seeds 0,1] [--variants svd,keep_a,keep_a_adam,nesterov]
                                            [--work DIR] [--train-seeds 0,1,2,3]
    python benchmarks/merge/merge_choice.py --quick   # the script checked: tiny, svd, 3 versions, 5 train steps

Each variant is a ``hubgrpo simulate configs/demo.yaml --workers 2`` (real SmolLM2 GRPO rounds, virtual clock:
8 s per step, 1 thread; quorum 1; greedy held-out eval on 32 prompts after every version) until version 14, with
every knob the variants differ in set explicitly (so the figures do not depend on the YAML's current defaults):

- ``svd``: the earlier demo — svd merge, outer_lr 1, balanced factor split, a fresh AdamW every round;
- ``keep_a``: + ``merge.factor_split=keep_a``;
- ``keep_a_adam``: + each worker keeps its AdamW moments (``rounds.reset_optimizer=false``);
- ``nesterov``: + outer Nesterov momentum 0.9 with outer_lr 0.3 (DiLoCo-style outer optimizer; the shipped demo);
- ``nesterov_k2`` / ``nesterov_k2_lr05``: the same with 2-step rounds (outer_lr 0.3 / 0.5), until version 30, held-out
  scored every 5th version (fresher rounds: less drift between the two workers' bases);
- ``sync_nesterov``: quorum 2 (both workers' rounds from the same version, averaged: synchronous DiLoCo, no
  staleness) with DiLoCo's outer Nesterov (lr 0.7, momentum 0.9), until version 8 (16 rounds).

Reported per variant and seed: virtual seconds until a version's merged rounds reach a training reward of 0.9 (the
issue's target), the held-out reward at the end and its minimum after version 4 (dips), the staleness histogram.
``hubgrpo train`` (the single-process reference, 40 steps) reports the virtual seconds (steps × 8 s) until its
5-step mean reaches 0.9. Simulations and trainings already in ``--work`` from the same command are reused.

Writes results/merge-choice.{md,json}.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.common import TINY, cached_run, options, results_dir, sets, start, write  # noqa: E402

CONFIG = "configs/demo.yaml"
STEP_S = 8.0
TRAIN_STEPS = 40
BASE = ["rounds.reset_optimizer=true", "merge.method=svd", "merge.factor_split=balanced", "merge.outer_lr=1.0",
        "merge.outer_momentum=0.0", "merge.nesterov=false", "merge.quorum=1", "worker.threads=1"]

VARIANTS = {
    "svd": [],
    "keep_a": ["merge.factor_split=keep_a"],
    "keep_a_adam": ["merge.factor_split=keep_a", "rounds.reset_optimizer=false"],
    "nesterov": ["merge.factor_split=keep_a", "rounds.reset_optimizer=false", "merge.outer_lr=0.3",
                 "merge.outer_momentum=0.9", "merge.nesterov=true"],
    "nesterov_k2": ["merge.factor_split=keep_a", "rounds.reset_optimizer=false", "merge.outer_lr=0.3",
                    "merge.outer_momentum=0.9", "merge.nesterov=true", "rounds.steps=2"],
    "nesterov_k2_lr05": ["merge.factor_split=keep_a", "rounds.reset_optimizer=false", "merge.outer_lr=0.5",
                         "merge.outer_momentum=0.9", "merge.nesterov=true", "rounds.steps=2"],
    "sync_nesterov": ["merge.factor_split=keep_a", "rounds.reset_optimizer=false", "merge.outer_lr=0.7",
                      "merge.outer_momentum=0.9", "merge.nesterov=true", "merge.quorum=2"],
    "sync_sqrt": ["merge.factor_split=keep_a", "rounds.reset_optimizer=false", "merge.outer_lr=1.414",
                  "merge.quorum=2"],  # both rounds averaged, the step √2 larger (round_agreement: they are ~orthogonal)
}
# Variants with shorter rounds run more versions for the same samples and score held-out less often.
RUN_ARGS = {"nesterov_k2": ["--until-version", "30", "--eval-every", "5"],
            "nesterov_k2_lr05": ["--until-version", "30", "--eval-every", "5"],
            "sync_nesterov": ["--until-version", "8"], "sync_sqrt": ["--until-version", "8"]}
STEP_SAMPLES = 8  # completions per GRPO step (configs/demo.yaml)


def windowed_hit(rows: list[dict], target: float = 0.9, window: int = 5 * STEP_SAMPLES) -> dict | None:
    """The first version whose merged rounds, together with the versions just before it, cover ``window``
    samples (a 5-step round's worth, like ``hubgrpo train``'s 5-step mean) with a mean training reward
    ≥ ``target``; for 5-step rounds and quorum 1 it is the version's own training reward."""
    for i in range(1, len(rows)):
        total = weighted = 0.0
        for j in range(i, 0, -1):
            n = rows[j]["samples"] - rows[j - 1]["samples"]
            if rows[j]["train_reward"] is None or n <= 0:
                break
            total, weighted = total + n, weighted + n * rows[j]["train_reward"]
            if total >= window:
                break
        if total >= window and weighted / total >= target:
            return rows[i]
    return None


def simulate(work: Path, variant: str, seed: int) -> dict:
    run_args = RUN_ARGS.get(variant, ["--until-version", "14"])
    cmd = ["simulate", CONFIG, "--workers", "2", "--seed", str(seed), "--step-s", str(STEP_S), *run_args,
           "--eval-samples", "32", "--no-progress", *sets([*BASE, *VARIANTS[variant]])]
    res = cached_run(work / f"{variant}-s{seed}", cmd, "simulation.json")
    rows = res["versions"]
    hit = windowed_hit(rows)
    evals = [v["eval_reward"] for v in rows if v["eval_reward"] is not None]
    return {"variant": variant, "seed": seed, "t_train_0.9": hit["virtual_time_s"] if hit else None,
            "version_0.9": hit["version"] if hit else None, "eval_first": evals[0], "eval_last": evals[-1],
            "eval_min_after_v4": min(evals[5:]) if len(evals) > 5 else None,
            "staleness_histogram": res["staleness_histogram"], "virtual_wall_s": res["virtual_wall_s"],
            "curve": [(v["version"], v["virtual_time_s"], v["train_reward"], v["eval_reward"]) for v in rows]}


def train(work: Path, seed: int) -> dict:
    cmd = ["train", CONFIG, "--steps", str(TRAIN_STEPS), "--eval-samples", "32", "--set", "worker.threads=1",
           "--set", f"params.seed={seed}"]
    res = cached_run(work / f"train-s{seed}", cmd, "metrics.json")
    r = [m["reward"] for m in res["step_metrics"]]
    step = next((i + 1 for i in range(4, len(r)) if sum(r[i - 4:i + 1]) / 5 >= 0.9), None)
    return {"seed": seed, "t_train_0.9": step * STEP_S if step else None, "step_0.9": step,
            "eval_before": res["eval"]["before"], "eval_after": res["eval"]["after"]}


def report(sims: list[dict], trains: list[dict]) -> str:
    f = lambda x: "–" if x is None else (f"{x:.0f}" if isinstance(x, (int, float)) and x > 5 else f"{x:.3f}")  # noqa: E731
    lines = ["# Which merge for 2 asynchronous workers (configs/demo.yaml, `hubgrpo simulate --workers 2`)", "",
             f"Virtual clock {STEP_S:.0f} s per GRPO step (1 thread), quorum 1, 14 versions (k2 variants: 30, "
             f"2-step rounds; sync variants: quorum 2, 8 versions), "
             f"greedy held-out on 32 prompts. The target is the first version whose merged rounds, with the versions "
             f"just before it, cover 40 samples (one 5-step round, like train's 5-step mean) at a mean reward ≥ 0.9.", "",
             "| variant | seed | s to training reward 0.9 (version) | held-out v0 → last | held-out min after v4 | τ histogram |",
             "|---|---|---|---|---|---|"]
    for s in sims:
        lines.append(f"| {s['variant']} | {s['seed']} | {f(s['t_train_0.9'])} ({s['version_0.9']}) | "
                     f"{s['eval_first']:.3f} → {s['eval_last']:.3f} | {f(s['eval_min_after_v4'])} | "
                     f"{s['staleness_histogram']} |")
    lines += ["", f"`hubgrpo train --steps {TRAIN_STEPS}` (one process, 1 thread; s = steps × {STEP_S:g}):", "",
              "| seed | s to a 5-step mean of 0.9 (step) | held-out before → after |", "|---|---|---|"]
    lines += [f"| {t['seed']} | {f(t['t_train_0.9'])} ({t['step_0.9']}) | {t['eval_before']:.3f} → "
              f"{t['eval_after']:.3f} |" for t in trains]
    return "\n".join(lines) + "\n"


def headline(sims: list[dict]) -> str:
    """Each variant's mean virtual seconds to a training reward of 0.9."""
    parts = []
    for v in dict.fromkeys(x["variant"] for x in sims):
        ts = [x["t_train_0.9"] for x in sims if x["variant"] == v]
        hit = [t for t in ts if t is not None]
        parts.append(f"{v} " + (f"{sum(hit) / len(hit):.0f} s" if hit else "not reached")
                     + (f" ({len(hit)} of {len(ts)} seeds)" if len(hit) < len(ts) else ""))
    return "2 simulated workers, virtual s to a training reward of 0.9: " + ", ".join(parts)


def main() -> None:
    global CONFIG, STEP_S, TRAIN_STEPS
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--variants", default="svd,keep_a,keep_a_adam,nesterov,nesterov_k2,sync_nesterov,sync_sqrt")  # measured
    ap.add_argument("--train-seeds", default="0,1,2,3")
    ap.add_argument("--work", type=Path, default=ROOT / "runs" / "merge-choice")
    options(ap, __file__)
    args = ap.parse_args()
    out = results_dir(args, __file__)
    if args.quick:  # a check of the script: the tiny model, one variant and seed, 3 versions
        CONFIG, STEP_S, TRAIN_STEPS = TINY, 0.45, 5
        args.seeds, args.variants, args.train_seeds = "0", "svd", "0"
        args.work = out / "work"
        RUN_ARGS["svd"] = ["--until-version", "3"]
    meta = start(args.quick)
    seeds = [int(s) for s in args.seeds.split(",") if s]
    sims = [simulate(args.work, v, s) for v in args.variants.split(",") for s in seeds]
    trains = [train(args.work, int(s)) for s in args.train_seeds.split(",") if s]
    text = report(sims, trains)
    write(out, "merge-choice", {"sims": sims, "train": trains}, text, meta, headline(sims))
    print(text)


if __name__ == "__main__":
    main()
