"""FFA rounds without their A factors: the worker leaves them out, the coordinator puts the run's back.

With ``merge.method: ffa`` every lora_A is the version-0 draw, frozen and shared by every version and every
round (the coordinator refuses a round whose A differs: ``a_changed``). A round's A factors thus carry no
information, and they are half of a LoRA adapter's bytes. A worker of such a run sends its adapter without them
(``strip_a``: the safetensors file cut down byte for byte, no tensor parsed), and the coordinator completes what it
received with the run's own A tensors before any other check (``complete_a``): the completed adapter is exactly
what the worker trained, every later check and the merge see the full adapter, and the A tensors that are still
sent (by an older worker, or smuggled in) are checked against the run's as before.

Downloads the other way: a worker that holds one version of the run (its A factors) asks the coordinator for a
newer one as ``WITHOUT_A`` (the weights file's header as it is, then its tensors' bytes but the A factors'),
puts the A bytes of the version it holds back in (``with_a``) and checks the result against the adapter id the
lease or the status names, as for any download: the versions stay whole PEFT adapters everywhere.
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
    n, header = _header(data)
    meta = json.loads(data[8 : 8 + n]).get("__metadata__")
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


def complete_a(weights: dict, reference: dict) -> dict:
    """``weights`` with every A tensor of ``reference`` (the run's adapter) that it lacks put in (the same tensor
    objects); an A it holds is left for the checks (shape, dtype, ``a_changed``)."""
    missing = {k: v for k, v in reference.items() if is_a_key(k) and k not in weights}
    return {**weights, **missing} if missing else weights


# ------------------------------------------------------------------------------------------------ downloads

WITHOUT_A = "adapter_model.safetensors.without-a"  # a version's weights file, its A tensors' bytes left out


def without_a(data: bytes) -> bytes:
    """The file ``WITHOUT_A`` serves: the safetensors file ``data``'s header as it is, then the bytes of its
    tensors other than the A factors, in the order of their offsets (``with_a`` puts the A factors back)."""
    n, header = _header(data)
    spans = sorted((int(v["data_offsets"][0]), int(v["data_offsets"][1]), k) for k, v in header.items())
    start = 8 + n
    return b"".join([data[:start], *(data[start + b : start + e] for b, e, k in spans if not is_a_key(k))])


def with_a(without: bytes, source: bytes) -> bytes:
    """The whole safetensors file from ``without`` (``without_a`` of it) and the A tensors of ``source``, another
    file of the same run (the A factors are frozen: the same bytes in every version). ``ValueError`` when they do
    not fit; the caller checks the result against the version's adapter id all the same."""
    n, header = _header(without)
    sn, source_header = _header(source)
    out, pos = [without[: 8 + n]], 8 + n
    for begin, end, key in sorted((int(v["data_offsets"][0]), int(v["data_offsets"][1]), k) for k, v in header.items()):
        if not is_a_key(key):
            out.append(without[pos : pos + end - begin])
            pos += end - begin
            continue
        theirs = source_header.get(key)
        if not isinstance(theirs, dict) or (theirs.get("dtype"), theirs.get("shape")) != (
            header[key].get("dtype"),
            header[key].get("shape"),
        ):
            raise ValueError(f"{key} is not in the other version's file with the same dtype and shape")
        b, e = (int(x) for x in theirs["data_offsets"])
        if e - b != end - begin:
            raise ValueError(f"{key} has another size in the other version's file")
        out.append(source[8 + sn + b : 8 + sn + e])
    if pos != len(without):
        raise ValueError(f"the file without A holds {len(without) - pos:,} bytes its header does not name")
    return b"".join(out)


def _header(data: bytes) -> tuple[int, dict]:
    """(header length, tensor entries) of a safetensors file; ``ValueError`` when it is not one."""
    if len(data) < 8:
        raise ValueError("not a safetensors file: shorter than its header length")
    (n,) = struct.unpack("<Q", data[:8])
    if n > min(len(data) - 8, 100_000_000):
        raise ValueError("not a safetensors file: its header runs past the end")
    header = json.loads(data[8 : 8 + n])
    if not isinstance(header, dict):
        raise ValueError("not a safetensors file: its header is not a JSON object")
    header.pop("__metadata__", None)
    for key, info in header.items():
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(x, int) for x in offsets)):
            raise ValueError(f"not a safetensors file: {str(key)[:80]} has no data offsets")
        if not 0 <= offsets[0] <= offsets[1]:
            raise ValueError(f"not a safetensors file: {str(key)[:80]} has offsets out of order")
    return n, header
