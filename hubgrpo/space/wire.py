"""The wire's small pieces, shared by the coordinator's endpoints (``hubgrpo.space.api``): answers made strict JSON,
errors as envelopes, the worker's protocol version, a lease as sent, and the caller's token (no gradio here)."""

from __future__ import annotations

import math
import os
import socket
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

from hubgrpo import __version__
from hubgrpo.errors import HubGrpoError, LeaseError, Refused
from hubgrpo.layout import PROTOCOL_VERSION, Lease
from hubgrpo.space.auth import request_token


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago on ``host``."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def plain(value: Any) -> Any:
    """Make ``value`` strict JSON: pydantic models dumped, tuples as lists, NaN/inf as null; else TypeError."""
    if isinstance(value, BaseModel):
        return plain(value.model_dump(mode="json"))
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (str, int, bool)):
        return value
    raise TypeError(f"{type(value).__name__} is not JSON-serialisable")


def error_dict(err: HubGrpoError) -> dict:
    """``err.to_dict()``, plus ``wait_s`` when the error says how long to wait before retrying."""
    d = err.to_dict()
    if err.wait_s is not None:
        d["wait_s"] = float(err.wait_s)
    return d


def check_protocol(protocol: Any) -> None:
    """Refuse a worker that speaks another wire protocol (or does not say), with the install that matches."""
    if protocol == PROTOCOL_VERSION and not isinstance(protocol, bool):
        return
    from hubgrpo.space.view import install_line

    install = install_line(os.environ.get("SPACE_ID"), os.environ.get("HF_ENDPOINT"))
    raise Refused(
        "version",
        f"this coordinator speaks hubgrpo protocol {PROTOCOL_VERSION} (hubgrpo {__version__}); "
        f"the worker sent {str(protocol)[:40]!r}",
        hint=f"{install}, then start the worker again",
    )


def parse_lease(value: Any) -> Lease:
    """Validate a lease sent by a worker; anything malformed is a ``LeaseError`` refusal."""
    try:
        return Lease.model_validate(value)
    except ValidationError as e:
        first: Mapping[str, Any] = e.errors()[0] if e.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ())) or "lease"
        raise LeaseError(
            f"malformed lease ({where}: {first.get('msg', 'invalid')})",
            hint="send the lease exactly as the coordinator returned it",
        ) from None


def caller_token(token: str | None, request: Any) -> str | None:
    """The token a caller sent: the ``token`` argument (gradio_client users), else the request's headers (what
    the hubgrpo client sends): what the auth hook checks and what is redacted from every log and answer."""
    return token or request_token(request)


def redact(text: str, secrets: tuple[Any, ...]) -> str:
    """``text`` with every one of ``secrets`` (the caller's token) replaced by ``***``."""
    for s in secrets:
        if isinstance(s, str) and s:
            text = text.replace(s, "***")
    return text
