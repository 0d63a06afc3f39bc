"""Untrusted files of a submission: read without following links, and safetensors parsed by hand before loading.

A refusal here is an ``InvalidSubmission`` (``refuse``); ``hubgrpo.merge.submission_checks`` lists the codes.
Nothing is ever unpickled: weights are read only as safetensors, whose header (a u64 length, then JSON naming each
tensor's dtype, shape and byte span) is checked to tile the data exactly before the bytes reach
``safetensors.torch.load``.
"""

from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path
from typing import NoReturn

from hubgrpo.errors import InvalidSubmission

WEIGHTS_NAME = "adapter_model.safetensors"
MAX_HEADER_BYTES = 100_000_000  # safetensors' own limit
SAFETENSORS_DTYPES = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "U16": 2,
    "U32": 4,
    "U64": 8,
}
HINT_RETRAIN = "train from the global adapter (download it at your lease's base version) and submit what PEFT saves"


def refuse(code: str, message: str, hint: str | None = HINT_RETRAIN) -> NoReturn:
    """Refuse the submission: ``InvalidSubmission(code, message, hint=hint)``."""
    raise InvalidSubmission(code, message, hint=hint)


def read_plain(path: Path, size: int, limit: int) -> bytes:
    """Read a regular file without following a symlink swapped in after the listing, at most ``limit`` bytes."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        refuse("symlink", f"{path.name} could not be opened as a plain file ({exc.strerror})")
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(min(size, limit) + 1)
    if len(data) != size:
        refuse("corrupt", f"{path.name} changed size while it was read")
    return data


def parse_header(data: bytes) -> dict:
    """Validate the safetensors layout: u64 header length, JSON header, dtype/shape/offsets tiling the data."""
    if len(data) < 8:
        refuse("corrupt", f"{WEIGHTS_NAME} is {len(data)} bytes, shorter than a safetensors header")
    (n,) = struct.unpack("<Q", data[:8])
    if n > min(len(data) - 8, MAX_HEADER_BYTES):
        refuse(
            "corrupt",
            f"{WEIGHTS_NAME} claims a {n:,}-byte header in a {len(data):,}-byte file (truncated, or "
            "not a safetensors file)",
        )
    try:
        header = json.loads(data[8 : 8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        refuse("corrupt", f"the header of {WEIGHTS_NAME} is not JSON; the file is not a safetensors file")
    except RecursionError:
        refuse("nested_json", f"the header of {WEIGHTS_NAME} is nested too deeply to be a safetensors header")
    if not isinstance(header, dict):
        refuse("corrupt", f"the header of {WEIGHTS_NAME} is not a JSON object")
    header.pop("__metadata__", None)
    spans = []
    for key, info in header.items():
        try:
            width = SAFETENSORS_DTYPES[info["dtype"]]
            numel = math.prod(int(d) for d in info["shape"])
            begin, end = (int(x) for x in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            refuse("corrupt", f"tensor {key!r} has an invalid entry in the header of {WEIGHTS_NAME}")
        if end - begin != numel * width or begin < 0:
            refuse("corrupt", f"tensor {key!r} declares {end - begin} bytes for {numel} {info['dtype']} values")
        spans.append((begin, end))
    spans.sort()
    pos = 0
    for begin, end in spans:
        if begin != pos:
            refuse("corrupt", f"the tensors of {WEIGHTS_NAME} overlap or leave gaps")
        pos = end
    if 8 + n + pos != len(data):
        refuse(
            "corrupt",
            f"{WEIGHTS_NAME} holds {len(data) - 8 - n:,} data bytes but its header describes {pos:,} "
            "(truncated or padded)",
        )
    return header


def read_safetensors(path: Path, size: int) -> dict:
    """Tensors of an untrusted safetensors file (bounds-checked header, then ``safetensors.torch.load``)."""
    data = read_plain(path, size, size)
    parse_header(data)
    from safetensors.torch import load

    try:
        return load(data)
    except Exception as exc:  # any parser failure of untrusted bytes is a refusal, not a crash
        refuse("corrupt", f"{WEIGHTS_NAME} does not parse as safetensors ({type(exc).__name__}: {exc})")
