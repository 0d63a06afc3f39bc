"""Synthetic PEFT LoRA adapters for merge / admission tests and benchmarks (no model needed).

``qwen_shapes`` gives the (out, in) of every all-linear LoRA module of a Qwen2-style model; ``make_adapter``
builds an ``Adapter`` with PEFT's key names and a PEFT-like ``adapter_config`` dict; ``drifted`` builds worker
adapters around a common one (relative Gaussian noise on the factors).
"""

from __future__ import annotations

import torch

from hubgrpo.merge import Adapter

PREFIX = "base_model.model.model.layers"


def qwen_shapes(layers: int, hidden: int, inter: int, heads: int, kv_heads: int, head_dim: int | None = None,
                ) -> dict[str, tuple[int, int]]:
    """``{module prefix: (out, in)}`` for q/k/v/o/gate/up/down of every layer."""
    hd = head_dim or hidden // heads
    per_layer = {"self_attn.q_proj": (heads * hd, hidden), "self_attn.k_proj": (kv_heads * hd, hidden),
                 "self_attn.v_proj": (kv_heads * hd, hidden), "self_attn.o_proj": (hidden, heads * hd),
                 "mlp.gate_proj": (inter, hidden), "mlp.up_proj": (inter, hidden), "mlp.down_proj": (hidden, inter)}
    return {f"{PREFIX}.{i}.{name}": shape for i in range(layers) for name, shape in per_layer.items()}


TINY = qwen_shapes(layers=2, hidden=32, inter=64, heads=4, kv_heads=2)  # the tiny Qwen2 used in tests
QWEN_05B = qwen_shapes(layers=24, hidden=896, inter=4864, heads=14, kv_heads=2, head_dim=64)
QWEN_15B = qwen_shapes(layers=28, hidden=1536, inter=8960, heads=12, kv_heads=2, head_dim=128)


def lora_config(r: int = 4, alpha: float = 8, **overrides) -> dict:
    """A PEFT 0.21-style adapter_config.json dict for all linear layers."""
    config = {
        "peft_type": "LORA", "task_type": None, "base_model_name_or_path": None, "r": r, "lora_alpha": alpha,
        "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        "use_rslora": False, "use_dora": False, "rank_pattern": {}, "alpha_pattern": {}, "modules_to_save": None,
        "bias": "none", "fan_in_fan_out": False, "layers_to_transform": None, "layers_pattern": None,
        "lora_dropout": 0.0, "lora_bias": False, "init_lora_weights": True, "inference_mode": True,
        "exclude_modules": None, "target_parameters": None, "trainable_token_indices": None,
    }
    config.update(overrides)
    return config


def make_adapter(shapes: dict[str, tuple[int, int]] = TINY, r: int = 4, seed: int = 0, scale: float = 0.1,
                 dtype: torch.dtype = torch.float32, ranks: dict[str, int] | None = None, **config) -> Adapter:
    """Random factors (std ``scale``) under PEFT's keys; ``ranks`` overrides r per module prefix."""
    gen = torch.Generator().manual_seed(seed)
    weights = {}
    for prefix, (out_dim, in_dim) in shapes.items():
        rank = (ranks or {}).get(prefix, r)
        weights[f"{prefix}.lora_A.weight"] = (torch.randn(rank, in_dim, generator=gen) * scale).to(dtype)
        weights[f"{prefix}.lora_B.weight"] = (torch.randn(out_dim, rank, generator=gen) * scale).to(dtype)
    return Adapter(weights=weights, config=lora_config(r=r, **config))


def drifted(common: Adapter, drift: float, seed: int) -> Adapter:
    """``common`` with every factor perturbed by relative Gaussian noise ``drift · std(factor)``."""
    gen = torch.Generator().manual_seed(seed)
    weights = {k: v + drift * v.float().std() * torch.randn(v.shape, generator=gen).to(v.dtype)
               for k, v in common.weights.items()}
    return Adapter(weights=weights, config=dict(common.config))


def rel_err(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> float:
    """Relative Frobenius error over all modules of two dense ΔW dicts."""
    num = sum(float(((got[k].double() - want[k].double()) ** 2).sum()) for k in want)
    den = sum(float((want[k].double() ** 2).sum()) for k in want)
    return (num / den) ** 0.5
