"""Adapter folders on disk: a strict check before loading, and saving only the "default" adapter.

A PEFT adapter folder holds ``adapter_model.safetensors`` + ``adapter_config.json`` (``ADAPTER_FILES``). Loading
never ignores missing or unexpected keys: an adapter that does not fit the engine's model and LoRA config (rank,
alpha, rsLoRA, target modules → keys, shapes) is a ``ModelError`` naming the first differences.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from hubgrpo.config import LoraSection
from hubgrpo.errors import ModelError
from hubgrpo.layout import ADAPTER_CONFIG, ADAPTER_FILES, ADAPTER_WEIGHTS


def _first(keys, n: int = 3) -> str:
    keys = sorted(keys)
    return ", ".join(keys[:n]) + (f" (+{len(keys) - n} more)" if len(keys) > n else "")


def check_adapter_config(path: Path, lora: LoraSection) -> dict:
    """Read ``adapter_config.json`` and check it is a LoRA adapter with the config's r, alpha and rsLoRA."""
    try:
        conf = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ModelError(f"cannot read adapter config {path}: {e}", hint="it must be peft's adapter_config.json")
    if conf.get("peft_type") != "LORA":
        raise ModelError(f"{path}: peft_type {conf.get('peft_type')!r} is not LORA", hint="hubgrpo trains LoRA")
    want = {"r": lora.r, "lora_alpha": lora.alpha, "use_rslora": lora.use_rslora}
    got = {"r": conf.get("r"), "lora_alpha": conf.get("lora_alpha"), "use_rslora": bool(conf.get("use_rslora"))}
    if any(got[k] != want[k] for k in want):  # a different alpha would silently rescale every update
        raise ModelError(
            f"{path}: adapter has {got}, the config's lora section says {want}",
            hint="use an adapter trained with the same lora section (r, alpha, use_rslora)",
        )
    return conf


def check_adapter(adapter_dir: Path, expected: dict[str, torch.Tensor], lora: LoraSection) -> dict[str, torch.Tensor]:
    """The adapter's tensors, cast to the model's dtypes, once keys and shapes match ``expected`` exactly."""
    weights, config = adapter_dir / ADAPTER_WEIGHTS, adapter_dir / ADAPTER_CONFIG
    for p in (weights, config):
        if not p.is_file():
            raise ModelError(
                f"adapter file {p} does not exist", hint=f"an adapter folder holds {', '.join(ADAPTER_FILES)}"
            )
    check_adapter_config(config, lora)
    try:
        state = load_file(weights)
    except (SafetensorError, OSError) as e:
        raise ModelError(f"cannot read {weights}: {e}", hint="the file must be a valid safetensors file") from None
    missing, unexpected = expected.keys() - state.keys(), state.keys() - expected.keys()
    if missing or unexpected:
        raise ModelError(
            f"{weights} does not fit the model: missing {_first(missing) or 'none'}; "
            f"unexpected {_first(unexpected) or 'none'}",
            hint="the adapter was trained for another base model or lora.target_modules",
        )
    bad = [k for k in expected if tuple(state[k].shape) != tuple(expected[k].shape)]
    if bad:
        k = bad[0]
        raise ModelError(
            f"{weights}: {len(bad)} tensors have the wrong shape, e.g. {k} is "
            f"{tuple(state[k].shape)}, the model needs {tuple(expected[k].shape)}",
            hint="check lora.r and the base model",
        )
    return {k: v.to(expected[k].dtype) for k, v in state.items()}


def save_adapter(peft_model, out_dir: Path) -> Path:
    """Save only the "default" adapter's two files into ``out_dir`` (no README, no "ref" adapter)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".save-") as tmp:
        # save_embedding_layers=False: LoRA never trains full embeddings, and "auto" would query the Hub per save
        peft_model.save_pretrained(tmp, selected_adapters=["default"], save_embedding_layers=False)
        for name in ADAPTER_FILES:
            os.replace(Path(tmp) / name, out_dir / name)
    return out_dir
