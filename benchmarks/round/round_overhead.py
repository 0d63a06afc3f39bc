"""The fixed cost of a round: K rounds of one GRPO step each against one round of K steps, on one engine, with the
heap frozen around ``Trainer.train()`` (what ``RoundEngine.train_steps`` does) and without (``--config`` any; tiny
by default). Each ``train()`` starts with a full ``gc.collect()`` (accelerate's ``free_memory``), which walks every
object of the loaded model and libraries; short rounds pay it every step.

    python benchmarks/round/round_overhead.py [--config configs/demo.yaml] [--steps 10] [--repeats 2]
    python benchmarks/round/round_overhead.py --quick   # the script checked: tiny, 2 steps, once

Writes results/round_overhead[-NAME].{json,md}.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.common import options, results_dir, start, write  # noqa: E402


def timed(engine, rows, steps: int, calls: int, seed: int) -> float:
    t = time.perf_counter()
    for i in range(calls):
        engine.train_steps(rows, steps, seed=seed + i)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="configs/tiny.yaml")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--name", default=None)
    options(ap, __file__)
    args = ap.parse_args()
    if args.quick:
        args.config, args.steps, args.repeats = "configs/tiny.yaml", 2, 1
    meta = start(args.quick)
    import hubgrpo.worker.engine as engine_mod
    from hubgrpo.config import load_config

    cfg = load_config(ROOT / args.config, overrides=["rounds.reset_optimizer=false", "worker.threads=1"])
    engine = engine_mod.RoundEngine(cfg)
    rows = engine.prompt_rows(range(max(cfg.params.per_device_train_batch_size, 8)))
    engine.train_steps(rows, 1, seed=0)  # warm-up
    t = time.perf_counter()
    gc.collect()
    collect_s, objects = time.perf_counter() - t, len(gc.get_objects())
    frozen, rows_out = engine_mod.frozen_heap, []
    for rep in range(args.repeats):
        for label, cm in (("frozen (as shipped)", frozen), ("not frozen", contextlib.nullcontext)):
            engine_mod.frozen_heap = cm
            one = timed(engine, rows, args.steps, 1, 100 * rep)
            many = timed(engine, rows, 1, args.steps, 100 * rep + 50)
            rows_out.append({"repeat": rep, "heap": label, "one_round_s": one, "one_step_rounds_s": many,
                             "per_round_overhead_s": (many - one) / args.steps})
    engine_mod.frozen_heap = frozen
    report = {"config": args.config, "steps": args.steps, "objects": objects, "full_collect_s": collect_s,
              "rows": rows_out}
    lines = ["# Fixed cost of a round", "",
             f"`{args.config}`, 1 thread, AdamW moments kept; {objects} objects tracked by the garbage collector, a "
             f"full collection {collect_s:.3f} s.",
             "", f"| repeat | heap during train() | 1 round of {args.steps} steps (s) | {args.steps} rounds of 1 step (s) "
             "| fixed cost per round (s) |", "|---|---|---|---|---|"]
    lines += [f"| {r['repeat']} | {r['heap']} | {r['one_round_s']:.2f} | {r['one_step_rounds_s']:.2f} | "
              f"{r['per_round_overhead_s']:.3f} |" for r in rows_out]
    name = "round_overhead" + (f"-{args.name}" if args.name else "")
    frozen_rows = [r["per_round_overhead_s"] for r in rows_out if r["heap"].startswith("frozen")]
    loose_rows = [r["per_round_overhead_s"] for r in rows_out if not r["heap"].startswith("frozen")]
    write(results_dir(args, __file__), name, report, "\n".join(lines), meta,
          f"fixed cost of a round ({args.config}): {min(frozen_rows):.3f} s with the heap frozen (as shipped), "
          f"{min(loose_rows):.3f} s without")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
