"""Helpers for the proof-of-rollouts tests: an honest round through the worker's own trainer, recorded with the
adapter each generation batch was sampled from, and its replay."""

from __future__ import annotations

import copy

import torch
from peft import get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict

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


def verifier(engine: RoundEngine, state: dict, dtype: torch.dtype = torch.float32):
    """A fresh model (base + adapter ``state``) in eval mode and ``dtype``, as a verifier loads it: never a copy of
    the trainer's model, whose ``forward`` accelerate wrapped in closures that still call the original."""
    base, _ = load_model(engine.cfg.base_model, device="cpu", dtype="float32")
    model = get_peft_model(base, copy.deepcopy(engine.trainer.model.peft_config["default"]))
    result = set_peft_model_state_dict(model, state)
    assert not result.unexpected_keys, result.unexpected_keys
    return model.to(dtype).eval()


def verify_batch(model, engine: RoundEngine, batch: KeyedBatch, seed: int, **sampling) -> Verdict:
    """Replay one recorded generation batch (sampling settings: the engine's unless given)."""
    p = engine.params
    settings = {"temperature": p["temperature"], "top_p": p["top_p"], "top_k": None, **sampling}
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
