"""Proof of rollouts on a real model, across worker and verifier precisions: false alarms, catch rates, cost.

    python benchmarks/proof/proof_model.py [--model smollm2] [--rounds 256] [--pairs fp32/fp32,bf16/fp32]
    python benchmarks/proof/proof_model.py --quick   # the tiny model, a few rounds: the script checked

A round has the shape of the model's config (SmolLM2-135M: ``configs/demo.yaml``, 2 prompts × 4 completions of
≤ 12 tokens; tiny: ``configs/tiny.yaml``, sharpened as in ``proof_bench.py``). The verifier's sample of such a round
is one completion (``hubgrpo.proof.selection.choose`` takes at least one; a second one only when it fits the 10 %
budget): its verdict is the verdict on that completion. So each simulated round here is its checked completion:
sampled with keyed Gumbel-max by the worker (``generate_keyed``, the processor the worker's trainer uses) and
replayed by the verifier; the completions the verifier does not read are not generated. ``--per-call`` completions
share a generate call and a seed, each with its own completion index. Another shape (``--set``, e.g. longer
completions in bigger rounds) has room for more than one checked completion in the budget: ``--checked N`` makes
each simulated round N of them (a round fails when any of them does). The leased version is the adapter after
``--steps`` real GRPO steps from version 0 (the older adapters: version 0, and one step before the lease's;
after 3 steps no checked token of version 0 differs from the lease's: ``--steps 40`` puts a real distance between them).

- **Honest rounds**, per worker/verifier precision pair and worker thread count (the verifier: one thread): the
  deficit of every recorded token (the replay's top perturbed score minus the recorded token's: 0 where the replay
  picks it), so any tolerance can be read off; a false alarm is a round whose largest deficit exceeds the
  tolerance, or whose completion does not end where generation ends (``hubgrpo.proof.verify.endings``).
- **Forged rounds** per attack kind (``tests/support/proof_support.ATTACKS`` and ``older_by_one_step``), replayed by
  a float32 verifier: caught when the verifier's rule fails it at the tolerance; ``differs``: rounds whose checked
  completion is not the honest one at all (a forgery that equals the honest completion cannot be caught by anyone).
- **Cost**: one real training round of the config against replaying its sample (``verify_completions``, one
  thread, float32), in CPU seconds of this process; tokens checked per CPU second.

Writes results/<name>.{md,json} (default proof-<model>).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.common import TINY, options, results_dir, start, write  # noqa: E402

CONFIGS = {"smollm2": "configs/demo.yaml", "tiny": TINY}
STEPS = 3  # GRPO steps from version 0 to the leased version (default of --steps)
ABSOLUTE = (1e-3, 0.03, 0.1, 0.2, 0.3, 0.5)  # false alarms and catch rates are read at each tolerance
RELATIVE = (0.005, 0.01, 0.02, 0.03, 0.04, 0.05)  # (1e-3 + this × the position's largest |warped score|)
DTYPES = {"fp32": "float32", "bf16": "bfloat16"}


@dataclass
class Bench:
    """The model under test, its adapters (states) and the models built from them, by name."""

    engine: object
    states: dict
    scale: float = 1.0
    models: dict = field(default_factory=dict)
    name: str = "smollm2"  # the model's key in CONFIGS, and the config overrides (a child process rebuilds it)
    overrides: tuple[str, ...] = ()

    @property
    def params(self) -> dict:
        return self.engine.params  # type: ignore[attr-defined]

    def model(self, state: str, dtype: str = "float32"):
        """Base + adapter ``state`` in ``dtype``, eval mode (built once)."""
        import torch

        from tests.support.proof_support import verifier

        key = (state, dtype)
        if key not in self.models:
            self.models[key] = verifier(self.engine, self.states[state], getattr(torch, dtype), self.scale)
        return self.models[key]


def setup(name: str, steps: int = STEPS, overrides: tuple[str, ...] = ()) -> Bench:
    """The engine of the model's config with ``overrides`` (one thread), and the adapters: version 0, the leased
    one, one step before."""
    import torch

    from hubgrpo.config import load_config
    from hubgrpo.worker.engine import RoundEngine
    from tests.support.proof_support import SHARP, adapter_state, sharpen

    engine = RoundEngine(load_config(ROOT / CONFIGS[name], overrides=[*overrides, "worker.threads=1"]), worker="w")
    scale = SHARP if name == "tiny" else 1.0
    if scale != 1.0:
        sharpen(engine.model, scale)
    states = {"version0": adapter_state(engine.trainer.model)}
    if name == "tiny":  # B = 0 at version 0 and tiny steps move little: make the adapter matter
        torch.manual_seed(1)
        for n, p in engine.trainer.model.named_parameters():
            if "lora_B" in n:
                p.data.normal_(0, 0.5)
    torch.set_num_threads(1)
    for step in range(steps):
        if step == steps - 1:
            states["before"] = adapter_state(engine.trainer.model)
        rows = [(step * 8 + i) % len(engine.source) for i in range(8)]  # type: ignore[attr-defined]
        engine.train_steps(engine.prompt_rows(rows), 1, seed=3 + step)
    states["leased"] = adapter_state(engine.trainer.model)
    return Bench(engine, states, scale, name=name, overrides=overrides)


def call_rounds(b: Bench, g: int, per_call: int) -> tuple[int, list[dict], list[list[int]]]:
    """Call ``g``: its seed, and for each of its rounds the prompt row and prompt ids of the checked completion."""
    from tests.support.proof_support import prompt_ids

    source = len(b.engine.source)  # type: ignore[attr-defined]
    rows = b.engine.prompt_rows([(g * per_call + i) % source for i in range(per_call)])  # type: ignore[attr-defined]
    return 1_000_003 * (g + 1), rows, prompt_ids(b.engine, rows)


def sample(b: Bench, model, prompts, seed: int, temperature_scale: float = 1.0) -> list[list[int]]:
    from hubgrpo.proof.sampling import Warp, generate_keyed

    p = b.params
    return generate_keyed(
        model,
        prompts,
        seed=seed,
        warp=Warp(p["temperature"] * temperature_scale, None, p["top_p"]),
        max_new_tokens=p["max_completion_length"],
        eos_token_id=b.engine.trainer.eos_token_ids,  # type: ignore[attr-defined]
        pad_token_id=b.engine.tokenizer.pad_token_id,  # type: ignore[attr-defined]
    )


def deficits(b: Bench, model, prompts, completions, seed: int) -> list[list[tuple[float, float]]]:
    """Each completion's positive deficits under ``model`` as (deficit, the position's largest |warped score|),
    largest first (inf: a token outside the vocabulary or masked, or a completion that does not end where
    generation ends); one thread."""
    import torch

    from hubgrpo.proof.sampling import Warp
    from hubgrpo.proof.verify import completion_logits, endings, replay, teacher_batch

    torch.set_num_threads(1)
    p = b.params
    ids, mask, length = teacher_batch(prompts, completions, b.engine.tokenizer.pad_token_id)  # type: ignore[attr-defined]
    valid = torch.arange(length)[None, :] < torch.tensor([len(c) for c in completions])[:, None]
    rows, cols = valid.nonzero(as_tuple=True)
    scores = completion_logits(model, ids, mask, length)[rows, cols]
    warp = Warp(p["temperature"], None, p["top_p"])
    _, _, deficit = replay(scores, ids[:, -length:][rows, cols], seed, rows, cols, warp, float("inf"))
    scale = warp.apply(scores).nan_to_num(neginf=0.0, posinf=0.0).abs().amax(-1)
    ended = endings(completions, b.engine.trainer.eos_token_ids, p["max_completion_length"])  # type: ignore[attr-defined]
    out: list[list[tuple[float, float]]] = [[] if e else [(float("inf"), 0.0)] for e in ended]
    for r, d, m in zip(rows.tolist(), deficit.tolist(), scale.tolist()):
        if d > 0:
            out[r].append((round(d, 5), round(m, 3)))
    return [sorted(d, reverse=True) for d in out]


def settings() -> dict:
    """The tolerances read off, by label: absolute ones, relative ones, and the product's two (``wide``,
    ``strict``)."""
    from hubgrpo.proof.verify import Tolerance, run_tolerance

    out = {f"{a}": Tolerance(a) for a in ABSOLUTE}
    out |= {f"1e-3+{r}×max": Tolerance(1e-3, r) for r in RELATIVE}
    # the product's two rules (coordinator.verify_tolerance): ``wide`` (bfloat16 or float32 workers), ``strict``
    # (float32 workers; the default)
    return out | {"wide": run_tolerance("wide"), "strict": run_tolerance("strict")}


def fails(found: list[tuple[float, float]], tol) -> bool:
    return any(d > tol.absolute + tol.relative * m for d, m in found)


def count(found: list[list[tuple[float, float]]]) -> dict:
    """How many completions each tolerance fails."""
    return {k: sum(fails(f, tol) for f in found) for k, tol in settings().items()}


def grouped(per_completion: list, checked: int) -> list:
    """Per-completion lists joined into rounds of ``checked`` consecutive completions (a round's checked sample)."""
    return [sum(per_completion[i:i + checked], []) for i in range(0, len(per_completion), checked)]


def honest(b: Bench, rounds: int, per_call: int, worker: str, checker: str, threads: int, checked: int = 1) -> dict:
    """False alarms of honest rounds of ``checked`` checked completions: a ``worker``-precision worker at
    ``threads`` threads, a ``checker``-precision verifier on one thread. A worker spec ending in ``-other``
    (``fp32-other``) samples in a child process whose kernels round as another CPU's would (``other_cpu``)."""
    import torch

    from benchmarks.proof.other_cpu import ENV, SUFFIX, sample_elsewhere

    found: list[list[tuple[float, float]]] = []
    tokens, t0 = 0, time.perf_counter()
    dtype, elsewhere = DTYPES[worker.removesuffix(SUFFIX)], worker.endswith(SUFFIX)
    calls = [call_rounds(b, g, per_call) for g in range(-(-rounds * checked // per_call))]
    child = sample_elsewhere(b, dtype, threads, [(s, p) for s, _, p in calls]) if elsewhere else {}
    for g, (seed, _, prompts) in enumerate(calls):
        torch.set_num_threads(threads)
        completions = child["completions"][g] if child else sample(b, b.model("leased", dtype), prompts, seed)
        found += deficits(b, b.model("leased", DTYPES[checker]), prompts, completions, seed)
        tokens += sum(map(len, completions))
    found = grouped(found, checked)
    return {"worker": worker, "verifier": checker, "worker_threads": threads, "rounds": len(found),
            "worker_kernels": (" ".join(f"{k}={v}" for k, v in ENV.items()) + f" (torch CPU capability "
                               f"{child['capability']}; against this process's kernels, a float32 matrix product "
                               f"differs by up to {child['probe']['matmul']:.1e}, a softmax by "
                               f"{child['probe']['softmax']:.1e})") if child else "this process's",
            "tokens": tokens, "seconds": time.perf_counter() - t0,
            "largest_deficit": max((f[0][0] for f in found if f), default=0.0),
            "largest_ratio": max((d / m for f in found for d, m in f if m), default=0.0),
            "false_alarms": count(found), "deficits_above_0": sum(map(bool, found)), "deficits": found}


def forge(b: Bench, kind: str, prompts, rows, seed: int, honest_ids) -> list[list[int]]:
    """The checked completions an attacker of ``kind`` submits (``honest_ids``: the honest ones)."""
    from hubgrpo.worker.keyed import KeyedBatch
    from tests.support.proof_support import Forgery, copied_answers, edited, truncated

    tok, eos = b.engine.tokenizer, b.engine.trainer.eos_token_ids  # type: ignore[attr-defined]
    if kind == "copied":
        return copied_answers(Forgery(b.engine, KeyedBatch(0, prompts, []), seed, {}, {}, rows))  # type: ignore[arg-type]
    if kind == "edited":
        return edited(honest_ids, len(tok), seed=seed)
    if kind == "truncated":
        return truncated(honest_ids, eos)
    if kind == "other_model":
        from tests.support.proof_support import other_tiny_model, sharpen

        if ("other_model", "") not in b.models:
            b.models[("other_model", "")] = other_tiny_model()
            sharpen(b.models[("other_model", "")], b.scale)
        other = b.models[("other_model", "")]
        vocab = other.get_input_embeddings().num_embeddings
        return sample(b, other, [[t % vocab for t in ids] for ids in prompts], seed)
    if kind == "forged_noise":
        return sample(b, b.model("leased"), prompts, seed + 1)
    if kind == "temperature":
        return sample(b, b.model("leased"), prompts, seed, 0.5)
    state = {"older_adapter": "version0", "older_by_one_step": "before", "other_adapter": "other"}[kind]
    return sample(b, b.model(state), prompts, seed)


def attack(b: Bench, kind: str, rounds: int, per_call: int, tolerance, cache: dict, checked: int = 1) -> dict:
    """Catch rates of one attack kind against a float32 verifier (``caught_of_differing``: at ``tolerance``), on
    rounds of ``checked`` checked completions; ``cache``: the honest completions of each call, shared by the kinds."""
    from tests.support.proof_support import random_adapter

    b.states.setdefault("other", random_adapter(b.states["leased"], seed=99, scale=_other_scale(b)))
    row = {"attack": kind, "rounds": 0, "differs": 0, "caught_of_differing": 0, "tokens": 0, "deficits": []}
    for g in range(-(-rounds * checked // per_call)):
        seed, rows, prompts = call_rounds(b, 10_000 + g, per_call)
        if g not in cache:
            cache[g] = sample(b, b.model("leased"), prompts, seed)
        forged = forge(b, kind, prompts, rows, seed, cache[g])
        found = grouped(deficits(b, b.model("leased"), prompts, forged, seed), checked)
        changed = [f != h for f, h in zip(forged, cache[g])]
        differs = [any(changed[i:i + checked]) for i in range(0, len(changed), checked)]
        row["deficits"] += found
        row["rounds"] += len(found)
        row["differs"] += sum(differs)
        row["caught_of_differing"] += sum(fails(f, tolerance) for f, d in zip(found, differs) if d)
        row["tokens"] += sum(map(len, forged))
    row["caught"] = count(row["deficits"])
    return row


def _other_scale(b: Bench) -> float:
    """A different adapter: random B factors of the leased adapter's size (tiny: the bench's 0.5)."""
    import torch

    bs = [v for k, v in b.states["leased"].items() if "lora_B" in k]
    return float(torch.cat([v.flatten() for v in bs]).std()) if b.scale == 1.0 else 0.5


def cost(b: Bench) -> dict:
    """A real training round of the config (one thread) against replaying its sample as the product's verifier
    does (batch 0, ``choose`` at the 10 % budget, ``verify_completions`` in float32 on one thread)."""
    import hashlib

    import torch
    from peft import set_peft_model_state_dict

    from hubgrpo.proof.selection import choose, selection_key
    from hubgrpo.proof.verify import verify_completions
    from tests.support.proof_support import record_round, verifier

    torch.set_num_threads(1)
    e, p = b.engine, b.params
    set_peft_model_state_dict(e.trainer.model, b.states["leased"])  # type: ignore[attr-defined]
    prompts = p["per_device_train_batch_size"] * p["gradient_accumulation_steps"] // p["num_generations"]
    steps = e.cfg.rounds.steps  # type: ignore[attr-defined]
    t0 = time.process_time()  # CPU time: another job on the machine slows the wall clock, not this
    log, states = record_round(e, e.prompt_rows(range(prompts * steps)), steps, 11)
    train_s = time.process_time() - t0
    batch = log[0]
    tokens = sum(len(c) for c in batch.completion_ids)
    key = selection_key(b"proof-model-bench-secret-32bytes", hashlib.sha256(repr(batch).encode()).digest())
    picked = choose([len(c) for c in batch.completion_ids], key)
    model = verifier(e, states[0], scale=b.scale)
    t0 = time.process_time()
    v = verify_completions(model, e.tokenizer, [batch.prompt_ids[i] for i in picked],  # type: ignore[attr-defined]
                           [batch.completion_ids[i] for i in picked], 11, picked, p["temperature"], p["top_p"],
                           stop=e.trainer.eos_token_ids, max_length=p["max_completion_length"])  # type: ignore[attr-defined]
    verify_s = time.process_time() - t0
    assert v.passes(), v
    return {"steps": steps, "train_s": train_s, "round_tokens": tokens, "completions": len(batch.completion_ids),
            "checked_completions": len(picked), "tokens_checked": v.tokens, "share_of_tokens": v.tokens / tokens,
            "verify_s": verify_s, "tokens_per_s": v.tokens / verify_s, "share_of_training": verify_s / train_s}


def recount(res: dict) -> None:
    """The counts at every tolerance, from the stored deficits (so a result can be read at today's default)."""
    for row in res["honest"]:
        row["false_alarms"] = count([[tuple(x) for x in f] for f in row["deficits"]])
    for row in res["attacks"]:
        row["caught"] = count([[tuple(x) for x in f] for f in row["deficits"]])
        # a forged round whose checked completion is the honest one has the honest deficits, all 0 (a float32
        # worker and verifier in one process), so no tolerance fails it: the rounds caught are rounds that differ
        row["caught_of_differing"] = row["caught"]["wide"]


def _sets(a: dict) -> str:
    return "".join(f" `--set {o}`" for o in a.get("overrides") or [])


def _label(tol: dict) -> str:
    return f"{tol['absolute']:g} + {tol['relative']:g} × max |warped score|"


def markdown(res: dict) -> str:
    from dataclasses import asdict

    from hubgrpo.proof.verify import run_tolerance

    a, tol, keys = res["args"], _label(res["tolerance"]), list(settings())
    lines = [f"# Proof of rollouts on {res['model']}: {res['headline']}", "",
             f"`{CONFIGS[a['model']]}`{_sets(a)} rounds ({res['shape']}), each simulated round its "
             f"{a.get('checked', 1)} checked completion(s) "
             f"(module docstring); {a['per_call']} completions per generate call; leased version: "
             f"{a.get('steps', STEPS)} GRPO steps from version 0. The product's rules (a float32 verifier; "
             "`coordinator.verify_tolerance`): `strict` (the default, float32 workers), tolerance "
             f"{_label(asdict(run_tolerance('strict')))}, and `wide` (bfloat16 workers too), {tol}, at each "
             "position (a recorded token further below the replay's top perturbed score is a mismatch; none "
             "allowed), and every completion ends where generation ends. Columns: the same rounds read at other "
             "tolerances (absolute, or 0.001 + a share of the position's largest |warped score|).", "",
             "Honest rounds (verifier: one thread), false alarms:", "",
             "| worker | verifier | worker threads | rounds | tokens | largest deficit | largest deficit / max "
             "|warped score| | rounds with a deficit > 0 | " + " | ".join(keys) + " |",
             "|---|---|---|---|---|---|---|---|" + "---|" * len(keys)]
    for h in res["honest"]:
        lines.append(f"| {h['worker']} | {h['verifier']} | {h['worker_threads']} | {h['rounds']} | {h['tokens']} | "
                     f"{h['largest_deficit']:.2g} | {h['largest_ratio']:.2g} | {h['deficits_above_0']} | "
                     + " | ".join(str(h["false_alarms"][k]) for k in keys) + " |")
    lines += [f"\nWorker `{h['worker']}`: sampled in a child process with {h['worker_kernels']}, rounding as "
              "another CPU's kernels would (`benchmarks/proof/other_cpu.py`)." for h in res["honest"]
              if h["worker"].endswith("-other")]
    lines += ["", "Forged rounds (float32 worker's honest completions forged; float32 verifier), caught:", "",
              "| attack | rounds | checked completion differs from the honest one | caught of those (wide) | "
              + " | ".join(keys) + " |", "|---|---|---|---|" + "---|" * len(keys)]
    for r in res["attacks"]:
        n = max(1, r["rounds"])
        lines.append(f"| {r['attack']} | {r['rounds']} | {r['differs'] / n:.1%} | "
                     f"{r['caught_of_differing'] / max(1, r['differs']):.1%} | "
                     + " | ".join(f"{r['caught'][k] / n:.1%}" for k in keys) + " |")
    c = res["cost"]
    if res.get("units_left"):
        lines += ["", f"Not run (out of time): {', '.join(res['units_left'])}."]
    if not c:
        return "\n".join(lines)
    lines += ["", f"Cost (CPU seconds): a {c['steps']}-step training round took {c['train_s']:.2f} s on one thread "
              f"({c['completions']} completions, {c['round_tokens']} tokens in its batch 0); replaying its sample "
              f"({c['checked_completions']} completion(s), {c['tokens_checked']} tokens = {c['share_of_tokens']:.1%}"
              f" of the batch's tokens) took {c['verify_s']:.3f} s = {c['share_of_training']:.1%} of the round's "
              f"training, {c['tokens_per_s']:.0f} tokens checked per s (model loading left out)."]
    return "\n".join(lines)


def headline(res: dict) -> str:
    """Wide rule: false alarms (every pair) and the weakest catch rate; strict (float32 workers): the same."""
    rounds = sum(h["rounds"] for h in res["honest"])
    alarms = sum(h["false_alarms"]["wide"] for h in res["honest"])
    pairs = ", ".join(sorted({f"{h['worker']} worker/{h['verifier']} verifier" for h in res["honest"]}))
    wide = [f"{alarms} false alarms in {rounds} honest rounds ({pairs})"] if rounds else []
    differing = [r for r in res["attacks"] if r["differs"]]
    if differing:  # a forgery whose checked completion is the honest one cannot be caught: its rate is the others'
        worst = min(differing, key=lambda r: r["caught_of_differing"] / r["differs"])
        same = [r["attack"] for r in res["attacks"] if not r["differs"]]
        wide.append(f"forgeries that change the checked completion caught in ≥ "
                    f"{worst['caught_of_differing'] / worst['differs']:.1%} (weakest: {worst['attack']}, "
                    f"{worst['differs']} rounds)" + (f"; {', '.join(same)}: never changed it" if same else ""))
    fp32 = [h for h in res["honest"] if h["worker"].startswith("fp32") and "strict" in h["false_alarms"]]
    strict = [f"{sum(h['false_alarms']['strict'] for h in fp32)} false alarms in "
              f"{sum(h['rounds'] for h in fp32)}"] if fp32 else []
    if differing:  # coordinator.verify_tolerance: strict, float32 workers only
        worst = min(differing, key=lambda r: r["caught"]["strict"] / r["differs"])
        strict.append(f"forgeries caught in ≥ {worst['caught']['strict'] / worst['differs']:.1%} (weakest: "
                      f"{worst['attack']}, {worst['caught']['strict']} of {worst['differs']})")
    out = "; ".join([*(["wide rule: " + "; ".join(wide)] if wide else []),
                     *(["strict (the default, float32 workers): " + ", ".join(strict)] if strict else [])])
    if res["cost"]:
        out += f"; verification {res['cost']['share_of_training']:.1%} of a round's training"
    return out


def units(args) -> list[str]:
    """The work, most telling first: each unit is kept as it finishes (a run can stop and resume, ``--finish``)."""
    from tests.support.proof_support import ATTACKS

    pairs = args.pairs.split(",")
    threads = args.threads.split(",")
    first = [f"honest:{p}/{threads[0]}" for p in reversed(pairs)]  # the mixed-precision pair first
    rest = [f"honest:{p}/{t}" for t in threads[1:] for p in reversed(pairs)]
    out = [*first, *[f"attack:{k}" for k in (*ATTACKS, "older_by_one_step")], "cost", *rest]
    return [u for u in out if not args.only or u.startswith(tuple(args.only.split(",")))]


def run_unit(b: Bench, unit: str, args, cache: dict) -> dict:
    kind, _, what = unit.partition(":")
    if kind == "cost":
        return cost(b)
    if kind == "attack":
        return attack(b, what, args.attack_rounds, args.per_call, settings()["wide"], cache, args.checked)
    worker, checker, threads = what.split("/")
    return honest(b, args.rounds, args.per_call, worker, checker, int(threads), args.checked)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    options(ap, __file__)
    ap.add_argument("--model", choices=sorted(CONFIGS), default="smollm2")
    ap.add_argument("--rounds", type=int, default=256, help="honest rounds per pair and thread count")
    ap.add_argument("--attack-rounds", type=int, default=128, help="forged rounds per attack kind")
    ap.add_argument("--per-call", type=int, default=32, help="rounds per generate call")
    ap.add_argument("--threads", default="1,2", help="worker thread counts")
    ap.add_argument("--pairs", default="fp32/fp32,bf16/fp32", help="worker/verifier precisions; a worker "
                    "ending in -other (fp32-other/fp32) samples with another CPU's rounding (other_cpu.py)")
    ap.add_argument("--steps", type=int, default=STEPS, help="GRPO steps from version 0 to the leased version")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="a config override (repeatable), e.g. params.max_completion_length=96: another round shape")
    ap.add_argument("--checked", type=int, default=1, help="completions a simulated round has checked: as many as "
                    "the 10 %% budget holds for the shape (the cost line shows what `choose` took on a real round)")
    ap.add_argument("--only", default="", help="run only the units starting with these (comma-separated), "
                    "e.g. honest: for false alarms alone")
    ap.add_argument("--name", default=None)
    ap.add_argument("--finish", action="store_true", help="write the result from the units done so far, no run")
    ap.add_argument("--render", type=Path, help="re-read a result's JSON at today's default tolerance, no run")
    args = ap.parse_args()
    if args.render:
        return render(args.render)
    if args.quick:
        args.model, args.rounds, args.attack_rounds, args.per_call, args.threads = "tiny", 8, 8, 8, "1"
    folder, name = results_dir(args, __file__), args.name or f"proof-{args.model}"
    partial = folder / f"{name}.partial.json"
    state = json.loads(partial.read_text()) if partial.exists() else {"meta": start(args.quick), "done": {}}
    if not args.finish:
        if args.per_call % args.checked:
            raise SystemExit(f"--per-call {args.per_call} is not a multiple of --checked {args.checked}")
        b, cache = setup(args.model, args.steps, tuple(args.overrides)), {}
        p = b.params
        state["model"] = b.engine.cfg.base_model  # type: ignore[attr-defined]
        state["shape"] = (f"{p['per_device_train_batch_size'] // p['num_generations']} prompts × "
                          f"{p['num_generations']} completions of ≤ {p['max_completion_length']} tokens, "
                          f"temperature {p['temperature']}")
        for unit in (u for u in units(args) if u not in state["done"]):
            state["done"][unit] = run_unit(b, unit, args, cache)
            print(unit, json.dumps({k: v for k, v in state["done"][unit].items() if k != "deficits"}), flush=True)
            folder.mkdir(parents=True, exist_ok=True)
            partial.write_text(json.dumps(state, default=str))
    done = state["done"]
    res = {"args": vars(args) | {"results": str(args.results), "render": None}, "model": state["model"],
           "shape": state["shape"], "units_left": [u for u in units(args) if u not in done],
           "honest": [v for k, v in done.items() if k.startswith("honest:")],
           "attacks": [v for k, v in done.items() if k.startswith("attack:")], "cost": done.get("cost")}
    finish(res, folder, name, state["meta"])
    partial.unlink()


def finish(res: dict, folder: Path, name: str, meta: dict) -> None:
    from dataclasses import asdict

    res["tolerance"] = asdict(settings()["wide"])
    recount(res)
    res["headline"] = headline(res)
    write(folder, name, res, markdown(res), meta, res["headline"])


def render(path: Path) -> None:
    """``--render``: the result at ``path`` recounted and rewritten in place (its meta kept, ``rendered`` added)."""
    res = json.loads(path.read_text())
    meta = res.pop("meta") | {"rendered": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    finish(res, path.parent, path.stem, meta)


if __name__ == "__main__":
    main()
