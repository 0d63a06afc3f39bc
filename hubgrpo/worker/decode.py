"""How a worker's generation decodes: ``eager`` or ``compiled`` (``worker.decode``).

Decoding a small model is bound by launching its kernels, not by arithmetic: every new token runs each layer's
linear maps, LoRA's two extra products per map, the norms and the attention as separate kernels, about as many
per token as the model has operations. transformers' ``generate`` has the remedy built in: with a static
key/value cache its decoding step has one shape, and ``generate`` compiles it with ``torch.compile`` (mode
``reduce-overhead``: CUDA graphs), so a token costs one graph replay. TRL builds its generation config with
``disable_compile=True``; ``compile_decoding`` turns compiling back on and gives ``generate`` a static cache that
outlives the call (``StaticCaches``). transformers would build a new cache for every call (``cache_implementation=
"static"``): new tensors, so the CUDA graphs recorded over the last call's cache would be re-recorded every round.
The prompt's prefill stays eager, and so does everything that samples (hubgrpo's keyed noise, the warpers): the
compiled call computes the same model, so the distribution sampled is unchanged (``benchmarks/gpu/gpu_bench.py``
reports what the two give on the same adapter and noise, and their speed).

- ``eager`` (the default): a growing ``DynamicCache``, nothing compiled; prompt sharing (``hubgrpo.worker.sharing``)
  applies to generation and to the loss.
- ``compiled``: one static cache per generation batch size, kept for the worker's life and cleared before each
  call, and the compiled step. The first round pays the compilation; the cache is sized for
  ``max_prompt_length + max_completion_length`` (rounded up), so a longer prompt does not recompile unless it
  exceeds that. Prompt sharing still applies to the loss, not to generation. transformers compiles only on
  accelerators (CUDA, XPU, MPS), so on a CPU this is the static cache alone. It stays opt-in until a GPU run of
  ``gpu_bench.py`` has measured it.
"""

from __future__ import annotations

import functools
from typing import Any

from hubgrpo.proof.sampling import effective

ROUND_TO = 64  # cache lengths are multiples of this: a handful of shapes, so few compilations
KEPT = 3  # batch sizes whose caches are kept: a round's generation, held-out scoring's full and last batches


def inner_model(model: Any) -> Any:
    """The transformers model under PEFT's wrapper (the model itself without one)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def generation_field(config: Any, model: Any, name: str) -> Any:
    """A generation setting as ``model.generate`` uses it (``hubgrpo.proof.sampling.effective``)."""
    return effective(config, getattr(inner_model(model), "generation_config", None), name)


class StaticCaches:
    """A model's ``generate`` with a ``StaticCache`` kept across calls, one per batch size (the ``KEPT`` most
    recently used), cleared before each call; calls it cannot serve (their own cache, beams, no cache, no
    ``max_new_tokens``) go through unchanged."""

    def __init__(self, model: Any, original: Any, min_length: int = 0) -> None:
        self.model, self.original, self.min_length = model, original, min_length
        self.caches: dict[int, Any] = {}  # batch size → its cache
        self.lengths: dict[int, int] = {}  # batch size → the tokens its cache holds
        self.built = 0  # caches built (a new one also means a new compiled graph on an accelerator)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        ids, config = kwargs.get("input_ids"), kwargs.get("generation_config", None)
        own = {"cache", "past_key_values", "max_new_tokens", "max_length"} & set(kwargs)  # a cache or a length
        new_tokens = self.serves(config) if config is not None else None
        if args or ids is None or own or not new_tokens:
            return self.original(*args, **kwargs)
        return self.original(**kwargs, cache=self.cache(ids.size(0), ids.size(1) + new_tokens))

    def serves(self, config: Any) -> int | None:
        """The new tokens a call with this generation config makes, when it can decode over a kept cache: one
        sequence per row, a cache, none named, a bound on new tokens. ``generate`` fills each field the call's
        config leaves unset from the model's own generation config, so this reads them the same way."""

        def field(name: str) -> Any:
            return generation_field(config, self.model, name)

        if field("cache_implementation") is not None or field("use_cache") is False:
            return None
        if (field("num_beams") or 1) != 1 or (field("num_return_sequences") or 1) != 1:
            return None
        return field("max_new_tokens") or None

    def cache(self, batch: int, length: int) -> Any:
        """The batch size's cache, cleared, at least ``length`` long (a longer one replaces it)."""
        from transformers import StaticCache

        cache = self.caches.pop(batch, None)
        if cache is not None and self.lengths[batch] >= length:
            cache.reset()
            self.caches[batch] = cache  # the most recently used last
            return cache
        for old in list(self.caches)[: max(0, len(self.caches) - KEPT + 1)]:  # the least recently used go
            del self.caches[old], self.lengths[old]
        size = -(-max(length, self.min_length) // ROUND_TO) * ROUND_TO
        cache = StaticCache(config=self.model.config.get_text_config(decoder=True), max_cache_len=size)
        self.caches[batch], self.lengths[batch] = cache, size
        self.built += 1
        return cache


def static_caches(model: Any) -> StaticCaches | None:
    """The ``StaticCaches`` a model generates with (``compile_decoding``), or None."""
    found = inner_model(model).__dict__.get("generate")
    return found if isinstance(found, StaticCaches) else None


def compile_decoding(trainer: Any, longest: int = 0) -> StaticCaches:
    """A kept static cache and ``generate``'s compiled decoding step for a GRPOTrainer's generation (TRL's config
    disables compiling). The cache sits on the transformers model under PEFT's wrapper, so every path that reaches
    ``generate`` (keyed sampling, TRL's own call) gets it; ``longest``: the prompt and completion tokens it is sized
    for at first (``max_prompt_length + max_completion_length``)."""
    config = trainer.generation_config
    config.cache_implementation = None
    config.disable_compile = False
    kwargs = getattr(trainer, "generation_kwargs", None)
    if isinstance(kwargs, dict):
        kwargs["cache_implementation"] = None
    inner = inner_model(trainer.accelerator.unwrap_model(trainer.model_wrapped))
    found = static_caches(inner)
    if found is not None:
        return found
    if getattr(inner, "generation_config", None) is not None:
        inner.generation_config.cache_implementation = None  # the kept cache replaces the model's own choice
    keeper = StaticCaches(inner, functools.partial(type(inner).generate, inner), longest)
    inner.generate = keeper
    return keeper
