"""A request's JSON body, with a round's files in it as base64 text written as they are.

``json.dumps`` scans every character of a string for what to escape; a round's adapter in base64 is tens of
megabytes of characters that never need escaping, so that scan is most of what an ``upload`` costs the worker.
``Base64Text`` marks such a string (base64's alphabet only, checked when it is made); ``json_body`` writes the rest
of the body with ``json.dumps`` and puts each marked string's bytes in its place. The body is the JSON that
``json.dumps`` would write.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

_ALPHABET = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/="
_MARK = "\x00hubgrpo-base64\x00"  # JSON-escaped as \u0000…: no other string of a body dumps to the same bytes


class Base64Text(str):
    """Base64 text (nothing in it to escape in JSON)."""

    __slots__ = ()

    @classmethod
    def of(cls, data: bytes) -> Base64Text:
        """``data`` in base64 (base64's own output: not checked again)."""
        return str.__new__(cls, base64.b64encode(data).decode("ascii"))

    def __new__(cls, text: str) -> Base64Text:
        raw = text.encode("ascii", errors="replace")
        if len(raw) % 4 or raw.translate(None, _ALPHABET) or "=" in text.rstrip("="):
            raise binascii.Error("not base64 text: only A-Z, a-z, 0-9, '+', '/' and '=' padding at the end")
        return super().__new__(cls, text)


def json_body(payload: Any) -> bytes:
    """``payload`` as compact JSON bytes (``json.dumps`` with ``ensure_ascii=False``, ``allow_nan=False``), each
    ``Base64Text`` in lists and dict values copied in without being scanned."""
    raw: list[bytes] = []

    def swap(value: Any) -> Any:
        if isinstance(value, Base64Text):
            raw.append(value.encode("ascii"))
            return _MARK
        if isinstance(value, dict):
            return {k: swap(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [swap(v) for v in value]
        return value

    text = json.dumps(swap(payload), ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
    if not raw:
        return text
    mark = json.dumps(_MARK).encode()
    pieces = text.split(mark)
    if len(pieces) != len(raw) + 1:  # the mark came in from elsewhere (e.g. an echoed field): the plain way
        return json.dumps(payload, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
    out = [pieces[0]]
    for data, piece in zip(raw, pieces[1:]):
        out += [b'"', data, b'"', piece]
    return b"".join(out)
