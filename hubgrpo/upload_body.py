"""The ``upload`` route's binary body: a round's files as they are, without base64 or a JSON string around them.

    u32 little-endian n · n bytes of JSON {"data": [lease, {file name: size, …}, token]} · the files' bytes

Sent as ``Content-Type: application/octet-stream`` to ``POST /hubgrpo/api/upload`` (``hubgrpo.space.routes``): the
same arguments as the JSON body, with the files' sizes where the JSON body has their base64 text, and the bytes
after the JSON in the order it names them. The server reads it only within the route's body limit, parses the JSON
head as strictly as any JSON body (at most ``MAX_HEAD`` bytes), and takes the files only if their sizes are
non-negative integers that add up to exactly the bytes that follow. Base64 costs a third more bytes on the wire
and, with the JSON around it, most of an upload's CPU on both sides (``benchmarks/round/results``).
"""

from __future__ import annotations

import json
import struct
from typing import Any

MEDIA_TYPE = "application/octet-stream"
MAX_HEAD = 1 << 20  # a lease, four names and sizes: far below this
FILES_AT = 1  # the position of the files in the endpoint's arguments (lease, files, token)


def pack(args: list[Any]) -> bytes:
    """The body for the arguments ``args`` of ``upload``, whose ``args[FILES_AT]`` is ``{file name: bytes}``."""
    files = args[FILES_AT]
    head = json.dumps(
        {"data": [*args[:FILES_AT], {k: len(v) for k, v in files.items()}, *args[FILES_AT + 1 :]]},
        ensure_ascii=False,
        separators=(",", ":"),
        allow_nan=False,
    ).encode()
    return b"".join([struct.pack("<I", len(head)), head, *files.values()])


def split(body: bytes) -> tuple[bytes, memoryview]:
    """(the JSON head, the files' bytes) of ``body``; ``ValueError`` naming what is wrong."""
    if len(body) < 4:
        raise ValueError("the body is shorter than its 4-byte head length")
    (n,) = struct.unpack("<I", body[:4])
    if n > min(MAX_HEAD, len(body) - 4):
        raise ValueError(f"the head claims {n:,} bytes (at most {MAX_HEAD:,}, and within the body)")
    view = memoryview(body)
    return bytes(view[4 : 4 + n]), view[4 + n :]


def files(sizes: Any, data: memoryview) -> dict[str, bytes]:
    """``{file name: bytes}`` cut from ``data`` by the head's ``{file name: size}``; ``ValueError`` unless every
    size is a non-negative integer and together they are exactly ``data``."""
    if not isinstance(sizes, dict):
        raise ValueError("the head's files are not an object of {file name: size}")
    if any(not isinstance(v, int) or isinstance(v, bool) or v < 0 for v in sizes.values()):
        raise ValueError("a file's size is not a non-negative integer")
    if sum(sizes.values()) != len(data):
        raise ValueError(f"the head names {sum(sizes.values()):,} bytes of files, the body holds {len(data):,}")
    out, pos = {}, 0
    for name, size in sizes.items():
        out[name] = bytes(data[pos : pos + size])
        pos += size
    return out
