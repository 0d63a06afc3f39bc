"""What three generation mechanisms save on a plain ``generate`` call on this machine: more completions per call
(what TRL's ``steps_per_generation`` does: one call for several steps), the LoRA adapter merged into the base
weights while generating (PEFT's ``merge_adapter`` / ``unmerge_adapter``), and a bfloat16 base model (the adapter
kept in float32). A worker's own generation also shares each prompt's prefill across its group and samples with
the round's key (``hubgrpo.worker.sharing``, ``keyed``); neither is here, so the prompts weigh more than in a
worker's step, and a larger call also has more distinct prompts (and padding) than one step's.

    .venv/bin/python benchmarks/round/generate_options.py [--config configs/demo.yaml] [--threads 1] [--repeats 5]
        [--name generate-options] [--quick] [--results DIR]

A ``RoundEngine`` (what ``hubgrpo worker`` trains with) loads the config's model with its LoRA adapter; its PEFT
model generates for the config's prompts (chat template, left padding), ``num_generations`` completions per
prompt, every completion exactly ``max_completion_length`` tokens (``min_new_tokens``: equal work in every arm),
sampled at the config's temperature. Each arm: one warm-up call, then ``--repeats`` timed calls; the median. Arms:

- **rows R**: one call for R/num_generations prompts (R = one step's batch, 2× and 4× it);
- **merged**: one step's batch with the adapter merged before the call and unmerged after (both timed);
- **bfloat16**: one step's batch on a second engine with ``worker.dtype: bfloat16``.

Writes ``benchmarks/round/results/<name>.{md,json}`` (``benchmarks/common.py``'s shape).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.common import options, results_dir, start, write  # noqa: E402


def engine_for(args, dtype: str):
    from hubgrpo.config import load_config
    from hubgrpo.worker.engine import RoundEngine

    cfg = load_config(ROOT / args.config, overrides=[f"worker.threads={args.threads}", "worker.device=cpu",
                                                     f"worker.dtype={dtype}"])
    return cfg, RoundEngine(cfg, worker="generate-options")


def batch(engine, cfg, prompts: int):
    """Left-padded token ids of ``prompts`` prompts, each repeated ``num_generations`` times."""
    tok = engine.tokenizer
    rows = engine.prompt_rows(range(prompts))
    texts = [tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False)
             if isinstance(r["prompt"], list) else r["prompt"] for r in rows]
    texts = [t for t in texts for _ in range(cfg.params.num_generations)]
    tok.padding_side = "left"
    return tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)


def timed(call, repeats: int) -> float:
    call()  # warm-up
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        call()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def generate_call(engine, cfg, enc, merged: bool = False):
    import torch

    model = engine.trainer.model
    n = cfg.params.max_completion_length
    pad = engine.tokenizer.pad_token_id

    def call():
        if merged:
            model.merge_adapter()
        with torch.no_grad():
            model.generate(**enc, do_sample=True, temperature=cfg.params.temperature, top_k=0, top_p=1.0,
                           max_new_tokens=n, min_new_tokens=n, pad_token_id=pad)
        if merged:
            model.unmerge_adapter()

    return call


def measure(args) -> dict:
    cfg, engine = engine_for(args, "float32")
    per_step = max(1, cfg.params.per_device_train_batch_size // cfg.params.num_generations)
    arms = []
    for factor in (1, 2, 4):
        enc = batch(engine, cfg, per_step * factor)
        s = timed(generate_call(engine, cfg, enc), args.repeats)
        arms.append({"arm": f"rows {len(enc['input_ids'])}", "rows": len(enc["input_ids"]), "s": s})
    enc = batch(engine, cfg, per_step)
    s = timed(generate_call(engine, cfg, enc, merged=True), args.repeats)
    arms.append({"arm": "merged", "rows": len(enc["input_ids"]), "s": s})
    del engine
    cfg16, engine16 = engine_for(args, "bfloat16")
    s = timed(generate_call(engine16, cfg16, batch(engine16, cfg16, per_step)), args.repeats)
    arms.append({"arm": "bfloat16", "rows": len(enc["input_ids"]), "s": s})
    tokens = cfg.params.max_completion_length
    for a in arms:
        a["s_per_completion"] = a["s"] / a["rows"]
        a["tokens_per_s"] = a["rows"] * tokens / a["s"]
    return {"config": args.config, "threads": args.threads, "repeats": args.repeats, "tokens": tokens,
            "prompt_tokens": int(enc["attention_mask"].sum(dim=1).float().mean()), "arms": arms}


def to_markdown(m: dict) -> str:
    base = m["arms"][0]
    lines = [
        "# Generation options on this CPU (plain `generate`: no prompt sharing, no keyed sampling)",
        "",
        f"`{m['config']}`, {m['threads']} thread(s); every completion {m['tokens']} tokens after prompts of "
        f"~{m['prompt_tokens']} tokens; median of {m['repeats']} calls after a warm-up.",
        "",
        "| arm | completions per call | s per call | s per completion | against one step's batch | tokens/s |",
        "|---|---|---|---|---|---|",
    ]
    for a in m["arms"]:
        rel = a["s_per_completion"] / base["s_per_completion"]
        lines.append(f"| {a['arm']} | {a['rows']} | {a['s']:.3f} | {a['s_per_completion']:.4f} | {rel:.2f}× | "
                     f"{a['tokens_per_s']:.0f} |")
    return "\n".join(lines) + "\n"


def headline(m: dict) -> str:
    base, by = m["arms"][0], {a["arm"]: a for a in m["arms"]}
    two = m["arms"][1]

    def rel(a):
        return a["s_per_completion"] / base["s_per_completion"]

    return (f"per completion against one step's batch ({base['rows']}): {two['rows']} per call "
            f"{rel(two):.2f}×, adapter merged {rel(by['merged']):.2f}×, bfloat16 {rel(by['bfloat16']):.2f}×")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="configs/demo.yaml")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--name", default="generate-options")
    options(ap, __file__)
    args = ap.parse_args()
    if args.quick:
        args.config, args.repeats = "configs/tiny.yaml", 1
    meta = start(args.quick)
    m = measure(args)
    text = to_markdown(m)
    write(results_dir(args, __file__), args.name, m, text, meta, headline(m))
    print(text)


if __name__ == "__main__":
    main()
