"""How a worker's generation decodes: ``eager`` or ``compiled`` (``worker.decode``).

Decoding a small model is bound by launching its kernels, not by arithmetic: every new token runs each layer's
linear maps, LoRA's two extra products per map, the norms and the attention as separate kernels, about as many
per token as the model has operations. transformers' ``generate`` has the remedy built in: with a static
key/value cache (``cache_implementation="static"``, preallocated to the longest prompt plus the completion length)
its decoding step has one shape, and ``generate`` compiles it with ``torch.compile`` (mode ``reduce-overhead``:
CUDA graphs), so a token costs one graph replay. TRL builds its generation config with ``disable_compile=True``;
``compile_decoding`` turns compiling back on for the trainer's config and asks for the static cache. The prompt's
prefill stays eager, and so does everything that samples (hubgrpo's keyed noise, the warpers): the compiled call
computes the same model, so the distribution sampled is unchanged (``benchmarks/gpu/gpu_bench.py`` reports what
the two give on the same adapter and noise, and their speed).

- ``eager`` (the default): a growing ``DynamicCache``, nothing compiled; prompt sharing (``hubgrpo.worker.sharing``)
  applies.
- ``compiled``: the static cache and the compiled step. The first round pays the compilation (and another when a
  longer prompt grows the cache); transformers compiles only on accelerators (CUDA, XPU, MPS), so on a CPU this is
  the static cache alone. It stays opt-in until a GPU run of ``gpu_bench.py`` has measured it.
"""

from __future__ import annotations

from typing import Any


def compile_decoding(trainer: Any) -> None:
    """A static cache and ``generate``'s compiled decoding step for a GRPOTrainer's generation (TRL's config
    disables compiling); ``generation_kwargs``, which TRL lays over the model's own config while generating, gets
    the cache too."""
    config = trainer.generation_config
    config.cache_implementation = "static"
    config.disable_compile = False
    kwargs = getattr(trainer, "generation_kwargs", None)
    if isinstance(kwargs, dict):
        kwargs["cache_implementation"] = "static"
