"""The worker's trainer with keyed sampling (``hubgrpo.proof``): every generation path of a round samples with the
lease's noise, so a verifier can replay it.

``KeyedGRPOTrainer`` is TRL's GRPOTrainer whose ``_generate_single_turn`` — the one place TRL calls
``model.generate`` on the transformers path — wraps ``model.generate`` for that call with
``hubgrpo.proof.sampling.keyed_generate``. ``SharingGRPOTrainer`` (``hubgrpo.worker.sharing``) builds on it, so its
own ``generate`` with the shared prompt cache samples with the same processor. ``keyed`` is the round's key,
``None`` for TRL's random sampling; the engine sets it at the start of every round (``worker.keyed_sampling``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
from trl import GRPOTrainer

from hubgrpo.errors import ConfigError
from hubgrpo.proof.sampling import KeyedSampling, keyed_generate
from hubgrpo.worker.decode import inner_model


@dataclass
class KeyedBatch:
    """One generation batch sampled with the round's key: completion ``first + i`` answers ``prompt_ids[i]``."""

    first: int
    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]


class KeyedGRPOTrainer(GRPOTrainer):
    """GRPOTrainer whose generations use keyed Gumbel-max sampling while ``keyed`` is set."""

    keyed: KeyedSampling | None = None
    keyed_log: list[KeyedBatch] | None = None  # when a list: every keyed generation batch is appended to it

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, *args, **kwargs):
        generate = super()._generate_single_turn
        if self.keyed is None:
            return generate(prompt_ids, images, multimodal_fields, *args, **kwargs)
        if self.use_vllm or getattr(self, "use_transformers_continuous_batching", False):
            raise ConfigError(
                "keyed sampling runs through transformers' generate, not vLLM or continuous batching",
                hint="set worker.keyed_sampling: false to generate with vLLM (rounds then cannot be verified)",
            )
        model: Any = self.accelerator.unwrap_model(self.model_wrapped)
        _no_live_dropout(model)
        previous = model.__dict__.get("generate")  # a wrapper of a subclass's (prompt sharing), kept beneath
        defaults = getattr(inner_model(model), "generation_config", None)  # fills the call's unset fields
        model.generate = functools.partial(keyed_generate, model.generate, self.keyed, defaults)
        first = self.keyed.next_index
        try:
            out = generate(prompt_ids, images, multimodal_fields, *args, **kwargs)
        finally:
            if previous is None:
                del model.generate
            else:
                model.generate = previous
        if self.keyed_log is not None:
            self.keyed_log.append(KeyedBatch(first, [list(p) for p in prompt_ids], [list(c) for c in out[0]]))
        return out


def _no_live_dropout(model) -> None:
    """``ConfigError`` when dropout would draw random masks while generating: a verifier could not replay it."""
    live = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Dropout) and m.p > 0 and m.training]
    live += [  # attention modules (Llama, Qwen2, ...) that drop attention weights in training mode by a float
        f"{n}.attention_dropout"
        for n, m in model.named_modules()
        if m.training and isinstance(getattr(m, "attention_dropout", None), float) and m.attention_dropout > 0
    ]
    if live:
        raise ConfigError(
            f"keyed sampling needs generation without dropout, and {live[0]} drops with p > 0",
            hint="set lora.dropout: 0 (and the model's own dropout and attention_dropout to 0), or "
            "worker.keyed_sampling: false",
        )
