"""What two processes can get out of this machine at once: ``hubgrpo train`` alone, then two ``hubgrpo train`` side
by side (one thread each, different seeds), the same config and steps. Nothing else of hubgrpo runs: no
coordinator, no Hub emulator, no uploads. Its ratio bounds every real N = 2 speed-up on this machine:

    ceiling = 2 × (seconds per step alone) / (seconds per step side by side)

A run of two workers cannot beat two trainers that never talk to each other, whatever its protocol costs.

    python benchmarks/speedup/side_by_side.py [--config configs/demo.yaml] [--steps 12] [--repeats 2]
    python benchmarks/speedup/side_by_side.py --quick   # the script checked: tiny model, 3 steps

Seconds per step: the median of TRL's per-step ``step_time`` over the steps after the first (warm-up), pooled over
the processes and repeats of each arrangement. Writes results/<name>.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.common import TINY, options, results_dir, sets, start, write  # noqa: E402


def train_cmd(args, out: Path, seed: int) -> list[str]:
    return [sys.executable, "-m", "hubgrpo.cli", "train", args.config, "--steps", str(args.steps), "--output",
            str(out), "--eval-samples", "0", *sets([*args.set, "worker.threads=1", f"params.seed={seed}"])]


def step_times(out: Path) -> list[float]:
    m = json.loads((out / "metrics.json").read_text())
    return [s["step_time"] for s in m["step_metrics"][1:] if s.get("step_time")]


def arrangement(args, tmp: Path, label: str, seeds: list[int]) -> list[list[float]]:
    """The trainers of ``seeds`` started together; each one's step times after the first."""
    outs = [tmp / f"{label}-s{s}" for s in seeds]
    env = {**os.environ, "QUIET": "1"}
    procs = [subprocess.Popen(train_cmd(args, o, s), cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
             for o, s in zip(outs, seeds)]
    for p in procs:
        if p.wait(timeout=args.timeout) != 0:
            sys.exit(f"hubgrpo train failed in {label} (exit {p.returncode})")
    return [step_times(o) for o in outs]


def summarise(alone: list[list[float]], side: list[list[float]]) -> dict:
    a = statistics.median([t for ts in alone for t in ts])
    b = statistics.median([t for ts in side for t in ts])
    return {"step_s_alone": a, "step_s_side_by_side": b, "slowdown": b / a, "ceiling": 2 * a / b}


def to_markdown(args, res: dict) -> str:
    return "\n".join([
        "# Two trainers side by side: the most a real N = 2 run can get on this machine", "",
        f"`{args.config}`, {args.steps} steps per process, one thread each, {args.repeats} repeat(s) of each "
        "arrangement. No coordinator, no uploads: two `hubgrpo train` processes that never talk.", "",
        "| arrangement | processes | s per step (median, steps 2–) |", "|---|---|---|",
        f"| alone | 1 | {res['step_s_alone']:.3f} |",
        f"| side by side | 2 | {res['step_s_side_by_side']:.3f} |", "",
        f"- Each process is **{res['slowdown']:.2f}×** slower beside another one than alone.",
        f"- Ceiling of a real N = 2 speed-up here: 2 × alone / side by side = **{res['ceiling']:.2f}×** "
        "(protocol, coordinator, merging and staleness all cost extra).", ""])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="configs/demo.yaml")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--name", default=None)
    options(ap, __file__)
    args = ap.parse_args()
    if args.quick:
        args.config, args.steps, args.repeats = TINY, 3, 1
    meta = start(args.quick)
    alone, side = [], []
    with tempfile.TemporaryDirectory(prefix="hubgrpo-side-") as tmp:
        for r in range(args.repeats):
            alone += arrangement(args, Path(tmp), f"alone{r}", [r])
            side += arrangement(args, Path(tmp), f"side{r}", [10 + 2 * r, 11 + 2 * r])
    res = {**summarise(alone, side), "alone": alone, "side_by_side": side}
    name = args.name or f"side-by-side-{Path(args.config).stem}"
    headline = (f"{Path(args.config).stem}: {res['step_s_alone']:.2f} s per step alone, "
                f"{res['step_s_side_by_side']:.2f} s side by side: N = 2 ceiling {res['ceiling']:.2f}×")
    write(results_dir(args, __file__), name, res, to_markdown(args, res), meta, headline)
    print(to_markdown(args, res))


if __name__ == "__main__":
    main()
