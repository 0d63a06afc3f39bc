"""Proof of rollouts (``hubgrpo.proof``): do honest rounds pass, are forged ones caught, and what does the check cost?

    python benchmarks/proof/proof_bench.py [--rounds 1000] [--attack-rounds 100] [--threads 1,2]
    python benchmarks/proof/proof_bench.py --quick   # the script checked: a few rounds of each kind

The model is the built-in tiny one, sharpened (``tests/support/proof_support.py``: its output embeddings × 10, so
its next-token distributions are as peaked as a real LM's; the random tiny model is near uniform, and there the
noise alone picks the tokens), with a non-zero adapter as the leased version. A round is 8 prompts × 4
completions of up to 8 tokens, sampled with keyed Gumbel-max (``hubgrpo.proof.sampling.generate_keyed``: the
processor and ``generate`` call the worker's trainer makes; ``tests/unit/test_proof_worker.py`` replays the
trainer's own rounds), each round with its own lease seed and prompts.

- **Honest rounds**: a float32 worker at each ``--threads`` count; every completion of the round replayed by a
  bfloat16 verifier and (every 10th group) a float32 verifier, one thread each. A false alarm is a round that fails
  the verifier's rule (``hubgrpo.proof.verify.RULES``) on its ≤ 10 % sample; the whole round's replay, and any
  mismatch at all, are reported as stricter readings. Also the largest float32 gap (top perturbed score − runner-up)
  at a position where float32 and bfloat16 pick different tokens: above the tolerance, an honest token mismatches.
- **Forged rounds**, per attack kind (``proof_support.ATTACKS``, and ``older_by_one_step``: generated with the
  adapter one GRPO step before the lease's): the completions a verifier replays are chosen after submission
  (``hubgrpo.proof.selection``: HMAC of the round's digest, ≤ 10 % of its completion tokens); caught when the
  round fails the verifier's rule.
- **Cost**: one real training round of the engine (2 GRPO steps, 16 completions) against replaying its ≤ 10 %
  sample; tokens checked per second.

Writes results/<name>.{md,json} (default proof).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.common import options, results_dir, start, write  # noqa: E402

PROMPTS, GROUP = 8, 4  # a round: PROMPTS prompts × GROUP completions
PER_ROUND = PROMPTS * GROUP
ROUNDS_PER_CALL = 8  # rounds sampled in one generate call and replayed in one forward pass
EXTRA_EVERY = 10  # every so many groups: the float32 verifier too, and the flip gaps
SECRET = b"proof-bench-coordinator-secret!!"


def setup():
    """(engine, leased adapter state, the state one GRPO step before it, version 0's state)."""
    import torch

    from hubgrpo.worker.engine import RoundEngine
    from tests.support.models_fixture import tiny_config
    from tests.support.proof_support import adapter_state, sharpen

    engine = RoundEngine(tiny_config(["worker.threads=1"]))
    sharpen(engine.model)
    version0 = adapter_state(engine.trainer.model)
    torch.manual_seed(1)
    for name, p in engine.trainer.model.named_parameters():
        if "lora_B" in name:
            p.data.normal_(0, 0.5)
    before = adapter_state(engine.trainer.model)
    engine.train_steps(engine.prompt_rows(range(8)), 1, seed=3)
    return engine, adapter_state(engine.trainer.model), before, version0


def group_batch(engine, model, g: int, threads: int, honest: bool = True):
    """Group ``g`` of ``ROUNDS_PER_CALL`` rounds: its seed, rows and (``honest``) completions from a float32 worker
    at ``threads`` threads. Round ``k`` of the group is completions ``[k × PER_ROUND, (k + 1) × PER_ROUND)``."""
    import torch

    from hubgrpo.worker.keyed import KeyedBatch
    from tests.support.proof_support import prompt_ids, sample

    n = PROMPTS * ROUNDS_PER_CALL
    rows = engine.prompt_rows([(g * n + i) % len(engine.source) for i in range(n)])
    prompts = [p for p in prompt_ids(engine, rows) for _ in range(GROUP)]
    torch.set_num_threads(threads)
    seed = 1_000_003 * (g + 1)
    batch = KeyedBatch(0, prompts, [])
    if honest:
        batch.completion_ids = sample(model, engine, batch, seed)
    return seed, rows, batch


def verify(model, engine, batch, seed, indices=None):
    """Replay the completions ``indices`` (default: all) of ``batch`` in one forward pass, on one thread."""
    import torch

    from hubgrpo.proof.verify import verify_completions

    torch.set_num_threads(1)
    picked = list(range(len(batch.completion_ids))) if indices is None else list(indices)
    p = engine.params
    verdict = verify_completions(
        model,
        engine.tokenizer,
        [batch.prompt_ids[i] for i in picked],
        [batch.completion_ids[i] for i in picked],
        seed,
        [batch.first + i for i in picked],
        p["temperature"],
        p["top_p"],
        None,
    )
    return verdict, picked


def per_round(verdict, picked: list[int]) -> list[int]:
    """Mismatches of each round of a group, from a verdict over the completions ``picked``."""
    out = [0] * ROUNDS_PER_CALL
    for i, m in zip(picked, verdict.per_completion):
        out[i // PER_ROUND] += m
    return out


def honest(engine, state, rounds: int, threads: list[int]) -> list[dict]:
    import torch

    from tests.support.proof_support import SHARP, verifier

    worker = verifier(engine, state, scale=SHARP)
    half, exact = verifier(engine, state, torch.bfloat16, SHARP), verifier(engine, state, scale=SHARP)
    out = []
    for t in threads:
        row = {
            "worker_threads": t,
            "rounds": 0,
            "bf16": _tally(),
            "fp32": _tally(),
            "max_flip_gap": 0.0,
            "flips": 0,
            "positions_compared": 0,
        }
        for g in range(-(-rounds // ROUNDS_PER_CALL)):
            seed, _, batch = group_batch(engine, worker, g, t)
            checks = [("bf16", half)] + ([("fp32", exact)] if g % EXTRA_EVERY == 0 else [])
            sample = sampled(batch.completion_ids)
            for name, model in checks:
                v, picked = verify(model, engine, batch, seed)
                _add(row[name], v, per_round(v, picked), per_round(_only(v, sample), sample))
            if g % EXTRA_EVERY == 0:
                gap, flips, n = flip_gaps(engine, exact, half, batch, seed)
                row["max_flip_gap"] = max(row["max_flip_gap"], gap)
                row["flips"], row["positions_compared"] = row["flips"] + flips, row["positions_compared"] + n
            row["rounds"] += ROUNDS_PER_CALL
        out.append(row)
        print("honest", json.dumps(row), flush=True)
    return out


def flip_gaps(engine, exact, half, batch, seed) -> tuple[float, int, int]:
    """(the largest float32 gap — top perturbed score − runner-up — at a position where bfloat16 picks another
    token, how many such positions, positions compared): a tolerance above that gap never mismatches an honest
    token for the precision difference."""
    import torch

    from hubgrpo.proof.noise import gumbel
    from hubgrpo.proof.sampling import Warp
    from hubgrpo.proof.verify import completion_logits, teacher_batch

    ids, mask, length = teacher_batch(batch.prompt_ids, batch.completion_ids, engine.tokenizer.pad_token_id)
    valid = torch.arange(length)[None, :] < torch.tensor([len(c) for c in batch.completion_ids])[:, None]
    rows, cols = valid.nonzero(as_tuple=True)
    p = engine.params
    warp = Warp(p["temperature"], None, p["top_p"])
    picks = []
    for model in (exact, half):
        scores = completion_logits(model, ids, mask, length)[rows, cols]
        picks.append(warp.apply(scores) + gumbel(seed, rows + batch.first, cols, scores.size(-1)))
    top = picks[0].topk(2, dim=-1).values
    flips = picks[0].argmax(-1) != picks[1].argmax(-1)
    gap = float((top[:, 0] - top[:, 1])[flips].max()) if bool(flips.any()) else 0.0
    return gap, int(flips.sum()), int(rows.numel())


def _tally() -> dict:
    return {
        "rounds": 0,
        "false_alarms": 0,
        "false_alarms_any_mismatch": 0,
        "whole_false_alarms": 0,
        "whole_false_alarms_any_mismatch": 0,
        "tokens": 0,
        "checked": 0,
        "ambiguous": 0,
        "mismatches": 0,
        "seconds": 0.0,
    }


def _only(verdict, picked: list[int]):
    """The verdict restricted to the completions ``picked`` (its per-completion mismatches, in that order)."""
    return type(verdict)(per_completion=[verdict.per_completion[i] for i in picked], precision=verdict.precision)


def _add(t: dict, v, whole: list[int], sample: list[int]) -> None:
    """Tally a group: ``whole`` / ``sample``: each round's mismatches over all its completions / its ≤ 10 % sample.
    ``false_alarms``: sampled rounds failing the verifier's rule (``RULES``); ``…_any_mismatch``: rule 0."""
    from hubgrpo.proof.verify import RULES

    allowed = RULES[v.precision].max_mismatches
    t["rounds"] += len(whole)
    t["false_alarms"] += sum(m > allowed for m in sample)
    t["false_alarms_any_mismatch"] += sum(m > 0 for m in sample)
    t["whole_false_alarms"] += sum(m > allowed for m in whole)
    t["whole_false_alarms_any_mismatch"] += sum(m > 0 for m in whole)
    for k in ("tokens", "checked", "ambiguous", "mismatches"):
        t[k] += getattr(v, k)
    t["seconds"] += v.seconds


def digest(completions) -> bytes:
    return hashlib.sha256(json.dumps(completions).encode()).digest()


def sampled(completions: list[list[int]]) -> list[int]:
    """Each round's ≤ 10 % sample, chosen from the round's own digest and the coordinator's secret."""
    from hubgrpo.proof.selection import choose, selection_key

    picked = []
    for k in range(ROUNDS_PER_CALL):
        part = completions[k * PER_ROUND : (k + 1) * PER_ROUND]
        key = selection_key(SECRET, digest(part))
        picked += [k * PER_ROUND + i for i in choose([len(c) for c in part], key)]
    return picked


def attacks(engine, leased, before, version0, rounds: int) -> list[dict]:
    import torch

    from hubgrpo.proof.verify import RULES
    from hubgrpo.worker.keyed import KeyedBatch
    from tests.support.proof_support import ATTACKS, SHARP, Forgery, forge, verifier

    half, exact = verifier(engine, leased, torch.bfloat16, SHARP), verifier(engine, leased, scale=SHARP)
    f = Forgery(engine, KeyedBatch(0, [], []), 0, leased, version0, [], SHARP, {"leased": exact})
    out = []
    for kind in (*ATTACKS, "older_by_one_step"):
        row = {
            "attack": kind,
            "rounds": 0,
            "caught_bf16": 0,
            "caught_fp32": 0,
            "caught_bf16_any_mismatch": 0,
            "fewest_mismatches_bf16": None,
            "tokens": 0,
            "checked_tokens": 0,
        }
        for g in range(-(-rounds // ROUNDS_PER_CALL)):
            seed, rows, batch = group_batch(engine, exact, 10_000 + g, 1, honest=kind in ("edited", "truncated"))
            f.batch, f.seed, f.rows = batch, seed, rows
            if kind == "older_by_one_step":
                g_forged = Forgery(engine, batch, seed, leased, before, rows, SHARP, {"older": f.model("b", before)})
                forged = forge("older_adapter", g_forged)
            else:
                forged = forge(kind, f)
            forged_batch = KeyedBatch(0, batch.prompt_ids, forged)
            picked = sampled(forged)
            row["tokens"] += sum(map(len, forged))
            row["checked_tokens"] += sum(len(forged[i]) for i in picked)
            for name, model in (("bf16", half), ("fp32", exact)):
                v, _ = verify(model, engine, forged_batch, seed, picked)
                counts = per_round(v, picked)
                row[f"caught_{name}"] += sum(m > RULES[v.precision].max_mismatches for m in counts)
                if name == "bf16":
                    row["caught_bf16_any_mismatch"] += sum(m > 0 for m in counts)
                    before_min = row["fewest_mismatches_bf16"]
                    row["fewest_mismatches_bf16"] = min(counts) if before_min is None else min(before_min, *counts)
            row["rounds"] += ROUNDS_PER_CALL
        out.append(row)
        print("attack", json.dumps(row), flush=True)
    return out


def cost(engine, leased) -> dict:
    """A real training round (the config's steps_per_round) against replaying its ≤ 10 % sample, each generation
    batch with the adapter it was sampled from (bf16 and fp32 verifiers, one thread, model loading left out)."""
    import torch
    from peft import set_peft_model_state_dict

    from hubgrpo.proof.selection import choose, selection_key
    from tests.support.proof_support import SHARP, record_round, verifier

    torch.set_num_threads(1)
    set_peft_model_state_dict(engine.trainer.model, leased)
    steps = engine.cfg.rounds.steps
    t0 = time.perf_counter()
    log, states = record_round(engine, engine.prompt_rows(range(8)), steps, 11)
    train_s = time.perf_counter() - t0
    everything = [c for b in log for c in b.completion_ids]
    picked = set(choose([len(c) for c in everything], selection_key(SECRET, digest(everything))))
    out = {"steps": steps, "train_s": train_s, "completion_tokens": sum(map(len, everything))}
    for name, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
        seconds, tokens = 0.0, 0
        for batch, state in zip(log, states):
            mine = [i - batch.first for i in picked if batch.first <= i < batch.first + len(batch.completion_ids)]
            if mine:
                v, _ = verify(verifier(engine, state, dtype, SHARP), engine, batch, 11, mine)
                seconds, tokens = seconds + v.seconds, tokens + v.tokens
        out[name] = {
            "verify_s": seconds,
            "tokens_checked": tokens,
            "tokens_per_s": tokens / seconds,
            "share_of_training": seconds / train_s,
        }
    return out


def markdown(res: dict) -> str:
    a, tol, rules = res["args"], res["tolerance"], res["rules"]
    lines = [
        f"# Proof of rollouts: {res['headline']}",
        "",
        f"Tiny model sharpened (output embeddings × {res['sharp']}), rounds of {PROMPTS} prompts × {GROUP} "
        f"completions of ≤ 8 tokens, {ROUNDS_PER_CALL} rounds per generate call (each round its own completion "
        f"indices); tolerance bf16 {tol['bf16']}, fp32 {tol['fp32']}; a round fails when its sample has more "
        f"than {rules['bf16']} mismatch(es) (bf16 verifier) or {rules['fp32']} (fp32 verifier). Honest rounds: "
        "every completion replayed, and the ≤ 10 % sample the coordinator would pick judged from it (the "
        f"float32 verifier every {EXTRA_EVERY}th group); forged rounds: the sample only.",
        "",
        "| worker threads | verifier | honest rounds | false alarms (sample, rule) | (sample, any mismatch) | "
        "(whole round, rule) | (whole round, any mismatch) | tokens | ambiguous (skipped) | mismatches | "
        "s per 1,000 tokens |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for h in res["honest"]:
        for name in ("bf16", "fp32"):
            t = h[name]
            lines.append(
                f"| {h['worker_threads']} | {name} | {t['rounds']} | {t['false_alarms']} | "
                f"{t['false_alarms_any_mismatch']} | {t['whole_false_alarms']} | "
                f"{t['whole_false_alarms_any_mismatch']} | {t['tokens']} | "
                f"{t['ambiguous'] / max(1, t['tokens']):.1%} | {t['mismatches']} | "
                f"{1000 * t['seconds'] / max(1, t['tokens']):.2f} |"
            )
    flips = "; ".join(
        f"{h['worker_threads']} thread(s): {h['flips']} of {h['positions_compared']} positions, "
        f"largest float32 gap there {h['max_flip_gap']:.3f}"
        for h in res["honest"]
    )
    lines += [
        "",
        f"Where float32 and bfloat16 pick different tokens: {flips} (a gap above the bf16 tolerance is a "
        "mismatch an honest round can show).",
        "",
        f"Forged rounds ({a['attack_rounds']} per kind):",
        "",
        "| attack | caught, bf16 verifier (rule) | bf16, any mismatch | caught, fp32 verifier | fewest "
        "mismatches in a sample (bf16) | tokens checked |",
        "|---|---|---|---|---|---|",
    ]
    for r in res["attacks"]:
        n = max(1, r["rounds"])
        lines.append(
            f"| {r['attack']} | {r['caught_bf16'] / n:.1%} | {r['caught_bf16_any_mismatch'] / n:.1%} | "
            f"{r['caught_fp32'] / n:.1%} | {r['fewest_mismatches_bf16']} | "
            f"{r['checked_tokens'] / max(1, r['tokens']):.1%} |"
        )
    c = res["cost"]
    lines += [
        "",
        f"Cost: a {c['steps']}-step training round took {c['train_s']:.2f} s ({c['completion_tokens']} "
        "completion tokens); replaying its ≤ 10 % sample (one thread, model loading left out):",
        "",
        "| verifier | s | share of training | tokens/s |",
        "|---|---|---|---|",
    ]
    for name in ("bf16", "fp32"):
        v = c[name]
        lines.append(f"| {name} | {v['verify_s']:.3f} | {v['share_of_training']:.1%} | {v['tokens_per_s']:.0f} |")
    return "\n".join(lines)


def headline(res: dict) -> str:
    alarms = sum(h["bf16"]["false_alarms"] for h in res["honest"])
    rounds = sum(h["bf16"]["rounds"] for h in res["honest"])
    worst = min(res["attacks"], key=lambda r: r["caught_bf16"] / max(1, r["rounds"]))
    share = res["cost"]["bf16"]["share_of_training"]
    return (
        f"tiny (sharpened): {alarms} false alarms in {rounds} honest rounds (fp32 worker, bf16 verifier, "
        f"≤ 10 % sample); every forgery caught in ≥ {worst['caught_bf16'] / max(1, worst['rounds']):.0%} of "
        f"{worst['rounds']} rounds (weakest: {worst['attack']}); verification {share:.1%} of a round's training"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    options(ap, __file__)
    ap.add_argument("--rounds", type=int, default=1000, help="honest rounds per thread count")
    ap.add_argument("--attack-rounds", type=int, default=100, help="forged rounds per attack kind")
    ap.add_argument("--threads", default="1,2", help="worker thread counts")
    ap.add_argument("--name", default="proof")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.attack_rounds, args.threads = ROUNDS_PER_CALL, ROUNDS_PER_CALL, "1"
    meta = start(args.quick)
    import torch

    from hubgrpo.proof.verify import RULES, default_tolerance
    from tests.support.proof_support import SHARP

    engine, leased, before, version0 = setup()
    res = {
        "args": vars(args) | {"results": str(args.results)},
        "sharp": SHARP,
        "tolerance": {"bf16": default_tolerance(torch.bfloat16), "fp32": default_tolerance(torch.float32)},
        "rules": {"bf16": RULES["bfloat16"].max_mismatches, "fp32": RULES["float32"].max_mismatches},
    }
    res["attacks"] = attacks(engine, leased, before, version0, args.attack_rounds)
    res["cost"] = cost(engine, leased)
    print("cost", json.dumps(res["cost"]), flush=True)
    res["honest"] = honest(engine, leased, args.rounds, [int(t) for t in args.threads.split(",")])
    res["headline"] = headline(res)
    write(results_dir(args, __file__), args.name, res, markdown(res), meta, res["headline"])


if __name__ == "__main__":
    main()
