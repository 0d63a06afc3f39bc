"""Hostile submission folders: each mutation of an honest adapter folder and the refusal code it must earn
(``HOSTILE``).

A pickle payload (``Payload``) creates ``MARKER`` when unpickled: proof that a file was deserialised with pickle.
"""

from __future__ import annotations

import json
import os
import pickle
import struct
from pathlib import Path

import torch
from safetensors.torch import save_file

WEIGHTS, CONFIG = "adapter_model.safetensors", "adapter_config.json"
KEY = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"
MARKER = Path("/tmp/hubgrpo-admission-pwned")


class Payload:
    """Unpickling this creates MARKER: proof that a file was deserialised with pickle."""

    def __reduce__(self):
        return (os.system, (f"touch {MARKER}",))


def _tensors(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(folder / WEIGHTS))


def _set_tensor(fn):
    def mutate(folder: Path) -> None:
        weights = _tensors(folder)
        fn(weights)
        save_file(weights, str(folder / WEIGHTS))

    return mutate


def set_config(**changes):
    def mutate(folder: Path) -> None:
        config = json.loads((folder / CONFIG).read_text())
        config.update(changes)
        (folder / CONFIG).write_text(json.dumps(config))

    return mutate


def write_file(name: str, data: bytes):
    return lambda folder: (folder / name).write_bytes(data)


def _raw_header(header: dict, data: bytes, declared: int | None = None):
    blob = json.dumps(header).encode()
    return write_file(WEIGHTS, struct.pack("<Q", len(blob) if declared is None else declared) + blob + data)


def _symlink_file(folder: Path) -> None:
    (folder / CONFIG).unlink()
    os.symlink("/etc/hostname", folder / CONFIG)


def _symlink_weights(folder: Path) -> None:
    target = folder.parent / "elsewhere.safetensors"
    (folder / WEIGHTS).rename(target)
    os.symlink(target, folder / WEIGHTS)


def _nested(folder: Path) -> None:
    (folder / "ref").mkdir()
    (folder / "ref" / WEIGHTS).write_bytes((folder / WEIGHTS).read_bytes())


def _truncate(folder: Path) -> None:
    data = (folder / WEIGHTS).read_bytes()
    (folder / WEIGHTS).write_bytes(data[: len(data) - 100])


def _pad(folder: Path) -> None:
    (folder / WEIGHTS).write_bytes((folder / WEIGHTS).read_bytes() + b"\0" * 64)


def _weights_dir(folder: Path) -> None:
    (folder / WEIGHTS).unlink()
    (folder / WEIGHTS).mkdir()


def _huge(folder: Path) -> None:
    _set_tensor(lambda w: w.update({KEY: w[KEY] * 1e4}))(folder)


HOSTILE = {
    "nan": (_set_tensor(lambda w: w[KEY].__setitem__((0, 0), float("nan"))), "nonfinite"),
    "inf": (_set_tensor(lambda w: w[KEY].__setitem__((1, 1), float("inf"))), "nonfinite"),
    "neg_inf": (_set_tensor(lambda w: w[KEY].__setitem__((2, 2), float("-inf"))), "nonfinite"),
    "wrong_shape": (_set_tensor(lambda w: w.update({KEY: torch.zeros(33, 4)})), "shape"),
    "transposed": (_set_tensor(lambda w: w.update({KEY: w[KEY].T.contiguous()})), "shape"),
    "wrong_rank_same_config": (_set_tensor(lambda w: w.update({KEY: torch.zeros(32, 8)})), "shape"),
    "wrong_rank_config": (set_config(r=8), "config_mismatch"),
    "missing_key": (_set_tensor(lambda w: w.pop(KEY)), "missing_keys"),
    "extra_module": (
        _set_tensor(lambda w: w.update({"base_model.model.lm_head.lora_A.weight": torch.zeros(4, 32)})),
        "extra_keys",
    ),
    "dora_magnitude": (
        _set_tensor(lambda w: w.update({KEY.replace("lora_B.weight", "lora_magnitude_vector"): torch.ones(32)})),
        "extra_keys",
    ),
    "float16": (_set_tensor(lambda w: w.update({KEY: w[KEY].half()})), "dtype"),
    "bfloat16": (_set_tensor(lambda w: w.update({KEY: w[KEY].bfloat16()})), "dtype"),
    "int64": (_set_tensor(lambda w: w.update({KEY: w[KEY].long()})), "dtype"),
    "alpha": (set_config(lora_alpha=16), "config_mismatch"),
    "rslora": (set_config(use_rslora=True), "config_mismatch"),
    "dora": (set_config(use_dora=True), "config_mismatch"),
    "targets": (set_config(target_modules=["q_proj", "v_proj"]), "config_mismatch"),
    "base_model": (set_config(base_model_name_or_path="evil/model"), "config_mismatch"),
    "peft_type": (set_config(peft_type="LOHA"), "config_mismatch"),
    "modules_to_save": (set_config(modules_to_save=["lm_head"]), "config_mismatch"),
    "rank_pattern": (set_config(rank_pattern={"q_proj": 2}), "config_mismatch"),
    "config_not_json": (write_file(CONFIG, b"{not json"), "bad_config"),
    "config_list": (write_file(CONFIG, b"[1, 2]"), "bad_config"),
    "config_binary": (write_file(CONFIG, b"\xff\xfe\x00garbage"), "bad_config"),
    "no_config": (lambda f: (f / CONFIG).unlink(), "missing_file"),
    "no_weights": (lambda f: (f / WEIGHTS).unlink(), "missing_file"),
    "pickle_renamed": (write_file(WEIGHTS, pickle.dumps({"w": Payload()})), "corrupt"),
    "torch_save_renamed": (lambda f: torch.save({KEY: torch.zeros(2)}, f / WEIGHTS), "corrupt"),
    "bin_file": (write_file("adapter_model.bin", pickle.dumps(Payload())), "not_safetensors"),
    "pt_file": (write_file("optimizer.pt", b"PK\x03\x04"), "not_safetensors"),
    "pkl_file": (write_file("state.pkl", pickle.dumps(Payload())), "not_safetensors"),
    "truncated": (_truncate, "corrupt"),
    "padded": (_pad, "corrupt"),
    "huge_header_length": (_raw_header({}, b"", declared=2**63), "corrupt"),
    "header_not_json": (write_file(WEIGHTS, struct.pack("<Q", 4) + b"\x80\x04\x95x"), "corrupt"),
    "header_list": (_raw_header([], b""), "corrupt"),
    "offsets_beyond_file": (
        _raw_header({KEY: {"dtype": "F32", "shape": [32, 4], "data_offsets": [0, 512]}}, b"\0" * 16),
        "corrupt",
    ),
    "overlapping_offsets": (
        _raw_header(
            {
                KEY: {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]},
            },
            b"\0" * 12,
        ),
        "corrupt",
    ),
    "bad_dtype_in_header": (
        _raw_header({KEY: {"dtype": "OBJ", "shape": [1], "data_offsets": [0, 8]}}, b"\0" * 8),
        "corrupt",
    ),
    "tiny_file": (write_file(WEIGHTS, b"\x01\x02"), "corrupt"),
    "empty_weights": (write_file(WEIGHTS, b""), "empty_file"),
    "empty_config": (write_file(CONFIG, b""), "empty_file"),
    "empty_readme": (write_file("README.md", b""), "empty_file"),
    "symlink_config": (_symlink_file, "symlink"),
    "symlink_weights": (_symlink_weights, "symlink"),
    "nested_dir": (_nested, "nested_dir"),
    "weights_is_dir": (_weights_dir, "nested_dir"),
    "unknown_file": (write_file("run.sh", b"rm -rf /"), "unexpected_file"),
    "hidden_file": (write_file(".DS_Store", b"x"), "unexpected_file"),
    "huge_norm": (_huge, "norm_outlier"),
}
