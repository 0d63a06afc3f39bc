"""One worker step taken apart: where a GRPO round's time goes on this machine, and how much of the processor it
uses.

    .venv/bin/python benchmarks/round/profile_step.py [--config configs/demo.yaml] [--threads 1] [--rounds 4]
        [--set KEY=VALUE …] [--device cpu|cuda] [--shape smollm2-135m|qwen2.5-0.5b] [--name profile-step]
        [--quick] [--results DIR]

A ``RoundEngine`` (what ``hubgrpo worker`` trains with) runs one warm-up round and ``--rounds`` measured rounds of
the config's ``rounds.steps`` steps, on leases made here, with hooks that time each phase:

- **prefill** / **decode**: the model's forward calls during generation (no grad), told apart by their input
  length (the first call of a ``generate`` reads the prompts; each later call one token per sequence);
  **generate, other**: the rest of TRL's ``_generate`` (tokenising, padding, sampling, decoding text);
- **reward**: the reward functions (the engine's own count);
- **forward** / **backward** / **optimizer**: the training forward (grad on), from its end to
  ``on_pre_optimizer_step`` (loss and backward), and the optimizer step (``on_optimizer_step``);
- **step, other**: the rest of each step (TRL's batching, logging, callbacks);
- **load** / **save** / **round, other**: the adapter into the model, the round's folder out, and the round's
  remaining bookkeeping.

Tokens per second for prefill, decode and training; the FLOP rate of each phase (2 FLOPs per weight of every
linear layer per token forward, 4 for forward + backward of a frozen base with LoRA: the weights' gradients are
not computed) against the peak this process measures for a large float32 matrix product on the same threads.
On a GPU (``--device cuda``) every time taken waits for the device first (``torch.cuda.synchronize``), and the
peak is a 4096³ matrix product in the model's dtype. ``--shape`` trains a random model of a real model's shapes
(``benchmarks/common.py``'s ``random_model``, the tiny tokenizer): what a GPU machine that reaches no model hub
can profile (``scripts/gpu_check.sh``).
Writes ``benchmarks/round/results/<name>.{md,json}`` (``benchmarks/common.py``'s shape).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.common import SHAPES, VOCAB, options, random_model, results_dir, start, write  # noqa: E402

CPU_PEAK = "float32 1024³ matrix product, same threads"  # (results written before the peak named itself)
PHASES = ("prefill", "decode", "generate_other", "reward", "forward", "backward", "optimizer", "step_other",
          "load", "save", "round_other")


class Clock:
    """Phase seconds and token counts, filled by forward hooks on the causal LM and a trainer callback."""

    def __init__(self, device: str = "cpu"):
        self.device = device
        self.cuda = device.startswith("cuda")
        self.s: dict[str, float] = defaultdict(float)
        self.n: dict[str, int] = defaultdict(int)
        self._t = 0.0
        self._depth = 0
        self._fwd_end = None
        self._step_start = None
        self._pre_opt = None

    def now(self) -> float:
        """Seconds, once the device has done what it was given (a GPU runs ahead of Python)."""
        if self.cuda:
            import torch

            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def pre_forward(self, module, args, kwargs):
        self._depth += 1
        if self._depth == 1:
            self._t = self.now()

    def post_forward(self, module, args, kwargs, output):
        import torch

        self._depth -= 1
        if self._depth:  # the body inside the causal LM's own call: counted there
            return
        dt = self.now() - self._t
        ids = kwargs.get("input_ids", args[0] if args else None)
        shape = tuple(ids.shape) if ids is not None else tuple(kwargs["inputs_embeds"].shape[:2])
        if torch.is_grad_enabled():
            self.s["forward"] += dt
            self.n["train_tokens"] += shape[0] * shape[1]
            self._fwd_end = self.now()
        elif shape[1] > 1:
            self.s["prefill"] += dt
            self.n["prefill_tokens"] += shape[0] * shape[1]
        else:
            self.s["decode"] += dt
            self.n["decode_slots"] += shape[0]  # sequences still in the batch (finished ones are padded)


def callback(clock: Clock):
    from transformers import TrainerCallback

    class Phases(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            clock._step_start = clock.now()

        def on_pre_optimizer_step(self, args, state, control, **kw):
            clock._pre_opt = clock.now()
            if clock._fwd_end is not None:
                clock.s["backward"] += clock._pre_opt - clock._fwd_end

        def on_optimizer_step(self, args, state, control, **kw):
            clock.s["optimizer"] += clock.now() - clock._pre_opt

        def on_step_end(self, args, state, control, **kw):
            clock.s["step_wall"] += clock.now() - clock._step_start
            clock.n["steps"] += 1

    return Phases()


def instrument(engine, clock: Clock) -> None:
    """Hooks on the engine's causal LM (generation and training both call its forward), on its body (prompt sharing
    calls the body alone for the prompts: ``hubgrpo.worker.sharing``) and on its trainer."""
    lm = engine.trainer.model.get_base_model()
    for module in (lm, getattr(lm, lm.base_model_prefix)):
        module.register_forward_pre_hook(clock.pre_forward, with_kwargs=True)
        module.register_forward_hook(clock.post_forward, with_kwargs=True)
    engine.trainer.add_callback(callback(clock))
    generate = engine.trainer._generate

    def counted(prompts):
        t = clock.now()
        out = generate(prompts)
        clock.s["generate_wall"] += clock.now() - t
        clock.n["completion_tokens"] += sum(map(len, out[1]))
        clock.n["completions"] += len(out[1])
        return out

    engine.trainer._generate = counted


def linear_weights(engine) -> int:
    """Weights of the base model's linear layers (the LM head included; LoRA factors not)."""
    import torch

    lm = engine.trainer.model.get_base_model()
    return sum(m.weight.numel() for name, m in lm.named_modules()
               if isinstance(m, torch.nn.Linear) and "lora_" not in name)


def peak_gflops(threads: int, device: str = "cpu", dtype=None) -> tuple[float, str]:
    """GFLOP/s of a large matrix product (best of 5) and what it was: float32 1024³ on ``threads`` CPU threads, or
    4096³ in ``dtype`` on a GPU."""
    import torch

    torch.set_num_threads(threads)
    cuda = device.startswith("cuda")
    n, dtype = (4096, dtype or torch.bfloat16) if cuda else (1024, torch.float32)
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))

    def product():
        a @ b
        if cuda:
            torch.cuda.synchronize(device)

    product()
    best = min(_timed(product) for _ in range(5))
    what = f"{str(dtype).removeprefix('torch.')} {n}³ matrix product, " + (device if cuda else "same threads")
    return 2 * n ** 3 / best / 1e9, what


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def lease(steps: int, i: int, prompts: int):
    from hubgrpo.layout import Lease

    now = time.time()
    return Lease(lease_id=f"profile{i}", run_id="profile", round_id=i, worker="profile", base_version=0,
                 base_sha="0" * 40, prompt_indices=list(range(i * prompts, (i + 1) * prompts)), steps=steps,
                 seed=i, issued_at=now, deadline=now + 3600)


def measure(args) -> dict:
    from hubgrpo.config import load_config
    from hubgrpo.worker.engine import RoundEngine

    with tempfile.TemporaryDirectory() as tmp:
        vocab = None if args.quick else VOCAB.get(args.shape or "")  # the real LM head and softmax
        shape = [f"base_model={random_model(args.shape, Path(tmp) / 'model', args.quick, vocab)}"] if args.shape else []
        cfg = load_config(ROOT / args.config, overrides=[*args.set, *shape, f"worker.threads={args.threads}",
                                                         f"worker.device={args.device}"])
        t0 = time.perf_counter()
        engine = RoundEngine(cfg, worker="profile")
        setup_s = time.perf_counter() - t0
        steps = cfg.rounds.steps
        prompts = max(1, cfg.params.per_device_train_batch_size // cfg.params.num_generations) * steps
        clock = Clock(engine.device)
        adapter = engine.init_adapter(Path(tmp) / "v0")
        engine.run_round(adapter, lease(steps, 0, prompts), Path(tmp) / "warm")  # warm-up: not counted
        instrument(engine, clock)
        totals = defaultdict(float)
        for i in range(1, args.rounds + 1):
            sub = engine.run_round(adapter, lease(steps, i, prompts), Path(tmp) / f"r{i}")
            for key in ("load", "save", "total", "reward"):
                totals[key] += sub.timings.get(key, 0.0)
    peak, peak_what = peak_gflops(args.threads, engine.device, engine.model.dtype)
    return {"setup_s": setup_s, "steps_per_round": steps, "clock_s": dict(clock.s), "counts": dict(clock.n),
            "round_s": dict(totals), "linear_weights": linear_weights(engine), "peak_gflops": peak,
            "peak": peak_what, "device": engine.device_name, "shape": args.shape, "config": args.config,
            "set": args.set}


def breakdown(m: dict) -> dict:
    """Seconds per step of each phase, and what is left over."""
    s, n, r = m["clock_s"], m["counts"], m["round_s"]
    steps = max(1, n.get("steps", 0))
    per = {"prefill": s.get("prefill", 0), "decode": s.get("decode", 0), "reward": r["reward"],
           "forward": s.get("forward", 0), "backward": s.get("backward", 0), "optimizer": s.get("optimizer", 0),
           "load": r["load"], "save": r["save"]}
    per["generate_other"] = s.get("generate_wall", 0) - per["prefill"] - per["decode"]
    per["step_other"] = s.get("step_wall", 0) - s.get("generate_wall", 0) - sum(
        per[k] for k in ("reward", "forward", "backward", "optimizer"))
    per["round_other"] = r["total"] - s.get("step_wall", 0) - per["load"] - per["save"]
    return {k: per[k] / steps for k in PHASES} | {"total": r["total"] / steps}


def rates(m: dict) -> dict:
    """Tokens per second and GFLOP/s of prefill, decode and training."""
    s, n, w = m["clock_s"], m["counts"], m["linear_weights"]
    out = {}
    parts = (("prefill", n.get("prefill_tokens", 0), 2), ("decode", n.get("decode_slots", 0), 2),
             ("training", n.get("train_tokens", 0), 4))
    for phase, tokens, flops_per in parts:
        sec = s.get("forward", 0) + s.get("backward", 0) if phase == "training" else s.get(phase, 0)
        gflops = flops_per * w * tokens / sec / 1e9 if sec else 0.0
        out[phase] = {"tokens": tokens, "seconds": sec, "tokens_per_s": tokens / sec if sec else 0.0,
                      "gflops": gflops, "of_peak": gflops / m["peak_gflops"]}
    out["generated_tokens_per_s"] = n.get("completion_tokens", 0) / max(1e-9, s.get("generate_wall", 0))
    return out


def to_markdown(m: dict, per: dict, rt: dict) -> str:
    total = per["total"]
    lines = ["# One worker step, taken apart", "",
             f"`{m['config']}` {' '.join(m['set'])}; {m['threads']} thread(s); {m['rounds']} rounds of "
             f"{m['steps_per_round']} step(s) after a warm-up"
             + (f"; on {m['device']}" if m.get("device") else "")
             + (f"; a random model of {m['shape']}'s shapes" if m.get("shape") else "")
             + f". Peak: {m['peak_gflops']:.1f} GFLOP/s ({m.get('peak', CPU_PEAK)}).",
             "", "| phase | s per step | share |", "|---|---|---|"]
    lines += [f"| {k} | {per[k]:.3f} | {per[k] / total:.0%} |" for k in PHASES]
    lines += [f"| **total** | **{total:.3f}** | |", "", "| part | tokens | s | tokens/s | GFLOP/s | of peak |",
              "|---|---|---|---|---|---|"]
    lines += [f"| {k} | {v['tokens']} | {v['seconds']:.2f} | {v['tokens_per_s']:.0f} | {v['gflops']:.1f} | "
              f"{v['of_peak']:.0%} |" for k, v in rt.items() if isinstance(v, dict)]
    lines += ["", f"Generated tokens per second (whole `_generate`): {rt['generated_tokens_per_s']:.1f}."]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="configs/demo.yaml")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--device", default="cpu", help="cpu, cuda (a GPU: every time taken after a synchronize)")
    ap.add_argument("--shape", choices=sorted(SHAPES), default=None,
                    help="a random model of these real shapes instead of the config's (a machine without the model)")
    ap.add_argument("--name", default="profile-step")
    options(ap, __file__)
    args = ap.parse_args()
    if args.quick:
        args.config, args.rounds = "configs/tiny.yaml", 2
    meta = start(args.quick)
    m = measure(args) | {"threads": args.threads, "rounds": args.rounds}
    per, rt = breakdown(m), rates(m)
    text = to_markdown(m, per, rt)
    gen = per["prefill"] + per["decode"] + per["generate_other"]
    write(results_dir(args, __file__), args.name, {"raw": m, "per_step_s": per, "rates": rt}, text, meta,
          f"{per['total']:.2f} s per step: generation {gen / per['total']:.0%}, forward + backward "
          f"{(per['forward'] + per['backward']) / per['total']:.0%}")
    print(text)


if __name__ == "__main__":
    main()
