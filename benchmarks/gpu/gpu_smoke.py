"""GPU readiness smoke test: GRPO + LoRA rounds and a merge on CUDA, with seconds per step and peak GPU memory.

    python benchmarks/gpu/gpu_smoke.py [--results DIR] [--steps 4] [--rounds 3]
    python benchmarks/gpu/gpu_smoke.py --device cpu --quick   # the script checked on any machine

Needs a CUDA GPU (``--device cpu --quick`` checks the script itself on any machine). What it does, each part
recorded even when another fails:

1. **Rounds** with the real round engine (``hubgrpo.worker.engine.RoundEngine``: TRL ``GRPOTrainer`` + PEFT) on two
   model shapes: SmolLM2-135M (the real ``builtin:smollm2-135m-instruct`` when it is in the hubgrpo cache, else a
   random model of its exact shape) and Qwen2.5-0.5B (a random model of its shape; the built-in tiny tokenizer
   stands in for the 151k-token one, so the embedding is small). ``--rounds`` rounds of ``--steps`` steps from the
   version-0 adapter, 16 completions per step of up to 128 new tokens (random weights generate to the limit, the
   worst case). It records seconds per step (rounds after the first), peak GPU memory, the dtype of the model
   and of the saved adapter (float32 LoRA weights, so GPU and CPU workers' submissions mix), whether every
   parameter sits on the GPU, and GPU memory after each round (it must not grow: memory is freed between rounds).
   A greedy evaluation of 16 held-out prompts runs on the GPU too.
2. **A merge on the GPU**: ``hubgrpo.merge.merge`` of 32 rank-16 submissions of Qwen2.5-0.5B shapes (synthetic,
   as in ``benchmarks/merge/merge.py``) on CUDA and on the CPU, its wall time on each and the largest difference
   between the two results.

Writes ``gpu_smoke.json`` and ``gpu_smoke.md`` into ``--results`` (default ``benchmarks/gpu/results``). CPU CI runs
``--device cpu --quick`` only.
"""

from __future__ import annotations

import argparse
import gc
import platform
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing (e.g. a bare GPU machine)

from benchmarks.common import options, random_model, results_dir, start, write  # noqa: E402


def environment(device: str) -> dict:
    import torch

    env = {"python": platform.python_version(), "torch": torch.__version__, "device": device}
    for name in ("transformers", "trl", "peft"):
        env[name] = __import__(name).__version__
    if device.startswith("cuda"):
        capability = ".".join(map(str, torch.cuda.get_device_capability(0)))
        env.update(gpu=torch.cuda.get_device_name(0), capability=capability,
                   bf16=torch.cuda.is_bf16_supported(), gpu_memory_gib=round(
                       torch.cuda.get_device_properties(0).total_memory / 2**30, 1))
    return env


def base_model_for(name: str, tmp: Path, quick: bool) -> tuple[str, str]:
    """(base_model for the config, what it is): the real SmolLM2 when cached, else a random model of its shape."""
    if name == "smollm2-135m" and not quick:
        from hubgrpo.runrepo import cache_root

        if any((cache_root() / "models").glob("smollm2-135m-instruct*/config.json")):
            return "builtin:smollm2-135m-instruct", "SmolLM2-135M-Instruct (real weights, from the hubgrpo cache)"
    return random_model(name, tmp / name, quick), f"random weights, {name} shapes, tiny tokenizer"


def smoke_config(base_model: str, device: str, steps: int, quick: bool):
    from hubgrpo.config import loads

    return loads(f"""
base_model: {base_model}
project_name: gpu-smoke
data: {{path: "builtin:addition", options: {{digits: 2, size: 2000}}, eval_fraction: 0.05}}
rewards: [{{function: "builtin:exact_answer"}}, {{function: "builtin:answer_format", weight: 0.5}}]
params: {{learning_rate: 1.0e-4, per_device_train_batch_size: 16, num_generations: 4,
          max_completion_length: {16 if quick else 128}}}
rounds: {{steps: {steps}}}
worker: {{device: {device}, dtype: auto}}
lora: {{r: 16, alpha: 32, target_modules: all-linear}}
""")


def lease(steps: int, i: int, per_round: int):
    from hubgrpo.layout import Lease

    now = time.time()
    return Lease(lease_id=f"gpu{i}", run_id="gpu-smoke", round_id=i, worker="gpu", base_version=0,
                 base_sha="0" * 40, prompt_indices=list(range(i * per_round, (i + 1) * per_round)), steps=steps,
                 seed=i, issued_at=now, deadline=now + 3600)


def rounds_part(name: str, device: str, steps: int, rounds: int, quick: bool, tmp: Path) -> dict:
    """Build the engine, run ``rounds`` rounds; per-step seconds, memory, dtypes and device placement."""
    import torch
    from safetensors.torch import load_file

    from hubgrpo.worker.engine import RoundEngine

    base, what = base_model_for(name, tmp, quick)
    cfg = smoke_config(base, device, steps, quick)
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    engine = RoundEngine(cfg, worker="gpu")
    setup_s = time.perf_counter() - t0
    params = list(engine.trainer.model.parameters())
    on_device = all(p.device.type == torch.device(device).type for p in params)
    adapter = engine.init_adapter(tmp / f"{name}-v0")
    per_round = cfg.params.per_device_train_batch_size // cfg.params.num_generations * steps
    subs, after = [], []
    for i in range(rounds):
        subs.append(engine.run_round(adapter, lease(steps, i, per_round), tmp / f"{name}-r{i}"))
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
            after.append(torch.cuda.memory_allocated() / 2**20)
    saved = load_file(tmp / f"{name}-r0" / "adapter_model.safetensors")
    t1 = time.perf_counter()
    eval_reward = engine.evaluate(n=16)
    eval_s = time.perf_counter() - t1
    timed = subs[1:] or subs
    return {
        "model": name, "weights": what, "base_model_params_m": round(sum(p.numel() for p in params) / 1e6, 1),
        "setup_s": round(setup_s, 2), "steps_per_round": steps,
        "completions_per_step": cfg.params.per_device_train_batch_size,
        "max_completion_length": cfg.params.max_completion_length,
        "s_per_step": round(statistics.median(s.timings["total"] / s.steps for s in timed), 3),
        "s_per_round_breakdown": {k: round(statistics.median(s.timings[k] for s in timed), 3)
                                  for k in ("load", "generate", "reward", "train", "save", "total")},
        "tokens_per_round": statistics.median(s.tokens for s in timed),
        "peak_gpu_mib": round(torch.cuda.max_memory_allocated() / 2**20) if cuda else None,
        "gpu_mib_after_each_round": [round(x) for x in after],
        "model_dtype": str(engine.trainer.model.dtype),
        "adapter_dtypes": sorted({str(v.dtype) for v in saved.values()}),
        "all_parameters_on_device": on_device, "device": subs[0].device,
        "eval_greedy_16_prompts": round(eval_reward, 4), "eval_s": round(eval_s, 2),
    }


def merge_part(device: str, quick: bool) -> dict:
    """32 rank-16 submissions of Qwen2.5-0.5B shapes merged (svd) on ``device`` and on the CPU."""
    import torch

    from hubgrpo.merge import Adapter, MergeOptions, merge
    from tests.support.adapter_factory import QWEN_05B, TINY, drifted, make_adapter

    shapes, n = (TINY, 4) if quick else (QWEN_05B, 32)
    global_ = make_adapter(shapes, r=16, seed=0, alpha=32)
    subs = [drifted(global_, 0.5, seed=i + 1) for i in range(n)]
    out = {"submissions": n, "shapes": "tiny" if quick else "Qwen2.5-0.5B, rank 16, all-linear"}

    def on(dev: str, a: Adapter) -> Adapter:
        return Adapter({k: v.to(dev) for k, v in a.weights.items()}, a.config)

    results = {}
    for dev in dict.fromkeys([device, "cpu"]):
        g, items = on(dev, global_), [(on(dev, s), on(dev, global_), 1.0 / n) for s in subs]
        merge(g, items[:2], MergeOptions(method="svd"))  # warm-up (kernels, allocator)
        if dev.startswith("cuda"):
            torch.cuda.synchronize()
        t = time.perf_counter()
        res = merge(g, items, MergeOptions(method="svd"))
        if dev.startswith("cuda"):
            torch.cuda.synchronize()
        out[f"merge_s_{dev.split(':')[0]}"] = round(time.perf_counter() - t, 3)
        out[f"algorithm_{dev.split(':')[0]}"] = res.report.get("algorithm")
        results[dev] = res
    if len(results) == 2:
        gpu, cpu = (results[d].adapter.weights for d in results)
        # factors may differ by a sign/rotation within equal singular values: compare the products B·A per module
        diffs = []
        for k in gpu:
            if k.endswith("lora_A.weight"):
                kb = k.replace("lora_A", "lora_B")
                prod_gpu = (gpu[kb].float() @ gpu[k].float()).cpu()
                prod_cpu = cpu[kb].float() @ cpu[k].float()
                diffs.append(float((prod_gpu - prod_cpu).norm() / prod_cpu.norm().clamp_min(1e-12)))
        out["max_relative_difference_gpu_vs_cpu"] = max(diffs)
    return out


def run_part(name: str, fn) -> dict:
    t = time.perf_counter()
    try:
        result = fn()
        result["ok"] = True
    except Exception as e:  # deliberate: a smoke test reports every part, whatever fails
        result = {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
    result["part_s"] = round(time.perf_counter() - t, 1)
    said = "ok" if result["ok"] else result["error"]
    print(f"[{Path(sys.argv[0]).stem}] {name}: {said} ({result['part_s']} s)", flush=True)
    return result


def markdown(report: dict) -> str:
    env = report["environment"]
    lines = ["# GPU smoke", "", "Environment: " + ", ".join(f"{k} {v}" for k, v in env.items()),
             "", "| model | weights | params (M) | s/step | generate / train s per round | peak GPU MiB | "
             "GPU MiB after each round | model / adapter dtype | on device | eval (greedy) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["rounds"]:
        if not r["ok"]:
            lines.append(f"| {r.get('model', '?')} | failed: {r['error']} |||||||||")
            continue
        b = r["s_per_round_breakdown"]
        lines.append(f"| {r['model']} | {r['weights']} | {r['base_model_params_m']} | {r['s_per_step']} | "
                     f"{b['generate']} / {b['train']} | {r['peak_gpu_mib']} | {r['gpu_mib_after_each_round']} | "
                     f"{r['model_dtype']} / {', '.join(r['adapter_dtypes'])} | {r['all_parameters_on_device']} | "
                     f"{r['eval_greedy_16_prompts']} |")
    m = report["merge"]
    lines += ["", "Merge (svd) of " + (f"{m['submissions']} submissions, {m['shapes']}: " if m["ok"] else "")
              + (", ".join(f"{k} {v}" for k, v in m.items() if k.startswith(("merge_s", "algorithm", "max_rel")))
                 if m["ok"] else f"failed: {m['error']}")]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--models", default="smollm2-135m,qwen2.5-0.5b")
    options(ap, __file__)  # --quick: tiny shapes and lengths, checks the script, not the GPU
    args = ap.parse_args()
    if args.quick:  # and short: two rounds (the second shows whether memory grows) of one step
        args.steps, args.rounds = min(args.steps, 1), min(args.rounds, 2)
    meta = start(args.quick)
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_smoke: no CUDA device here (run it on a GPU machine, or pass --device cpu --quick)", file=sys.stderr)
        return 2
    report = {"environment": environment(args.device)}
    with tempfile.TemporaryDirectory(prefix="hubgrpo-gpu-smoke-") as tmp:
        report["rounds"] = [run_part(f"rounds {name}", lambda name=name: rounds_part(
            name, args.device, args.steps, args.rounds, args.quick, Path(tmp))) for name in args.models.split(",")]
    report["merge"] = run_part("merge", lambda: merge_part(args.device, args.quick))
    steps = "; ".join(f"{r['model']} {r['s_per_step']} s/step, peak {r['peak_gpu_mib']} MiB" for r in report["rounds"]
                      if r["ok"])
    write(results_dir(args, __file__), "gpu_smoke", report, markdown(report), meta,
          f"{report['environment'].get('gpu', args.device)}: {steps or 'no round passed'}")
    print(markdown(report))
    return 0 if all(p["ok"] for p in report["rounds"] + [report["merge"]]) else 1


if __name__ == "__main__":
    sys.exit(main())
