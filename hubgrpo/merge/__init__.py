"""Merging LoRA adapters as pure functions (docs/architecture.md, "The merge").

API::

    Adapter(weights: dict[str, Tensor], config: dict)              # adapter_model.safetensors + adapter_config.json
    load_adapter_dir(path) -> Adapter;  save_adapter_dir(adapter, path) -> Path
    MergeOptions(method="svd"|"stack"|"ffa"|"naive", outer_lr=1.0, outer_momentum=0.0, nesterov=False,
                 momentum_every=1, rank=None, max_rank=None, momentum_rank=None, clip_factor=None, trim_fraction=0.0,
                 svd_algorithm="auto"|"exact"|"randomized", oversample=5, passes=3, probes=4, seed=0)
    merge(global_, [(submission, its base adapter, weight), …], options, momentum=None) -> MergeResult
        MergeResult.adapter   new global (PEFT keys + adapter_config dict, loadable by PeftModel.from_pretrained)
        MergeResult.momentum  outer momentum state (dict of tensors: save as safetensors, pass back; with
                              momentum_every > 1 also the delayed-Nesterov buffer and its count)
        MergeResult.report    JSON: method, algorithm, residual (overall + per module), merged/clipped/trimmed
                              counts, update norms, weights, timing
    staleness_weight(samples, tau, decay=0.5, max_staleness=None) -> float   # raises InvalidSubmission("stale")
    dense_delta(adapter) -> {module prefix: s·B·A}                  # dense, for tests only

Semantics (every method, in ΔW = s·B·A space): with normalised weights cᵢ, the outer gradient is the weighted mean
update ``g = Σ cᵢ (ΔWᵢ − ΔW_base(i))`` — base(i) is the version submission i was trained from, which for a stale
submission is not the current global — and the new global is ``ΔW_G + outer_lr · step`` (step = g, or the
momentum / Nesterov step, see ``methods``). With the defaults and fresh submissions this is exactly the weighted
mean of the submissions' ΔW. Robust options (``robust``) act on each update before the mean.

Methods: ``svd`` (default; exact mean, re-factorised to the global's rank r: QR+SVD of the stacked factors or a
randomized range finder, chosen by size with ``svd_algorithm="auto"``; the report says which ran and the
truncation residual ``‖ΔW − B′A′‖/‖ΔW‖``), ``stack`` (FLoRA, exact, rank grows to ``max_rank`` then svd),
``ffa`` (FFA-LoRA, A frozen and shared, B averaged; exact) and ``naive`` (factor averaging, benchmark baseline).

Output config: ``svd``/``ffa``/``naive`` keep the global's adapter_config (same r, lora_alpha, rsLoRA and patterns,
so the shapes never change; the refactored product is split √s-balanced between B and A). When a module's rank
changes (``stack``, or ``rank`` ≠ r), every module is padded to r′ = the largest rank and the config gets
``r = lora_alpha = r′``, ``use_rslora = False`` and empty patterns, i.e. s = 1 with the scale folded into B.

Refused with ``MergeError``: DoRA, modules_to_save, LoRA biases, trainable tokens, conv / parameter targets, and
adapters whose modules or frozen tensors differ from the global's. Embedding LoRA (``lora_embedding_A/B``) is
merged like any other module (PEFT's transpose commutes with the linear merge).
"""

from hubgrpo.merge.adapter import Adapter, ModuleSpec, dense_delta, load_adapter_dir, parse_modules, save_adapter_dir
from hubgrpo.merge.core import MergeOptions, MergeResult, gradient_coefficients, merge
from hubgrpo.merge.robust import staleness_weight, update_norm

__all__ = [
    "Adapter",
    "ModuleSpec",
    "MergeOptions",
    "MergeResult",
    "dense_delta",
    "gradient_coefficients",
    "load_adapter_dir",
    "merge",
    "parse_modules",
    "save_adapter_dir",
    "staleness_weight",
    "update_norm",
]
