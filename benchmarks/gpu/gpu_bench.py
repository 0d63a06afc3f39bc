"""GPU benchmark: a hubgrpo worker's rounds against a bare TRL ``GRPOTrainer`` with the same settings, same model
shapes and same completion lengths; seconds per step, generated tokens per second and peak GPU memory.

    python benchmarks/gpu/gpu_bench.py [--device cuda] [--shapes smollm2,qwen0.5b] [--warmup 2] [--steps 4]
        [--steps-per-round N] [--budget-s 420] [--results DIR]
    python benchmarks/gpu/gpu_bench.py --device cpu --quick   # the script checked on any machine, in seconds

Needs nothing from outside the repository: each shape is a random model of the real one's shapes and vocabulary
(SmolLM2-135M: Llama, 30 layers, vocabulary 49152; Qwen2.5-0.5B: Qwen2, 24 layers, vocabulary 151936) with the
built-in tiny tokenizer (ids past its 320 tokens decode to nothing). The settings are ``configs/demo.yaml``'s (LoRA
r 16 / alpha 32 on all linear layers, beta 0, DAPO loss, temperature 1.0, 4 completions per prompt) with 16
completions per step of 128 tokens on ``--device``, bfloat16 on a GPU that has it (the worker's ``dtype: auto``).
For each shape, each side guarded (a failure is recorded and the rest still runs):

1. **hubgrpo**: a ``RoundEngine`` (what ``hubgrpo worker`` trains with) runs rounds of ``--steps-per-round`` steps
   (default: the recipe's, 1) from the version-0 adapter: ``--warmup`` steps, then ``--steps`` measured ones. A
   worker's step is a round's wall clock (adapter in, train, adapter and rollouts out) over its steps; the
   trainer's own step (``on_step_begin`` to ``on_step_end``) is recorded beside it. The recipe's merge (ffa)
   trains LoRA B only, so the worker has about half TRL's trainable parameters (the "trainable M" column).
2. **TRL**: a plain ``GRPOTrainer`` on the same random model (loaded as the worker loads it), given a PEFT
   ``LoraConfig`` of the same r / alpha / dropout / targets, a ``GRPOConfig`` with the config's GRPO settings
   (batch, group, lengths, sampling, loss, learning rate, bf16; activation checkpointing off as the worker has it:
   TRL's default is on) and a trivial reward; one ``train()`` of ``--warmup`` + ``--steps`` steps, timed by the
   same callback. The GRPOConfig fields in which the two trainers still differ are listed in the result.
3. **ratio**: hubgrpo's worker step over TRL's step.

Random weights rarely sample an end-of-sequence token, but one would end a completion early on one side only:
both trainers get ``min_new_tokens = max_completion_length`` (set on TRL's generation config after construction),
so every completion has exactly 128 tokens on both sides. GPU timings synchronise the device at each step's ends.
``--budget-s`` bounds the run: a part that would start later is skipped and recorded, a side stops measuring once
past it; the result files are rewritten after every part, so a run killed from outside keeps what it measured.
Writes ``gpu_bench.json`` and ``gpu_bench.md`` into ``--results`` (default ``benchmarks/gpu/results``).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing (e.g. a bare GPU machine)

from benchmarks.common import VOCAB, options, random_model, results_dir, start, write  # noqa: E402
from benchmarks.gpu.gpu_replay import agreement, agreement_lines, keyed_record, weights_sum  # noqa: E402
from benchmarks.gpu.gpu_smoke import environment, lease, run_part  # noqa: E402

SHAPE_NAMES = {"smollm2": "smollm2-135m", "qwen0.5b": "qwen2.5-0.5b"}  # --shapes: short name → common.SHAPES
# GRPOConfig fields the TRL side takes from the config's params, as the worker's engine does
SAME = ("learning_rate", "lr_scheduler_type", "warmup_steps", "weight_decay", "max_grad_norm",
        "per_device_train_batch_size", "gradient_accumulation_steps", "num_generations", "max_completion_length",
        "temperature", "top_p", "beta", "epsilon", "epsilon_high", "loss_type", "scale_rewards", "num_iterations",
        "mask_truncated_completions", "seed")
NOT_SETTINGS = {"output_dir", "logging_dir", "run_name", "max_steps", "hub_token"}  # left out of the comparison


def bench_config(base_model: str, device: str, quick: bool, steps_per_round: int | None, decode: str = "eager"):
    """configs/demo.yaml on ``base_model``: 16 completions per step of 128 tokens (16 tokens with ``quick``),
    generation decoded as ``decode`` (``worker.decode``)."""
    from hubgrpo.config import load_config

    sets = [f"base_model={base_model}", f"worker.device={device}", "params.per_device_train_batch_size=16",
            f"params.max_completion_length={16 if quick else 128}", f"worker.decode={decode}"]
    if steps_per_round:
        sets.append(f"rounds.steps={steps_per_round}")
    return load_config(ROOT / "configs" / "demo.yaml", overrides=sets)


def meter(cuda: bool, deadline: float | None = None, keep: int = 1):
    """A TrainerCallback that times every optimizer step and, through ``attach``, the generation inside it and the
    completion tokens it produced. Past ``deadline`` (if any) it asks the trainer to stop after the step, once it
    has timed ``keep`` steps."""
    import torch
    from transformers import TrainerCallback

    class Meter(TrainerCallback):
        def __init__(self):
            self.steps: list[dict] = []
            self._t, self._gen, self._tokens = 0.0, 0.0, 0

        def _now(self) -> float:
            if cuda:
                torch.cuda.synchronize()
            return time.perf_counter()

        def on_step_begin(self, args, state, control, **kw):
            self._t, self._gen, self._tokens = self._now(), 0.0, 0

        def on_step_end(self, args, state, control, **kw):
            self.steps.append({"s": self._now() - self._t, "generate_s": self._gen, "tokens": self._tokens})
            if deadline is not None and len(self.steps) >= keep and time.perf_counter() > deadline:
                control.should_training_stop = True

        def attach(self, trainer, length: int) -> None:
            """Time ``trainer._generate`` and force every completion to ``length`` tokens."""
            from hubgrpo.proof import sampling

            # a worker refuses min_new_tokens (the verifier does not replay it); here the replay (gpu_replay.py)
            # masks the stop tokens alike, as a verifier told of the setting would: this benchmark allows it
            sampling.PROCESSED.pop("min_new_tokens", None)
            trainer.generation_config.min_new_tokens = length
            if isinstance(getattr(trainer, "generation_kwargs", None), dict):  # TRL overrides the model's with it
                trainer.generation_kwargs["min_new_tokens"] = length
            generate = trainer._generate

            def metered(prompts, *a, **kw):
                t = time.perf_counter()
                out = generate(prompts, *a, **kw)
                self._gen += time.perf_counter() - t
                self._tokens += sum(map(len, out[1]))  # (prompt_ids, completion_ids, ...)
                return out

            setattr(trainer, "_generate", metered)  # TRL calls self._generate(prompts)
            trainer.add_callback(self)

    return Meter()


def summary(steps: list[dict], walls: list[float] | None = None) -> dict:
    """Seconds per step (median), generation seconds per step, generated tokens per second of the steps' wall
    clock (``walls``: the worker's rounds, when they are the clock) and of generation alone."""
    wall = sum(walls) if walls is not None else sum(s["s"] for s in steps)
    tokens, gen = sum(s["tokens"] for s in steps), sum(s["generate_s"] for s in steps)
    return {"measured_steps": len(steps), "trainer_s_per_step": round(statistics.median(s["s"] for s in steps), 3),
            "generate_s_per_step": round(gen / len(steps), 3), "completion_tokens": tokens,
            "tokens_per_s": round(tokens / wall, 1), "generate_tokens_per_s": round(tokens / gen, 1) if gen else None}


def _peak(cuda: bool) -> int | None:
    import torch

    return round(torch.cuda.max_memory_allocated() / 2**20) if cuda else None


def _fresh(cuda: bool) -> None:
    """Memory freed and the compiled code forgotten (``torch._dynamo.reset``): each part compiles as a fresh worker
    process would (inductor's on-disk cache of kernels stays, as it does between a machine's processes)."""
    import torch

    torch._dynamo.reset()
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def hubgrpo_side(cfg, run: argparse.Namespace, tmp: Path, out: dict) -> dict:
    """RoundEngine rounds: warm-up then measured; a worker's step is a round's wall clock over its steps."""
    from hubgrpo.worker.engine import RoundEngine

    cuda = run.device.startswith("cuda")
    _fresh(cuda)
    t0 = time.perf_counter()
    engine = RoundEngine(cfg, worker="bench")
    setup_s = time.perf_counter() - t0
    m = meter(cuda)  # the budget is checked between rounds: a round is never cut short
    m.attach(engine.trainer, cfg.params.max_completion_length)
    out["grpo_args"] = engine.trainer.args.to_dict()
    spr = cfg.rounds.steps
    per_round = cfg.params.per_device_train_batch_size // cfg.params.num_generations * spr
    warm, measured = -(-run.warmup // spr), -(-run.steps // spr)  # whole rounds
    adapter, walls, rounds = engine.init_adapter(tmp / "v0"), [], []  # rounds: every round's seconds
    for i in range(warm + measured):
        if i >= warm and walls and time.perf_counter() > run.deadline:
            break
        t = time.perf_counter()
        engine.run_round(adapter, lease(spr, i, per_round), tmp / f"r{i}")
        wall = time.perf_counter() - t  # save_adapter copied the weights back: the device is idle
        rounds.append(round(wall, 3))
        if i >= warm:
            walls.append(wall)
        # every round starts from the version-0 adapter and generates before it trains: the same policy and noise
        # (lease i's) for every decode mode
        out.setdefault("keyed", []).append(keyed_record(engine, seed=i))
    steps = m.steps[warm * spr:]
    result = {"s_per_step": round(statistics.median(w / spr for w in walls), 3), **summary(steps, walls),
              "steps_per_round": spr, "rounds": len(walls), "round_s": rounds, "setup_s": round(setup_s, 2),
              "peak_gpu_mib": _peak(cuda),
              "params_m": round(sum(p.numel() for p in engine.trainer.model.parameters()) / 1e6, 1),
              "trainable_m": round(sum(p.numel() for p in engine.trainer.model.parameters()
                                       if p.requires_grad) / 1e6, 2)}
    del engine
    return result


def length_reward(completions, **kwargs) -> list[float]:
    """The TRL side's trivial reward: the completion's length in characters, over 100."""
    return [len(c if isinstance(c, str) else c[-1]["content"]) / 100 for c in completions]


def trl_args(cfg, run: argparse.Namespace, output_dir: str, dtype):
    """A GRPOConfig with the config's GRPO settings and TRL's defaults for the rest (activation checkpointing off,
    as the worker; no reports, checkpoints or progress bar)."""
    import torch
    from trl import GRPOConfig

    cuda = run.device.startswith("cuda")
    return GRPOConfig(output_dir=output_dir, max_steps=run.warmup + run.steps, use_cpu=not cuda,
                      bf16=cuda and dtype == torch.bfloat16, fp16=cuda and dtype == torch.float16,
                      activation_checkpointing=False, report_to="none", save_strategy="no", disable_tqdm=True,
                      **{k: getattr(cfg.params, k) for k in SAME})


def trl_side(cfg, run: argparse.Namespace, tmp: Path, out: dict) -> dict:
    """A bare GRPOTrainer with a PEFT LoraConfig on the same model and prompts; one train() of warm-up + measured
    steps."""
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast
    from trl import GRPOTrainer

    from hubgrpo.task.data import PromptSource
    from hubgrpo.worker.decode import compile_decoding
    from hubgrpo.worker.models import resolve_dtype

    cuda = run.device.startswith("cuda")
    _fresh(cuda)
    t0 = time.perf_counter()
    dtype = resolve_dtype(cfg.worker.dtype, run.device)
    model = AutoModelForCausalLM.from_pretrained(cfg.base_model, dtype=dtype).to(run.device)
    tok = PreTrainedTokenizerFast.from_pretrained(cfg.base_model)
    prompts = cfg.params.per_device_train_batch_size // cfg.params.num_generations * (run.warmup + run.steps)
    rows = [{"prompt": r["prompt"]} for r in PromptSource.from_config(cfg).rows(range(prompts))]
    lc = cfg.lora
    lora = LoraConfig(r=lc.r, lora_alpha=lc.alpha, lora_dropout=lc.dropout, target_modules=lc.target_modules,
                      use_rslora=lc.use_rslora, task_type="CAUSAL_LM")
    args = trl_args(cfg, run, str(tmp / "trl"), dtype)
    trainer = GRPOTrainer(model=model, reward_funcs=length_reward, args=args, train_dataset=Dataset.from_list(rows),
                          processing_class=tok, peft_config=lora)
    if cfg.worker.decode == "compiled":  # the same generation settings as the worker's
        compile_decoding(trainer, (cfg.params.max_prompt_length or 0) + cfg.params.max_completion_length)
    m = meter(cuda, run.deadline, keep=run.warmup + 1)
    m.attach(trainer, cfg.params.max_completion_length)
    out["grpo_args"] = trainer.args.to_dict()
    setup_s = time.perf_counter() - t0
    trainer.train()
    steps = m.steps[run.warmup:]
    result = {"s_per_step": round(statistics.median(s["s"] for s in steps), 3), **summary(steps),
              "step_s": [round(s["s"], 3) for s in m.steps],
              "setup_s": round(setup_s, 2), "peak_gpu_mib": _peak(cuda),
              "trainable_m": round(sum(p.numel() for p in trainer.model.parameters() if p.requires_grad) / 1e6, 2)}
    del trainer, model
    return result


def differences(a: dict, b: dict) -> dict:
    """GRPOConfig fields (as ``to_dict``) in which the two trainers differ: {field: [hubgrpo, trl]}."""
    return {k: [a.get(k), b.get(k)] for k in sorted(set(a) | set(b))
            if k not in NOT_SETTINGS and a.get(k) != b.get(k)}


def compile_counts() -> dict:
    """torch's running counts of compiled graphs and of calls that skipped CUDA graphs (a part's difference says
    whether its decoding compiled once and replayed graphs, or recompiled / fell back)."""
    from torch._dynamo.utils import counters

    return {"graphs": counters["stats"]["unique_graphs"], "cudagraph_skips": counters["inductor"]["cudagraph_skips"]}


def one_shape(row: dict, run: argparse.Namespace, tmp: Path, save) -> dict:
    """Both sides on one shape's random model (built once) into ``row``, each side guarded; their ratio and the
    settings in which they differ. ``save()`` after each side."""
    name, decode = row["shape"], row["decode"]
    row["vocab_size"] = None if run.quick else VOCAB[name]
    folder = tmp / name
    digest = tmp / f"{name}.weights_sum"
    if not digest.exists():  # one random model per shape, shared by the decode modes
        random_model(name, folder, run.quick, row["vocab_size"])
        digest.write_text(weights_sum(folder))  # a CPU verifier rebuilds the same model (gpu_replay.py)
    row["weights_sum"] = digest.read_text()
    cfg = bench_config(str(folder), run.device, run.quick, run.steps_per_round, decode)
    if decode == "eager":  # eager steps are long on a GPU: fewer of them
        run = argparse.Namespace(**{**vars(run), "warmup": run.eager_warmup, "steps": run.eager_steps})
    seen: dict[str, dict] = {"hubgrpo": {}, "trl": {}}
    for side, fn in (("hubgrpo", hubgrpo_side), ("trl", trl_side)):
        if time.perf_counter() > run.deadline:
            row[side] = {"ok": False, "error": f"skipped: past the {run.budget_s:.0f}-s budget"}
        else:
            before = compile_counts()
            row[side] = run_part(f"{name} {decode} {side}", lambda fn=fn, side=side: fn(
                cfg, run, tmp / f"{name}-{decode}-{side}", seen[side]))
            row[side]["compile"] = {k: v - before[k] for k, v in compile_counts().items()}
        if seen["hubgrpo"].get("keyed"):  # the rounds' completions: saved with the first side, for agreement
            row["keyed"] = seen["hubgrpo"]["keyed"]
        save()
    length = cfg.params.per_device_train_batch_size * cfg.params.max_completion_length
    for side in ("hubgrpo", "trl"):  # every completion ran to the limit: both sides generated the same tokens
        if row[side]["ok"]:
            row[side]["full_length"] = row[side]["completion_tokens"] == length * row[side]["measured_steps"]
    if row["hubgrpo"]["ok"] and row["trl"]["ok"]:
        row["ratio"] = round(row["hubgrpo"]["s_per_step"] / row["trl"]["s_per_step"], 3)
        row["trainer_ratio"] = round(row["hubgrpo"]["trainer_s_per_step"] / row["trl"]["trainer_s_per_step"], 3)
    if seen["hubgrpo"].get("grpo_args") and seen["trl"].get("grpo_args"):
        row["settings_differ"] = differences(seen["hubgrpo"]["grpo_args"], seen["trl"]["grpo_args"])
    return row


def label(row: dict, sep: str = " | ") -> str:
    """A row's shape and decode mode, as table cells (or words)."""
    return f"{row['shape']}{sep}{row.get('decode', 'eager')}"


def _cell(side: dict, key: str):
    return "–" if side.get(key) is None else side[key]


def markdown(report: dict) -> str:
    env, s = report["environment"], report["settings"]
    lines = ["# GPU benchmark: a hubgrpo worker against a bare TRL GRPOTrainer", "",
             "Environment: " + ", ".join(f"{k} {v}" for k, v in env.items()), "",
             f"{s['completions_per_step']} completions per step ({s['num_generations']} per prompt), every one "
             f"{s['max_completion_length']} tokens (min_new_tokens on both sides); {s['warmup']} warm-up step(s), "
             f"then {s['steps']} measured ({s.get('eager_warmup', s['warmup'])} and {s.get('eager_steps', s['steps'])} "
             "when eager; decode: worker.decode, TRL's generation set alike); "
             f"hubgrpo in rounds of {s['steps_per_round']} step(s). s/step: the median; "
             "hubgrpo's is a round's wall clock over its steps, the trainer's is on_step_begin to on_step_end.", "",
             "| shape | decode | side | s/step | trainer s/step | generate s/step | generated tok/s | "
             "tok/s in generate | peak GPU MiB | trainable M | setup s | hubgrpo / TRL |", "|---" * 12 + "|"]
    for row in report["shapes"]:
        for side in ("hubgrpo", "trl"):
            r = row.get(side) or {"ok": False, "error": "not run"}
            ratio = row.get("ratio", "–") if side == "hubgrpo" else ""
            if not r["ok"]:
                lines.append(f"| {label(row)} | {side} | failed: {r['error'][:200]} ||||||||{ratio} |")
                continue
            lines.append(f"| {label(row)} | {side} | {r['s_per_step']} | {r['trainer_s_per_step']} | "
                         f"{r['generate_s_per_step']} | {r['tokens_per_s']} | {r['generate_tokens_per_s']} | "
                         f"{_cell(r, 'peak_gpu_mib')} | {r['trainable_m']} | {r['setup_s']} | {ratio} |")
    for row in report["shapes"]:
        full = [f"{side} {'yes' if row[side]['full_length'] else 'NO'}" for side in ("hubgrpo", "trl")
                if "full_length" in (row.get(side) or {})]
        if full:
            lines += ["", f"{label(row, ' ')}: every completion {s['max_completion_length']} tokens: {', '.join(full)}"]
        counts = [f"{side} {row[side]['compile']['graphs']} graph(s), {row[side]['compile']['cudagraph_skips']} "
                  "CUDA-graph skip(s)" for side in ("hubgrpo", "trl") if "compile" in (row.get(side) or {})]
        if counts and row.get("decode") == "compiled":
            lines += ["", f"{label(row, ' ')}: compiled: {', '.join(counts)}"]
        if row.get("settings_differ") is not None:
            diff = ", ".join(f"{k} {v[0]!r} / {v[1]!r}" for k, v in row["settings_differ"].items())
            lines += ["", f"{label(row, ' ')}: GRPOConfig fields that differ (hubgrpo / TRL): {diff or 'none'}"]
    lines += agreement_lines(report.get("agreement") or [])
    return "\n".join(lines) + "\n"


def headline(report: dict) -> str:
    parts = []
    for row in report["shapes"]:
        h, t = row.get("hubgrpo") or {}, row.get("trl") or {}
        if h.get("ok") and t.get("ok") and "ratio" in row:
            peak = f", peak {h['peak_gpu_mib']} MiB" if h["peak_gpu_mib"] is not None else ""
            parts.append(f"{label(row, ' ')} hubgrpo {h['s_per_step']} s/step against TRL {t['s_per_step']} "
                         f"({row['ratio']}×), {h['tokens_per_s']} generated tok/s{peak}")
        else:
            said = {k: "ok" if x.get("ok") else "failed" if x else "not run" for k, x in (("hubgrpo", h), ("trl", t))}
            parts.append(f"{label(row, ' ')}: " + "; ".join(f"{k} {v}" for k, v in said.items()))
    s = report["settings"]
    where = report["environment"].get("gpu", report["environment"]["device"])
    return f"{where}, {s['completions_per_step']} × {s['max_completion_length']} tokens: " + "; ".join(parts)


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--shapes", default="smollm2,qwen0.5b", help=f"comma-separated: {', '.join(SHAPE_NAMES)}")
    ap.add_argument("--warmup", type=int, default=2, help="warm-up steps per side (not measured)")
    ap.add_argument("--steps", type=int, default=4, help="measured steps per side")
    ap.add_argument("--steps-per-round", type=int, default=None, help="hubgrpo's round length (default: the "
                    "config's, the recipe's 1)")
    ap.add_argument("--decode", default="compiled,eager", help="worker.decode modes, in this order (both sides "
                    "decode alike: TRL gets the static cache and compiling too)")
    ap.add_argument("--eager-warmup", type=int, default=1, help="warm-up steps of an eager part")
    ap.add_argument("--eager-steps", type=int, default=1, help="measured steps of an eager part")
    ap.add_argument("--budget-s", type=float, default=420, help="no part starts, and no side measures on, past "
                    "this many seconds from the start")
    options(ap, __file__)  # --quick: tiny shapes, 1 warm-up + 1 measured step, 16-token completions
    run = ap.parse_args()
    if run.quick:
        run.warmup, run.steps = min(run.warmup, 1), min(run.steps, 1)
    unknown = [s for s in run.shapes.split(",") if s not in SHAPE_NAMES and s not in SHAPE_NAMES.values()]
    if unknown:
        ap.error(f"unknown shape(s) {unknown}: use {', '.join(SHAPE_NAMES)}")
    run.shapes = [SHAPE_NAMES.get(s, s) for s in run.shapes.split(",")]
    run.decode = run.decode.split(",")
    if not set(run.decode) <= {"compiled", "eager"}:
        ap.error(f"--decode {run.decode}: use compiled, eager or both")
    if run.quick:
        run.eager_warmup, run.eager_steps = min(run.eager_warmup, 1), min(run.eager_steps, 1)
    run.deadline = time.perf_counter() + run.budget_s
    return run


def main() -> int:
    run = parse()
    meta = start(run.quick)
    import torch

    for limit in ("recompile_limit", "cache_size_limit"):  # one process measures several models: each compiles
        if hasattr(torch._dynamo.config, limit):
            setattr(torch._dynamo.config, limit, 64)
    if run.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_bench: no CUDA device here (run it on a GPU machine, or pass --device cpu --quick)", file=sys.stderr)
        return 2
    cfg = bench_config("builtin:tiny", run.device, run.quick, run.steps_per_round)  # the settings, for the report
    report: dict = {"environment": environment(run.device), "settings": {
        "config": "configs/demo.yaml", "completions_per_step": cfg.params.per_device_train_batch_size,
        "num_generations": cfg.params.num_generations, "max_completion_length": cfg.params.max_completion_length,
        "warmup": run.warmup, "steps": run.steps, "steps_per_round": cfg.rounds.steps, "decode": run.decode,
        "eager_warmup": run.eager_warmup, "eager_steps": run.eager_steps,
        "budget_s": run.budget_s, "lora": cfg.lora.model_dump(), "loss_type": cfg.params.loss_type,
        "beta": cfg.params.beta, "temperature": cfg.params.temperature,
        "full_length": "min_new_tokens = max_completion_length on both sides"}, "shapes": []}
    folder = results_dir(run, __file__)

    def save() -> None:
        report["agreement"] = agreement(report["shapes"])
        write(folder, "gpu_bench", report, markdown(report), meta, headline(report))

    with tempfile.TemporaryDirectory(prefix="hubgrpo-gpu-bench-") as tmp:
        for name, decode in [(n, d) for n in run.shapes for d in run.decode]:  # shape by shape, compiled first
            row: dict = {"shape": name, "decode": decode}
            report["shapes"].append(row)
            if time.perf_counter() > run.deadline:
                row["hubgrpo"] = row["trl"] = {"ok": False, "error": f"skipped: past the {run.budget_s:.0f}-s budget"}
                continue
            failed = run_part(name, lambda row=row: one_shape(row, run, Path(tmp), save))
            if not failed["ok"]:  # the model or config could not be built: a side that did not run has its error
                row.setdefault("hubgrpo", failed)
                row.setdefault("trl", failed)
            save()
    print(markdown(report))
    return 0 if all(r.get("hubgrpo", {}).get("ok") and r.get("trl", {}).get("ok") for r in report["shapes"]) else 1


if __name__ == "__main__":
    sys.exit(main())
