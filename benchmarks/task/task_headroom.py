"""Which built-in task keeps SmolLM2-135M learning for hundreds of steps on a CPU: one process per candidate task,
its held-out reward (sampled, ``--eval`` prompts) every ``--save-every`` steps.

    python benchmarks/task/task_headroom.py [--candidates arithmetic,word2,addition3,countdown3]
        [--steps 200] [--save-every 25] [--eval 64] [--threads 2] [--jobs 1] [--seed 0] [--name task-headroom]
        [--results DIR]

Each candidate is ``configs/demo.yaml`` with the data, rewards and completion length named in ``CANDIDATES``,
trained by the real CLI (``hubgrpo train … --save-every K``); afterwards every checkpoint (and the untrained
adapter, step 0) is scored in this process on the same held-out prompts, sampled at the config's temperature
(``RoundEngine.evaluate(greedy=False)``). Headroom (issue: a task that keeps learning): the step-0 score below
30 % of the maximum reward (the sum of the reward weights), the step-100 score below 80 % of it, and the score at
the last step above the step-100 one. ``--jobs N`` trains N candidates at once (each with ``--threads``):
the curves count steps, so they do not depend on it; the s/step column does. Writes results/<name>.{md,json}
(``benchmarks/common.py``'s result shape).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks import common  # noqa: E402
from benchmarks.common import hubgrpo, sets  # noqa: E402

FORMAT = '{function: "builtin:answer_format", weight: 0.5}'
CLOSE = ('rewards=[{function: "builtin:exact_answer", weight: 1.0}, {function: "builtin:close_answer", weight: 0.5}, '
         + FORMAT + "]")  # exact + partial credit for a near miss + format
CANDIDATES = {  # name -> overrides of configs/demo.yaml
    "addition1": [],  # the demo task itself: the reference that saturates
    "addition2": ["data.options={digits: 2, terms: 2, size: 5000}"],
    "addition1x3": ["data.options={digits: 1, terms: 3, size: 5000}"],
    "addition1x3-t07": ["data.options={digits: 1, terms: 3, size: 5000}", "params.temperature=0.7"],
    "addition1x3-g8": ["data.options={digits: 1, terms: 3, size: 5000}", "params.num_generations=8",
                       "params.per_device_train_batch_size=16"],
    "addition2to3": ["data.options={digits: 1, terms: 3, min_terms: 2, size: 5000}"],
    "addition2to3-lr1e4": ["data.options={digits: 1, terms: 3, min_terms: 2, size: 5000}",
                           "params.learning_rate=1e-4"],
    "addition2to3-close": ["data.options={digits: 1, terms: 3, min_terms: 2, size: 5000}", CLOSE],
    "addition2to3-close-lr1e4": ["data.options={digits: 1, terms: 3, min_terms: 2, size: 5000}", CLOSE,
                                 "params.learning_rate=1e-4"],
    "addition3": ["data.options={digits: 2, terms: 3, size: 5000}"],
    "arithmetic": ["data.path=builtin:arithmetic", "data.options={terms: 3, digits: 1, size: 5000}"],
    "arithmetic2": ["data.path=builtin:arithmetic", "data.options={terms: 3, digits: 2, size: 5000}",
                    "params.max_completion_length=16"],
    "word2": ["data.path=builtin:word_problems", "data.options={steps: 2, max_number: 20, size: 5000}",
              "params.max_prompt_length=160"],
    "countdown3": ["data.path=builtin:countdown", "data.options={numbers: 3, max_number: 10, size: 5000}",
                   f'rewards=[{{function: "builtin:countdown", weight: 1.0}}, {FORMAT}]',
                   "params.max_completion_length=16"],
}


def train(args, name: str, out: Path) -> dict:
    overrides = [*CANDIDATES[name], f"worker.threads={args.threads}", f"params.seed={args.seed}", "worker.device=cpu"]
    wall = hubgrpo("train", args.config, "--steps", str(args.steps), "--output", str(out), "--eval-samples", "0",
                   "--save-every", str(args.save_every), *sets(overrides))
    metrics = json.loads((out / "metrics.json").read_text())
    rewards = [s["reward"] for s in metrics["step_metrics"]]
    return {"overrides": overrides, "wall_s": wall, "setup_s": metrics["timings"].get("setup"),
            "step_s": sum(s.get("step_time") or 0 for s in metrics["step_metrics"]) / max(1, len(rewards)),
            "train_reward": rewards}


def score(args, name: str, out: Path) -> tuple[list[dict], float]:
    """(step, held-out reward) for step 0 and every checkpoint; the maximum reward."""
    from hubgrpo.config import load_config
    from hubgrpo.worker.engine import RoundEngine

    cfg = load_config(ROOT / args.config, overrides=[*CANDIDATES[name], f"params.seed={args.seed}",
                                                       "worker.device=cpu", f"worker.threads={args.threads}"])
    engine = RoundEngine(cfg, worker="eval")
    curve = [{"step": 0, "eval": engine.evaluate(n=args.eval, greedy=False, seed=1000)}]
    for folder in sorted(out.glob("checkpoints/step-*")):
        engine.load_adapter(folder)
        curve.append({"step": int(folder.name.split("-")[1]),
                      "eval": engine.evaluate(n=args.eval, greedy=False, seed=1000)})
    return curve, sum(rc.weight for rc in cfg.rewards)


RISE = 0.05  # of the maximum: how much the last checkpoints must beat those at the middle step (above the noise)


def verdict(curve: list[dict], top: float, mid_step: int) -> dict:
    """Headroom criteria of one curve. Rising is judged on pairs of checkpoints (the last two against the middle step
    and the one before it), by more than ``RISE`` of the maximum: one 64-prompt sampled score moves by ~0.1 alone."""
    at = {c["step"]: c["eval"] for c in curve}
    steps = sorted(at)
    start, last = at[0], curve[-1]["eval"]
    mid = at.get(mid_step)
    rises = False
    if mid is not None and len(steps) >= 4:
        i = steps.index(mid_step)
        before = (at[steps[max(0, i - 1)]] + mid) / 2
        rises = (at[steps[-1]] + at[steps[-2]]) / 2 - before > RISE * top
    return {"start_frac": start / top, "mid_frac": None if mid is None else mid / top, "last_frac": last / top,
            "starts_low": start < 0.3 * top, "mid_below": mid is not None and mid < 0.8 * top,
            "still_rises": rises, "max": top}


def to_markdown(args, rows: dict, meta: dict) -> str:
    steps = sorted({c["step"] for r in rows.values() for c in r["curve"]})
    lines = [f"# Task headroom: SmolLM2-135M, one process, {args.steps} steps", "",
             f"`configs/demo.yaml` with each candidate's data/rewards; {args.threads} threads; seed {args.seed}; "
             f"held-out: sampled (temperature of the config) on {args.eval} prompts, the same for every checkpoint; "
             f"{meta['jobs']} candidate(s) trained at once. Headroom: step 0 < 30 % of the "
             f"maximum, step {args.mid} < 80 %, the last two checkpoints' mean above that of step {args.mid} and the one "
             f"before by more than {RISE:.0%} of the maximum.", "",
             "| task | max | " + " | ".join(f"step {s}" for s in steps) + " | s/step | headroom |",
             "|---|---|" + "---|" * len(steps) + "---|---|"]
    for name, r in rows.items():
        at, v = {c["step"]: c["eval"] for c in r["curve"]}, r["verdict"]
        ok = v["starts_low"] and v["mid_below"] and v["still_rises"]
        why = ", ".join(k for k in ("starts_low", "mid_below", "still_rises") if not v[k])
        measured = r.get("measured")
        label = f"{name} (commit {measured['commit']})" if measured else name
        lines.append(f"| {label} | {v['max']:g} | " + " | ".join(f"{at[s]:.3f}" if s in at else "–" for s in steps)
                     + f" | {r['step_s']:.1f} | {'yes' if ok else 'no (' + why + ')'} |")
    return "\n".join(lines) + "\n"


def write(args, rows: dict, meta: dict) -> None:
    ok = [n for n, r in rows.items() if all(r["verdict"][k] for k in ("starts_low", "mid_below", "still_rises"))]
    common.write(args.results, args.name, {"args": {k: str(v) if isinstance(v, Path) else v for k, v in
                                                   vars(args).items()}, "rows": rows},
                 to_markdown(args, rows, meta), meta,
                 f"{len(ok)} of {len(rows)} candidate task(s) keep SmolLM2 learning: {', '.join(ok) or 'none'}")


def earlier(args, path: Path) -> dict:
    """The rows of an earlier result, each marked with the commit and date that measured it."""
    data = json.loads(path.read_text())
    then = data["args"]
    for key in ("steps", "eval", "seed", "save_every"):
        if then.get(key) != getattr(args, key):
            raise SystemExit(f"--add-to {path}: it measured {key}={then.get(key)}, this run {getattr(args, key)}")
    return {name: {**row, "verdict": verdict(row["curve"], row["verdict"]["max"], args.mid),  # today's criteria
                   "measured": row.get("measured") or {"commit": data["meta"].get("commit"),
                                                       "date": data["meta"].get("date")}}
            for name, row in data["rows"].items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="configs/demo.yaml")
    ap.add_argument("--candidates", default="arithmetic,word2,addition3,countdown3")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--save-every", type=int, default=25)
    ap.add_argument("--mid", type=int, default=100, help="the step whose score must stay below 80 %%")
    ap.add_argument("--eval", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--jobs", type=int, default=1, help="candidates trained at the same time")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--name", default="task-headroom")
    ap.add_argument("--results", type=Path, default=Path(__file__).resolve().parent / "results")
    ap.add_argument("--add-to", type=Path, action="append", default=[], help="an earlier result of this script "
                    "(same --steps, --eval, --seed; repeatable): its candidates join this one's table, each with the "
                    "commit it measured; with --candidates '' only the table of the earlier ones is written")
    args = ap.parse_args()
    rows = {name: row for path in args.add_to for name, row in earlier(args, path).items()}
    meta = {**common.start(), "jobs": args.jobs}
    names = [n for n in args.candidates.split(",") if n]
    with tempfile.TemporaryDirectory(prefix="hubgrpo-headroom-") as tmp:
        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            trained = {name: pool.submit(train, args, name, Path(tmp) / name) for name in names}
            for name in names:  # scored in order, each as soon as it is trained
                row = trained[name].result()
                row["curve"], top = score(args, name, Path(tmp) / name)
                row["verdict"] = verdict(row["curve"], top, args.mid)
                rows[name] = row
                print(json.dumps({"task": name, "curve": row["curve"], **row["verdict"]}), flush=True)
                write(args, rows, meta)
    if not names:
        write(args, rows, meta)
    print(to_markdown(args, rows, meta))


if __name__ == "__main__":
    main()
