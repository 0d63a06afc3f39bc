"""Adapter folders on disk: a strict check before loading, and saving only the "default" adapter.

A PEFT adapter folder holds ``adapter_model.safetensors`` + ``adapter_config.json`` (``ADAPTER_FILES``). Loading
never ignores missing or unexpected keys: an adapter that does not fit the engine's model and LoRA config (rank,
alpha, rsLoRA, target modules → keys, shapes) is a ``ModelError`` naming the first differences.

``LiveAdapter`` is the worker's fast path for its own model, which loads and saves an adapter every round: PEFT's
``get_peft_model_state_dict`` / ``set_peft_model_state_dict`` / ``save_pretrained`` walk the whole model's state dict
on every call (tens of ms each on SmolLM2, a few % of a one-step round). It matches PEFT's own state dict to the live
parameters once, then copies into them and writes them directly.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

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


def _bound(state: dict[str, torch.Tensor], model) -> dict[str, torch.nn.Parameter] | None:
    """Each saved name's parameter: the one whose whole storage the state's tensor views (same data pointer, shape,
    stride and dtype; no parameter twice); None when any tensor is not such a view."""
    by_pointer = {p.data_ptr(): p for p in model.parameters()}
    params: dict[str, torch.nn.Parameter] = {}
    taken: set[int] = set()
    for key, view in state.items():
        param = by_pointer.get(view.data_ptr())
        if param is None or id(param) in taken:
            return None
        if (param.shape, param.stride(), param.dtype) != (view.shape, view.stride(), view.dtype):
            return None
        params[key] = param
        taken.add(id(param))
    return params


class LiveAdapter:
    """A PeftModel's "default" adapter as PEFT saves it (the same keys), bound to the live parameters: found once
    from PEFT's state dict, whose tensors are views of them. ``params`` is None when some saved tensor is not a
    whole parameter; then every method uses PEFT's own function."""

    def __init__(self, peft_model) -> None:
        self.model = peft_model
        self.params = _bound(self._peft_state(), peft_model)
        self.config: bytes | None = None  # adapter_config.json as PEFT wrote it at the first save

    def _peft_state(self) -> dict[str, torch.Tensor]:
        from peft import get_peft_model_state_dict

        # save_embedding_layers=False: no full embeddings are trained, and "auto" looks up the base model on the Hub
        return get_peft_model_state_dict(self.model, adapter_name="default", save_embedding_layers=False)

    def state(self) -> dict[str, torch.Tensor]:
        """Key → the parameter's tensor (a view, as PEFT's state dict gives it)."""
        if self.params is None:
            return self._peft_state()
        return {k: p.detach() for k, p in self.params.items()}

    @torch.no_grad()
    def load(self, state: dict[str, torch.Tensor], source: str = "adapter") -> None:
        """Copy a checked state (``check_adapter``: the same keys and shapes) into the parameters; ``source`` names
        it in an error."""
        if self.params is None:
            from peft import set_peft_model_state_dict

            result: Any = set_peft_model_state_dict(self.model, state, adapter_name="default")  # peft: `namedtuple`
            if result.unexpected_keys:
                raise ModelError(f"{source}: peft did not place {sorted(result.unexpected_keys)[:3]}")
            return
        for key, param in self.params.items():
            param.copy_(state[key])

    def save(self, out_dir: Path) -> Path:
        """The adapter folder PEFT's ``save_pretrained`` writes (its config bytes from the first save)."""
        if self.params is None or self.config is None:
            save_adapter(self.model, out_dir)
            self.config = (out_dir / ADAPTER_CONFIG).read_bytes()
            return out_dir
        out_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=out_dir, prefix=".save-") as tmp:
            tensors = {k: p.detach().cpu().contiguous() for k, p in self.params.items()}
            save_file(tensors, str(Path(tmp) / ADAPTER_WEIGHTS), metadata={"format": "pt"})
            (Path(tmp) / ADAPTER_CONFIG).write_bytes(self.config)
            for name in ADAPTER_FILES:
                os.replace(Path(tmp) / name, out_dir / name)
        return out_dir
