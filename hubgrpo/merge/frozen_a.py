"""FFA rounds without their A factors: the worker leaves them out, the coordinator puts the run's back.

With ``merge.method: ffa`` every lora_A is the version-0 draw, frozen and shared by every version and every
round (the coordinator refuses a round whose A differs: ``a_changed``). A round's A factors thus carry no
information, and they are half of a LoRA adapter's bytes. A worker of such a run sends its adapter without them
(``strip_a``: the safetensors file cut down byte for byte, no tensor parsed), and the coordinator completes what it
received with the run's own A tensors before any other check (``complete_a``): the completed adapter is exactly
what the worker trained, every later check and the merge see the full adapter, and the A tensors that are still
sent (by an older worker, or smuggled in) are checked against the run's as before.
"""

from __future__ import annotations

import json
import struct

A_MARKERS = (".lora_A", ".lora_embedding_A")


def is_a_key(key: str) -> bool:
    """Whether ``key`` names a LoRA A factor (``….lora_A.weight``, ``….lora_embedding_A``)."""
    return any(m in key for m in A_MARKERS)


def strip_a(data: bytes) -> bytes:
    """The safetensors file ``data`` without its A tensors (the other tensors' bytes and the metadata as they
    are); ``data`` itself when it has none. Raises ``ValueError`` on bytes that are not a safetensors file."""
    if len(data) < 8:
        raise ValueError("not a safetensors file: shorter than its header length")
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8:
        raise ValueError("not a safetensors file: its header runs past the end")
    header = json.loads(data[8 : 8 + n])
    if not isinstance(header, dict):
        raise ValueError("not a safetensors file: its header is not a JSON object")
    meta = header.pop("__metadata__", None)
    if not any(is_a_key(k) for k in header):
        return data
    start = 8 + n
    kept = sorted(((k, v) for k, v in header.items() if not is_a_key(k)), key=lambda kv: kv[1]["data_offsets"][0])
    out_header: dict = {} if meta is None else {"__metadata__": meta}
    pieces, pos = [], 0
    for key, info in kept:
        begin, end = (int(x) for x in info["data_offsets"])
        if not 0 <= begin <= end <= len(data) - start:
            raise ValueError(f"not a safetensors file: {key} lies outside the data")
        out_header[key] = {**info, "data_offsets": [pos, pos + end - begin]}
        pieces.append(memoryview(data)[start + begin : start + end])
        pos += end - begin
    text = json.dumps(out_header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    return b"".join([struct.pack("<Q", len(text)), text, *pieces])


def same(x, y) -> bool:
    """Whether tensors ``x`` and ``y`` are equal; at once when they are one object (the run's own A, put into a
    round by ``complete_a``: nothing of the submission's to compare)."""
    return x is y or bool(x.equal(y))


def complete_a(weights: dict, reference: dict) -> dict:
    """``weights`` with every A tensor of ``reference`` (the run's adapter) that it lacks put in (the same tensor
    objects); an A it holds is left for the checks (shape, dtype, ``a_changed``)."""
    missing = {k: v for k, v in reference.items() if is_a_key(k) and k not in weights}
    return {**weights, **missing} if missing else weights
