"""PEFT LoRA adapters as plain tensors: the ``Adapter`` record, key layout, per-module scaling, folder I/O.

A LoRA module adds ``ΔW = s · B · A`` to a frozen weight, with ``A: (r × in)``, ``B: (out × r)`` and
``s = alpha / r`` (or ``alpha / sqrt(r)`` with rsLoRA); ``r`` and ``alpha`` may be overridden per module by
``rank_pattern`` / ``alpha_pattern``. PEFT stores the factors under keys without the adapter name:

    base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight      (r × in)
    base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight      (out × r)
    base_model.model.model.embed_tokens.lora_embedding_A                (r × vocab)
    base_model.model.model.embed_tokens.lora_embedding_B                (dim × r)
    base_model.model.model.embed_tokens.base_layer.weight               frozen base embedding, saved by PEFT
                                                                        when an embedding is targeted

PEFT applies ``ΔW`` transposed for embeddings and for ``fan_in_fan_out`` layers; every merge here is linear in
``B · A``, so the orientation never matters and the factor roles stay the same. Anything that is not plain LoRA
(DoRA magnitudes, ``modules_to_save`` copies, LoRA biases, trainable tokens, parameter targets, …) is refused
with a ``MergeError`` because averaging it as ``s·B·A`` would be wrong.

This module imports torch; keep it out of CLI import paths.
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch

from hubgrpo.errors import MergeError

WEIGHTS_NAME = "adapter_model.safetensors"
CONFIG_NAME = "adapter_config.json"
KEY_PREFIX = "base_model.model."
# suffix -> (role, kind)
LORA_SUFFIXES = {
    ".lora_A.weight": ("A", "linear"),
    ".lora_B.weight": ("B", "linear"),
    ".lora_embedding_A": ("A", "embedding"),
    ".lora_embedding_B": ("B", "embedding"),
}
PASSTHROUGH_SUFFIX = ".base_layer.weight"  # frozen embedding PEFT saves next to an embedding LoRA
# config fields that change the ΔW = s·B·A form (or add trained tensors that are not LoRA factors)
UNSUPPORTED_FIELDS = {
    "use_dora": "DoRA adds a trained magnitude vector; ΔW is no longer s·B·A",
    "modules_to_save": "modules_to_save trains full copies of modules, which are not LoRA factors",
    "lora_bias": "lora_bias trains a bias next to lora_B",
    "trainable_token_indices": "trainable tokens train embedding rows outside the LoRA factors",
    "target_parameters": "parameter targets (e.g. MoE experts) use 3-D LoRA factors",
    "use_qalora": "QA-LoRA pools the input before lora_A",
    "use_bdlora": "block-diagonal LoRA changes the factor layout",
    "kasa_config": "KaSA changes the LoRA forward",
    "velora_config": "VeLoRA changes the LoRA forward",
    "monteclora_config": "MonteCLoRA samples the factors",
    "arrow_config": "Arrow routes between several LoRA experts",
}


@dataclass
class Adapter:
    """A PEFT LoRA adapter in memory: ``weights`` as in adapter_model.safetensors, ``config`` as in
    adapter_config.json (a plain dict)."""

    weights: dict[str, torch.Tensor]
    config: dict = field(default_factory=dict)


@dataclass(frozen=True)
class ModuleSpec:
    """One LoRA module: ``prefix`` is the key prefix, ``path`` the module name PEFT matches patterns against."""

    prefix: str
    kind: str  # "linear" | "embedding"
    rank: int
    out_dim: int
    in_dim: int
    scaling: float

    @property
    def key_a(self) -> str:
        return self.prefix + (".lora_A.weight" if self.kind == "linear" else ".lora_embedding_A")

    @property
    def key_b(self) -> str:
        return self.prefix + (".lora_B.weight" if self.kind == "linear" else ".lora_embedding_B")

    @property
    def path(self) -> str:
        return self.prefix.removeprefix(KEY_PREFIX)


def pattern_value(patterns: dict | None, path: str, default):
    """PEFT's ``get_pattern_key``: the first pattern ``p`` with ``re.match(rf"(.*\\.)?({p})$", path)`` wins."""
    for pattern, value in (patterns or {}).items():
        if re.match(rf"(.*\.)?({pattern})$", path):
            return value
    return default


def module_scaling(config: dict, path: str, rank: int) -> float:
    """``s = alpha / r`` (``alpha / sqrt(r)`` with rsLoRA) for the module ``path``, as PEFT's LoraLayer computes it."""
    r = pattern_value(config.get("rank_pattern"), path, config.get("r", 8))
    alpha = pattern_value(config.get("alpha_pattern"), path, config.get("lora_alpha", 8))
    if int(r) != rank:
        raise MergeError(
            f"module {path}: the factors have rank {rank} but adapter_config.json says r={r}",
            hint="the config (r / rank_pattern) does not belong to these weights",
        )
    return float(alpha) / (math.sqrt(rank) if config.get("use_rslora") else rank)


def check_plain_lora(config: dict) -> None:
    """Refuse adapter configs that are not plain LoRA (see ``UNSUPPORTED_FIELDS``)."""
    if str(config.get("peft_type", "LORA")).upper() != "LORA":
        raise MergeError(f"peft_type {config.get('peft_type')!r} is not LORA; only LoRA adapters can be merged")
    for name, why in UNSUPPORTED_FIELDS.items():
        if config.get(name):
            raise MergeError(
                f"adapter uses {name}={config[name]!r}: {why}, so it cannot be merged exactly",
                hint=f"train plain LoRA adapters (unset {name}) to use hubgrpo merging",
            )
    if config.get("bias", "none") != "none":
        raise MergeError(
            f"adapter trains biases (bias={config['bias']!r}); only LoRA factors can be merged",
            hint="set bias='none' in the LoRA config",
        )


def _split_key(key: str) -> tuple[str, str, str] | None:
    for suffix, (role, kind) in LORA_SUFFIXES.items():
        if key.endswith(suffix):
            return key[: -len(suffix)], role, kind
    return None


def parse_modules(adapter: Adapter) -> tuple[dict[str, ModuleSpec], list[str]]:
    """Map every LoRA module of ``adapter`` to its ``ModuleSpec``; also return the passthrough keys (frozen
    embeddings). Raises ``MergeError`` on anything that is not a plain-LoRA key layout."""
    check_plain_lora(adapter.config)
    parts: dict[str, dict[str, tuple[str, torch.Tensor]]] = {}
    passthrough = []
    for key, tensor in adapter.weights.items():
        split = _split_key(key)
        if split is None:
            if key.endswith(PASSTHROUGH_SUFFIX):
                passthrough.append(key)
                continue
            raise MergeError(
                f"tensor {key!r} is not a LoRA factor (DoRA magnitude, modules_to_save copy, bias?)",
                hint="only plain LoRA adapters (lora_A / lora_B / lora_embedding_A/B) can be merged",
            )
        prefix, role, kind = split
        if tensor.dim() != 2:
            raise MergeError(
                f"{key} has {tensor.dim()} dimensions; only 2-D LoRA factors (Linear, Embedding) are supported",
                hint="convolution LoRA adapters cannot be merged by hubgrpo",
            )
        parts.setdefault(prefix, {})[role] = (kind, tensor)
    specs = {prefix: _module_spec(prefix, roles, adapter.config) for prefix, roles in sorted(parts.items())}
    for key in passthrough:
        owner = key[: -len(PASSTHROUGH_SUFFIX)]
        if owner not in specs or specs[owner].kind != "embedding":
            raise MergeError(
                f"tensor {key!r} is a full base weight outside an embedding LoRA; it cannot be merged",
                hint="only plain LoRA adapters can be merged",
            )
    return specs, sorted(passthrough)


def _module_spec(prefix: str, roles: dict, config: dict) -> ModuleSpec:
    if set(roles) != {"A", "B"}:
        raise MergeError(f"module {prefix} has lora_{''.join(roles)} but not both lora_A and lora_B")
    (kind_a, a), (kind_b, b) = roles["A"], roles["B"]
    if kind_a != kind_b or a.shape[0] != b.shape[1]:
        raise MergeError(f"module {prefix}: A {tuple(a.shape)} and B {tuple(b.shape)} do not form s·B·A")
    rank = int(a.shape[0])
    path = prefix.removeprefix(KEY_PREFIX)
    return ModuleSpec(prefix, kind_a, rank, int(b.shape[0]), int(a.shape[1]), module_scaling(config, path, rank))


def factors(adapter: Adapter, spec: ModuleSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """``(B (out × r), A (r × in))`` of one module, as float32 (scale not applied)."""
    return adapter.weights[spec.key_b].float(), adapter.weights[spec.key_a].float()


def dense_delta(adapter: Adapter) -> dict[str, torch.Tensor]:
    """``s · B · A`` (out × in, float64) per module prefix. Forms dense matrices: for tests and small shapes only.
    Embedding and fan_in_fan_out modules are returned in ``B·A`` orientation (PEFT adds the transpose)."""
    specs, _ = parse_modules(adapter)
    out = {}
    for prefix, spec in specs.items():
        b, a = adapter.weights[spec.key_b].double(), adapter.weights[spec.key_a].double()
        out[prefix] = spec.scaling * (b @ a)
    return out


def load_adapter_dir(path: str | os.PathLike) -> Adapter:
    """Read a PEFT adapter folder (adapter_model.safetensors + adapter_config.json) written by a trusted party.
    Untrusted submissions go through ``hubgrpo.merge.submission_checks.check_submission`` instead."""
    from safetensors.torch import load_file

    folder = Path(path)
    try:
        config = json.loads((folder / CONFIG_NAME).read_text())
        weights = load_file(str(folder / WEIGHTS_NAME))
    except FileNotFoundError as exc:
        raise MergeError(
            f"{folder} is not a PEFT adapter folder: {exc.filename} is missing",
            hint=f"an adapter folder holds {WEIGHTS_NAME} and {CONFIG_NAME}",
        ) from exc
    return Adapter(weights=weights, config=config)


def adapter_bytes(adapter: Adapter) -> tuple[bytes, bytes]:
    """The two files of ``adapter`` as ``save_adapter_dir`` writes them: (adapter_model.safetensors, config)."""
    from safetensors.torch import save

    tensors = {k: v.detach().contiguous().cpu() for k, v in adapter.weights.items()}
    return save(tensors, metadata={"format": "pt"}), (json.dumps(adapter.config, indent=2) + "\n").encode()


def save_adapter_dir(adapter: Adapter, path: str | os.PathLike) -> Path:
    """Write ``adapter`` as a PEFT folder loadable with ``PeftModel.from_pretrained`` (files replaced atomically)."""
    from safetensors.torch import save_file

    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().contiguous().cpu() for k, v in adapter.weights.items()}
    for name, write in (
        (WEIGHTS_NAME, lambda p: save_file(tensors, p, metadata={"format": "pt"})),
        (CONFIG_NAME, lambda p: Path(p).write_text(json.dumps(adapter.config, indent=2) + "\n")),
    ):
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=".tmp")
        os.close(fd)
        try:
            write(tmp)
            os.replace(tmp, folder / name)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return folder
