"""Helpers for the proof-of-rollouts tests: an honest round through the worker's own trainer, recorded with the
adapter each generation batch was sampled from, and its replay."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
from peft import get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict

from hubgrpo.proof.sampling import Warp, generate_keyed
from hubgrpo.proof.verify import Verdict, verify_completions
from hubgrpo.worker.engine import RoundEngine
from hubgrpo.worker.keyed import KeyedBatch
from hubgrpo.worker.models import load_model


def adapter_state(model) -> dict[str, torch.Tensor]:
    state = get_peft_model_state_dict(model, adapter_name="default", save_embedding_layers=False)
    return {k: v.detach().clone() for k, v in state.items()}


def record_round(engine: RoundEngine, rows: list[dict], steps: int, seed: int):
    """Train ``steps`` steps on ``rows``; (the keyed generation batches, the adapter state each was sampled with)."""
    tr = engine.trainer
    inner, snapshots = tr._generate, []

    def snap(prompts):
        snapshots.append(adapter_state(tr.model))
        return inner(prompts)

    tr._generate, tr.keyed_log = snap, []
    try:
        engine.train_steps(rows, steps, seed=seed)
        log = tr.keyed_log
    finally:
        tr._generate, tr.keyed_log = inner, None
    assert log is not None and len(log) == len(snapshots)
    return log, snapshots


SHARP = 10.0  # the tiny model's output embeddings × this: its next-token distributions as peaked as a real LM's


def sharpen(model, scale: float = SHARP) -> None:
    """Scale the (tied) output embeddings: the random tiny model's distributions are near uniform, where the noise
    alone picks the token and any model with the right noise writes nearly the same completions."""
    model.get_output_embeddings().weight.data *= scale


def sharp_engine(overrides: list[str]) -> RoundEngine:
    """A tiny-model engine (``tiny_config`` with ``overrides``), sharpened, with a non-zero adapter."""
    from tests.support.models_fixture import tiny_config

    engine = RoundEngine(tiny_config(overrides))
    sharpen(engine.model)
    torch.manual_seed(1)
    for name, p in engine.trainer.model.named_parameters():
        if "lora_B" in name:  # B = 0 at version 0: make the adapter matter
            p.data.normal_(0, 0.5)
    return engine


def verifier(engine: RoundEngine, state: dict, dtype: torch.dtype = torch.float32, scale: float = 1.0):
    """A fresh model (base + adapter ``state``) in eval mode and ``dtype``, as a verifier loads it: never a copy of
    the trainer's model, whose ``forward`` accelerate wrapped in closures that still call the original."""
    base, _ = load_model(engine.cfg.base_model, device="cpu", dtype="float32")
    if scale != 1.0:
        sharpen(base, scale)
    model = get_peft_model(base, copy.deepcopy(engine.trainer.model.peft_config["default"]))
    result = set_peft_model_state_dict(model, state)
    assert not result.unexpected_keys, result.unexpected_keys
    return model.to(dtype).eval()


def verify_batch(model, engine: RoundEngine, batch: KeyedBatch, seed: int, **sampling) -> Verdict:
    """Replay one recorded generation batch (sampling settings, stop tokens and length: the engine's unless given)."""
    p = engine.params
    settings = {
        "temperature": p["temperature"],
        "top_p": p["top_p"],
        "top_k": None,
        "stop": engine.trainer.eos_token_ids,
        "max_length": p["max_completion_length"],
        **sampling,
    }
    n = len(batch.completion_ids)
    return verify_completions(
        model,
        engine.tokenizer,
        batch.prompt_ids,
        batch.completion_ids,
        seed,
        list(range(batch.first, batch.first + n)),
        **settings,
    )


ATTACKS = (
    "copied",
    "other_model",
    "other_adapter",
    "temperature",
    "older_adapter",
    "edited",
    "forged_noise",
    "truncated",
)


@dataclass
class Forgery:
    """What an attack works from: the honest batch, the leased adapter, an older one, the engine for the rest."""

    engine: RoundEngine
    batch: KeyedBatch
    seed: int
    leased: dict[str, torch.Tensor]
    older: dict[str, torch.Tensor]
    rows: list[dict]
    scale: float = 1.0  # the output embeddings' scale of the worker's model (``sharpen``)
    models: dict = field(default_factory=dict)  # the attackers' models, built on first use

    def model(self, name: str, state: dict | None = None):
        """An attacker's model by name: ``other_model`` (another tiny), else the base with adapter ``state``."""
        if name not in self.models:
            if state is None:
                self.models[name] = other_tiny_model()
                sharpen(self.models[name], self.scale)
            else:
                self.models[name] = verifier(self.engine, state, scale=self.scale)
        return self.models[name]


def sample(model, engine: RoundEngine, batch: KeyedBatch, seed: int, warp: Warp | None = None) -> list[list[int]]:
    """The batch's completions as keyed sampling writes them with ``model`` (the round's own numbering)."""
    p = engine.params
    return generate_keyed(
        model,
        batch.prompt_ids,
        seed=seed,
        first_index=batch.first,
        warp=warp or Warp(p["temperature"], None, p["top_p"]),
        max_new_tokens=p["max_completion_length"],
        eos_token_id=engine.trainer.eos_token_ids,
        pad_token_id=engine.tokenizer.pad_token_id,
    )


def random_adapter(state: dict[str, torch.Tensor], seed: int, scale: float = 0.5) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {k: torch.randn(v.shape, generator=gen) * scale if "lora_B" in k else v.clone() for k, v in state.items()}


def copied_answers(f: Forgery) -> list[list[int]]:
    """The data set's answers in the expected format, under each completion's prompt."""
    tok = f.engine.tokenizer
    out = []
    for prompt in f.batch.prompt_ids:
        text = tok.decode(prompt)
        row = next((r for r in f.rows if _content(r["prompt"]) in text), f.rows[0])
        ids = tok(f"<answer>{row.get('answer', '0')}</answer>", add_special_tokens=False)["input_ids"]
        out.append(list(ids) + [f.engine.trainer.eos_token_ids[0]])
    return out


def _content(prompt) -> str:
    return prompt[-1]["content"] if isinstance(prompt, list) else str(prompt)


def edited(completions: list[list[int]], vocab: int, per_completion: int = 2, seed: int = 0) -> list[list[int]]:
    """Honest completions with a few tokens each replaced by other tokens."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for c in completions:
        c = list(c)
        for i in torch.randperm(len(c), generator=gen)[:per_completion].tolist():
            c[i] = (c[i] + 1 + int(torch.randint(vocab - 1, (1,), generator=gen))) % vocab
        out.append(c)
    return out


def truncated(completions: list[list[int]], stop: list[int], by: int = 3) -> list[list[int]]:
    """Honest completions cut short by ``by`` tokens (their stop token dropped, if any) and ended with a stop token,
    as generation ends them: a shorter answer that scores differently."""
    out = []
    for c in completions:
        body = c[:-1] if c and c[-1] in stop else list(c)
        out.append(body[: max(0, len(body) - by)] + [stop[0]])
    return out


def other_tiny_model(seed: int = 12345):
    """The built-in tiny architecture with other weights (another seed), base model only."""
    from hubgrpo.runrepo import cache_root
    from hubgrpo.worker.models import build_tiny, cached_build

    path = cached_build(cache_root() / "models" / f"tiny-proof-other-seed{seed}", lambda out: build_tiny(out, seed))
    model, _ = load_model(str(path), device="cpu", dtype="float32")
    return model.eval()


def forge(kind: str, f: Forgery) -> list[list[int]]:
    """The completions an attacker of ``kind`` submits for the batch (``f.batch``: the honest one)."""
    e, b, p = f.engine, f.batch, f.engine.params
    if kind == "copied":
        return copied_answers(f)
    if kind == "edited":
        return edited(b.completion_ids, len(e.tokenizer), seed=b.first)
    if kind == "truncated":
        return truncated(b.completion_ids, e.trainer.eos_token_ids)
    if kind == "other_model":
        other = f.model("other_model")
        vocab = other.get_input_embeddings().num_embeddings
        prompts = [[t % vocab for t in ids] for ids in b.prompt_ids]
        return sample(other, e, KeyedBatch(b.first, prompts, b.completion_ids), f.seed)
    if kind == "forged_noise":
        return sample(f.model("leased", f.leased), e, b, f.seed + 1)
    if kind == "temperature":
        warp = Warp(p["temperature"] * 0.5, None, p["top_p"])
        return sample(f.model("leased", f.leased), e, b, f.seed, warp)
    if kind == "older_adapter":
        return sample(f.model("older", f.older), e, b, f.seed)
    return sample(f.model("other_adapter", random_adapter(f.leased, seed=99)), e, b, f.seed)


def prompt_ids(engine: RoundEngine, rows: list[dict]) -> list[list[int]]:
    """The rows' prompts as the worker's trainer tokenises them (TRL's ``_tokenize_prompts``)."""
    ids, _, _ = engine.trainer._tokenize_prompts([r["prompt"] for r in rows])
    return [list(p) for p in ids]
