"""Prompt sharing: each prompt is computed once for its group of ``num_generations`` completions.

GRPO samples a group of completions per prompt. TRL repeats the prompt for every completion of its group, so the
prompt's tokens go through the model ``num_generations`` times when generating (prefill) and again when computing
the log-probabilities for the loss (forward and backward). With short completions after long prompts (the demo:
~50 prompt tokens, at most 12 completion tokens) the prompt is most of the work.

``SharingGRPOTrainer`` computes each distinct prompt once and hands the completions its key/value cache
(transformers' ``DynamicCache``):

- **generation**: the distinct prompts (all but their last token) are prefilled once; the cache is repeated for the
  group and ``generate`` continues from it, as transformers' prefix-cache reuse does. Positions follow the
  attention mask as ``generate`` computes them.
- **training**: the distinct prompts (all but their last token) go through the model once, with gradients; the
  cache is repeated for the group and the completions (preceded by the prompt's last token) go through TRL's fused
  log-probability head with that cache. The gradient reaches the prompt's tokens through the repeated cache, so it
  sums over the group as in the repeated computation.

Both give the numbers TRL's own path gives, up to float rounding (``tests/unit/test_sharing.py``). Anything else
(vision inputs, MoE auxiliary losses, vLLM or continuous batching, a static cache, prompts without duplicates, a
TRL without the fused head) takes TRL's own path unchanged. ``worker.share_prompts: false`` turns it off.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch
from transformers import DynamicCache

from hubgrpo.worker.decode import generation_field, static_caches
from hubgrpo.worker.keyed import KeyedGRPOTrainer


def distinct_rows(ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """The distinct (token ids, attention mask) rows and, per row, the index of its distinct row; None when every
    row is distinct (nothing to share)."""
    key = torch.cat([ids, mask.to(ids.dtype)], dim=1)
    unique, inverse = torch.unique(key, dim=0, return_inverse=True)
    if unique.size(0) == key.size(0):
        return None
    width = ids.size(1)
    return unique[:, :width], unique[:, width:].to(mask.dtype), inverse


def backbone(model) -> Any:
    """The transformer under the LM head (LoRA layers in place), for a PeftModel or a plain causal LM."""
    lm = model.get_base_model() if hasattr(model, "get_base_model") else model
    return getattr(lm, lm.base_model_prefix)


@functools.cache
def _cache_kwarg(forward) -> str:
    """transformers 5 calls the cache argument ``cache``; 4.x ``past_key_values``."""
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"


def prefill(model, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor | None = None) -> DynamicCache:
    """The key/value cache of ``ids`` (no LM head); with gradients when they are enabled."""
    body = backbone(model)
    cache = DynamicCache(config=body.config)
    kwargs = {} if positions is None else {"position_ids": positions}
    body(input_ids=ids, attention_mask=mask, use_cache=True, **kwargs, **{_cache_kwarg(type(body).forward): cache})
    return cache


def repeat_rows(cache: DynamicCache, rows: torch.Tensor) -> None:
    """Each row of the cache's batch as ``rows`` orders them (``index_select``: its backward sums a group's
    gradients in a fixed order, where advanced indexing's ``index_put`` would not on several threads)."""
    for layer in cache.layers:
        for name in ("keys", "values"):
            tensor = getattr(layer, name, None)
            if isinstance(tensor, torch.Tensor) and tensor.numel():
                setattr(layer, name, tensor.index_select(0, rows))


def shared_generate(original, model, *args, **kwargs):
    """``model.generate`` that prefills each distinct prompt once; the original call where that cannot apply."""
    config = kwargs.get("generation_config")
    ids, mask = kwargs.get("input_ids"), kwargs.get("attention_mask")
    extra = set(kwargs) - {"input_ids", "attention_mask", "generation_config", "logits_processor"}
    if args or extra or ids is None or mask is None or ids.size(1) < 2 or not bool(mask[:, -1].all()):
        return original(*args, **kwargs)
    if (
        generation_field(config, model, "cache_implementation")
        or (generation_field(config, model, "num_beams") or 1) > 1
    ):
        return original(*args, **kwargs)
    if static_caches(model) is not None:  # worker.decode: compiled decodes over its kept static cache
        return original(*args, **kwargs)
    rows = distinct_rows(ids, mask)
    if rows is None:
        return original(*args, **kwargs)
    unique_ids, unique_mask, inverse = rows
    positions = (unique_mask.long().cumsum(-1) - 1).masked_fill(unique_mask == 0, 0)  # as generate computes them
    with torch.no_grad():
        cache = prefill(model, unique_ids[:, :-1], unique_mask[:, :-1], positions[:, :-1])
    repeat_rows(cache, inverse)
    return original(**kwargs, **{_cache_kwarg(type(backbone(model)).forward): cache})


def _fused_head() -> bool:
    try:
        from trl.trainer.utils import add_fused_lm_head  # noqa: F401  (TRL ≥ 1.x: model(..., fused_lm_head=True))
    except ImportError:
        return False
    return True


class SharingGRPOTrainer(KeyedGRPOTrainer):
    """TRL's GRPOTrainer with each prompt computed once per group (module docstring), sampling as
    ``KeyedGRPOTrainer`` does."""

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, *args, **kwargs):
        generate = super()._generate_single_turn
        if self.use_vllm or getattr(self, "use_transformers_continuous_batching", False) or images or multimodal_fields:
            return generate(prompt_ids, images, multimodal_fields, *args, **kwargs)
        model: Any = self.accelerator.unwrap_model(self.model_wrapped)
        model.generate = functools.partial(shared_generate, model.generate, model)  # this call only
        try:
            return generate(prompt_ids, images, multimodal_fields, *args, **kwargs)
        finally:
            del model.generate

    def _get_per_token_logps_and_entropies(
        self,
        model,
        input_ids,
        attention_mask,
        logits_to_keep,
        batch_size=None,
        compute_entropy=False,
        compute_aux_loss=False,
        **multimodal,
    ):
        start = input_ids.size(1) - logits_to_keep  # the prompt's length (left-padded, so its last column is real)
        plain = (
            compute_aux_loss
            or any(v is not None for v in multimodal.values())
            or start < 2
            or not bool(attention_mask[:, start - 1].all())
            or not _fused_head()
            or distinct_rows(input_ids[:, :start], attention_mask[:, :start]) is None
        )
        if plain:
            return super()._get_per_token_logps_and_entropies(
                model,
                input_ids,
                attention_mask,
                logits_to_keep,
                batch_size,
                compute_entropy,
                compute_aux_loss,
                **multimodal,
            )
        batch_size = batch_size or input_ids.size(0)
        logps, entropies = [], []
        for i in range(0, input_ids.size(0), batch_size):
            ids, mask = input_ids[i : i + batch_size], attention_mask[i : i + batch_size]
            outputs = self._shared_forward(model, ids, mask, start)
            logps.append(outputs.log_probs)
            if compute_entropy:
                entropies.append(outputs.entropy)
        return torch.cat(logps), torch.cat(entropies) if compute_entropy else None, None

    def _shared_forward(self, model, ids: torch.Tensor, mask: torch.Tensor, start: int):
        """Log-probabilities of the completion tokens ``ids[:, start:]``: the prompts once, then the completions.

        The second pass takes the prompt's last token too, so its output predicts the first completion token (the
        fused head shifts by one, as in TRL's own call)."""
        rows = distinct_rows(ids[:, :start], mask[:, :start])
        tail, tail_mask = ids[:, start - 1 :], mask[:, start - 1 :]
        labels = tail.masked_fill(tail_mask == 0, -100)
        labels[:, 0] = -100
        with self.accelerator.autocast():
            if rows is None:
                cache = prefill(model, ids[:, : start - 1], mask[:, : start - 1])
            else:
                unique_ids, unique_mask, inverse = rows
                cache = prefill(model, unique_ids[:, : start - 1], unique_mask[:, : start - 1])
                repeat_rows(cache, inverse)
            return model(
                input_ids=tail,
                attention_mask=mask,
                labels=labels,
                fused_lm_head=True,
                **{_cache_kwarg(type(backbone(model)).forward): cache},
            )
