"""What a GPU worker sampled, checked away from the GPU: do compiled and eager decoding sample the same tokens, and
does a CPU verifier accept the GPU's rounds?

``gpu_bench.py`` records, for each shape and decode mode, the keyed generation batches of its hubgrpo rounds (each
round starts from the version-0 adapter, whose LoRA B is 0, and generates before it trains, so the policy is the
random base model; round i samples with lease i's noise) and a hash of the random model's weights. Here:

- ``agreement``: for each shape measured in both modes, how many completions the two modes sampled identically
  and how far they agree (tokens before the first difference). The two paths compute the same model with other
  kernels (eager: a growing cache and prompt sharing; compiled: a static cache and the compiled step), and their
  rounding can flip a near tie, after which the completion goes its own way.
- ``--verify RESULT.json`` (on this CPU, after the GPU run): rebuilds each shape's random model (the same seed; its
  weights hash must match the GPU's), replays every recorded completion in float32 under the ``wide`` tolerance (a
  bfloat16 worker, the GPU's dtype) and the ``strict`` one (float32 workers only), and reports mismatches.

    python benchmarks/gpu/gpu_replay.py --verify benchmarks/gpu/results/gpu_bench.json [--name gpu-replay]
    python benchmarks/gpu/gpu_replay.py --noise --results DIR   # on the GPU machine: its keyed noise against its CPU's

The GPU sides generate with ``min_new_tokens`` = the completion length (every completion runs to the limit), so the
end-of-sequence tokens are masked at every completion position while generating; the replay masks them alike (a
hook on the output layer), as a verifier told of that setting would.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.common import options, results_dir, start, write  # noqa: E402


def keyed_record(engine, seed: int) -> dict:
    """The last round's keyed generation batches (``trainer.keyed_log``) with what a replay needs."""
    p = engine.params
    return {
        "seed": seed,
        "temperature": p["temperature"],
        "top_p": p["top_p"],
        "max_length": p["max_completion_length"],
        "stop": list(engine.trainer.eos_token_ids),
        "batches": [
            {"first": b.first, "prompt_ids": b.prompt_ids, "completion_ids": b.completion_ids}
            for b in engine.trainer.keyed_log or []
        ],
    }


def weights_sum(folder: Path) -> str:
    """sha256 over the model's tensors (name, dtype, shape, bytes), in name order: equal weights, equal hash."""
    import torch
    from safetensors.torch import load_file

    digest = hashlib.sha256()
    for path in sorted(Path(folder).glob("*.safetensors")):
        tensors = load_file(path)
        for name in sorted(tensors):
            t = tensors[name].contiguous()
            digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}".encode())
            digest.update(t.view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]


def _completions(records: list[dict], seeds: set[int]) -> list[list[int]]:
    return [c for r in records if r["seed"] in seeds for b in r["batches"] for c in b["completion_ids"]]


def agreement(rows: list[dict]) -> list[dict]:
    """Per shape with a compiled and an eager record: completions identical, and the mean share of each
    completion's tokens before the first difference."""
    out = []
    for shape in dict.fromkeys(r["shape"] for r in rows):
        rec = {r["decode"]: r["keyed"] for r in rows if r["shape"] == shape and r.get("keyed")}
        if {"compiled", "eager"} - set(rec):
            continue
        seeds = {r["seed"] for r in rec["compiled"]} & {r["seed"] for r in rec["eager"]}
        a, b = _completions(rec["compiled"], seeds), _completions(rec["eager"], seeds)
        prefix = []
        for x, y in zip(a, b):
            same = next((i for i, (s, t) in enumerate(zip(x, y)) if s != t), min(len(x), len(y)))
            prefix.append(same / max(len(x), len(y), 1))
        out.append(
            {
                "shape": shape,
                "completions": len(a),
                "identical": sum(x == y for x, y in zip(a, b)),
                "agreeing_share": round(sum(prefix) / max(len(prefix), 1), 4),
            }
        )
    return out


def agreement_lines(rows: list[dict]) -> list[str]:
    return [
        f"\n{r['shape']}: compiled and eager decoding, same adapter and noise: {r['identical']} of "
        f"{r['completions']} completions identical; on average {100 * r['agreeing_share']:.1f} % of a "
        "completion's tokens before the first difference"
        for r in rows
    ]


def replay(row: dict, tmp: Path, quick: bool = False) -> dict:
    """Rebuild ``row``'s random model here and replay its record under the wide and strict tolerances."""
    import torch

    from benchmarks.common import random_model
    from hubgrpo.proof.verify import STRICT, TOLERANCE, verify_completions
    from hubgrpo.worker.models import load_model

    folder = tmp / row["shape"]
    if not (folder / "config.json").exists():
        random_model(row["shape"], folder, quick, row["vocab_size"])
    out: dict = {
        "shape": row["shape"],
        "decode": row["decode"],
        "weights_match": weights_sum(folder) == row["weights_sum"],
    }
    if not out["weights_match"]:
        return out  # another model: a replay would say nothing
    model, tok = load_model(str(folder), device="cpu", dtype="float32")
    records = row["keyed"]
    eos = set(records[0]["stop"])
    masked = torch.tensor(sorted(eos))
    model.get_output_embeddings().register_forward_hook(  # min_new_tokens: no stop token could be chosen
        lambda module, args, logits: logits.index_fill(-1, masked.to(logits.device), float("-inf"))
    )
    for rule, tol in (("wide", TOLERANCE[torch.float32]), ("strict", STRICT)):
        total: dict = {
            "completions": 0,
            "tokens": 0,
            "mismatches": 0,
            "ambiguous": 0,
            "unended": 0,
            "seconds": 0.0,
            "failed_completions": 0,
        }
        for rec, b in [(rec, b) for rec in records for b in rec["batches"]]:
            n = len(b["completion_ids"])
            v = verify_completions(
                model.eval(),
                tok,
                b["prompt_ids"],
                b["completion_ids"],
                rec["seed"],
                range(b["first"], b["first"] + n),
                rec["temperature"],
                rec["top_p"],
                None,
                tol,
                stop=sorted(eos),
                max_length=rec["max_length"],
            )
            for k in ("completions", "tokens", "mismatches", "ambiguous", "unended", "seconds"):
                total[k] += getattr(v, k)
            total["failed_completions"] += sum(1 for m in v.per_completion if m)
        total["tokens_per_s"] = round(total["tokens"] / total["seconds"], 1) if total["seconds"] else None
        total["seconds"] = round(total["seconds"], 2)
        out[rule] = total
    return out


def noise_check(folder: Path, meta: dict) -> None:
    """The keyed noise on the GPU against the same noise on its CPU (``hubgrpo.proof.noise``): the 32-bit hashes
    must be equal bit for bit, the Gumbel values within float rounding of ``log``. Writes ``gpu-noise``."""
    import torch

    from hubgrpo.proof.noise import gumbel, hash_bits

    if not torch.cuda.is_available():  # (scripts/gpu_check.sh --device cpu checks the benchmark on a CPU)
        print("gpu_replay --noise: no CUDA device here, nothing to compare the CPU's noise with; skipped")
        return
    rows = torch.arange(64, dtype=torch.int64)
    positions = torch.arange(64, dtype=torch.int64) * 7
    out: dict = {"device": torch.cuda.get_device_name(0), "vocab": 151936, "rows": 64}
    for seed in (0, 2**40 + 3, -5):
        cpu_bits = hash_bits(seed, rows, positions, out["vocab"])
        gpu_bits = hash_bits(seed, rows.cuda(), positions.cuda(), out["vocab"]).cpu()
        g_cpu, g_gpu = (
            gumbel(seed, rows, positions, out["vocab"]),
            gumbel(seed, rows.cuda(), positions.cuda(), out["vocab"]).cpu(),
        )
        out[f"seed {seed}"] = {
            "hash_bits_equal": bool(torch.equal(cpu_bits, gpu_bits)),
            "gumbel_max_abs_difference": float((g_cpu - g_gpu).abs().max()),
        }
    head = "; ".join(
        f"{k}: hashes equal {v['hash_bits_equal']}, Gumbel within {v['gumbel_max_abs_difference']:.2e}"
        for k, v in out.items()
        if k.startswith("seed")
    )
    lines = [
        "# Keyed noise: GPU against CPU",
        "",
        f"{out['device']}, {out['rows']} rows × {out['vocab']} entries per seed.",
        "",
        head,
    ]
    write(folder, "gpu-noise", out, "\n".join(lines) + "\n", meta, head)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--verify", type=Path, help="gpu_bench.json of a GPU run")
    ap.add_argument("--noise", action="store_true", help="on a GPU machine: the keyed noise against the CPU's")
    ap.add_argument("--name", default="gpu-replay", help="result file name")
    options(ap, __file__)
    run = ap.parse_args()
    meta = start(run.quick)
    if run.noise:
        noise_check(results_dir(run, __file__), meta)
        return 0
    if run.verify is None:
        ap.error("give --verify RESULT.json (or --noise on a GPU machine)")
    bench = json.loads(run.verify.read_text())
    rows = [r for r in bench["shapes"] if r.get("keyed") and r.get("weights_sum")]
    report: dict = {"source": str(run.verify), "gpu": bench["environment"], "rows": []}
    with tempfile.TemporaryDirectory(prefix="hubgrpo-gpu-replay-") as tmp:
        for row in rows:
            report["rows"].append(replay(row, Path(tmp), bool(bench["meta"].get("quick"))))
    lines = [
        "# GPU rounds replayed by a CPU verifier",
        "",
        f"Rounds: {run.verify} (GPU: {report['gpu'].get('gpu')}, bfloat16 workers). Replay: float32 on this CPU.",
        "",
        "| shape | decode | weights match | rule | completions | tokens | mismatches | failed completions | tokens/s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        for rule in ("wide", "strict"):
            t = r.get(rule) or {}
            lines.append(
                f"| {r['shape']} | {r['decode']} | {r['weights_match']} | {rule} | {t.get('completions', '–')}"
                f" | {t.get('tokens', '–')} | {t.get('mismatches', '–')} | "
                f"{t.get('failed_completions', '–')} | {t.get('tokens_per_s', '–')} |"
            )
    lines += agreement_lines(bench.get("agreement") or [])
    head = (
        "; ".join(
            f"{r['shape']} {r['decode']}: wide {r['wide']['failed_completions']}/"
            f"{r['wide']['completions']} completions fail, strict {r['strict']['failed_completions']}"
            for r in report["rows"]
            if "wide" in r
        )
        or "nothing replayed"
    )
    write(results_dir(run, __file__), run.name, report, "\n".join(lines) + "\n", meta, head)
    return 0


if __name__ == "__main__":
    sys.exit(main())
