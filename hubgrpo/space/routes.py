"""The coordinator's JSON API as plain HTTP routes on the Gradio app: ``POST /hubgrpo/api/<name>``.

The same endpoint functions as the ``gr.api`` endpoints (``hubgrpo.space.endpoints.CoordinatorApi``), the same
positional arguments in a body ``{"data": [args…]}``, the same envelope as the answer (not wrapped in Gradio's
``{"data": [...]}``) — without Gradio's routing, pre- and post-processing, which cost most of the server's CPU per
call (``benchmarks/load/coordinator_load.py`` measures both). The app, its page and its ``gr.api`` endpoints stay as
they are (one Space still; gradio_client users see no change).

One difference from the ``gr.api`` endpoints: ``submit`` answers ``checking`` at once and the check runs in the
background (``hubgrpo.space.admission_queue``; ``verdict`` tells how it went).

Everything a caller sends is hostile until checked. In front of every route of the app, ``hubgrpo.space.guard``
bounds bodies before anyone is known (64 KiB), times them, and gives the run's users their upload slots. Here,
before an endpoint function runs: the body must be ``application/json`` (415 otherwise: no HTML form and no
``text/plain`` "simple request" of another site can carry a browser's cookie here), or for ``upload`` the binary
body of ``hubgrpo.upload_body`` (``application/octet-stream``, no simple request either: its JSON head is held to
every rule below, and its files' sizes must add up to the bytes that follow); on a coordinator with auth, a
mutating endpoint (``MUTATING``) must come with a token in the ``Authorization: Bearer`` header that names a user
of the run, checked BEFORE the body is read (401 / 429 otherwise; the ``token`` argument of gradio_client users
is still accepted on Gradio's routes, and the endpoint functions check the caller again); the body must be at most
``MAX_BODY`` bytes (``status``, which anyone may call: ``guard.PRE_AUTH_BODY``; ``upload``: the limit its app
derives from the run), strict JSON (no NaN/Infinity, no number out of float range or longer than ``MAX_NUMBER``
digits, nesting at most ``MAX_DEPTH`` deep, no lone surrogates) of the form ``{"data": [...]}``, and its
arguments must fit the endpoint's signature: their count, and the JSON type each parameter is annotated with
(``str``, ``int``, ``float``, ``dict``, optionally ``| None``). Anything else is answered 400/401/404/413/415/429
with an envelope naming the problem; the endpoint functions themselves answer envelopes and never raise. Nothing
here logs a body or a header.

The endpoint functions run on a thread pool of their own (``THREADS``): a lease waiting for a merge holds one
thread, never the event loop nor Gradio's threads.
"""

from __future__ import annotations

import inspect
import json
import math
import typing
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hubgrpo import upload_body
from hubgrpo.space.guard import PRE_AUTH_BODY, envelope, refusal

if TYPE_CHECKING:
    from hubgrpo.space.endpoints import CoordinatorLike

PREFIX = "/hubgrpo/api"
MAX_BODY = 1 << 20  # a lease, a commit id, a token: far below this
BINARY = frozenset({"upload"})  # endpoints that also take a binary body (``hubgrpo.upload_body``)
MUTATING = frozenset(
    {"lease", "heartbeat", "release", "submit", "verdict", "record_eval", "record_verdict", "round_files", "upload"}
)  # every endpoint but status: each needs a caller (round_files changes nothing, but hands out rounds' completions)
MAX_DEPTH = 32  # a lease is 3 levels deep
MAX_NUMBER = 40  # characters of one JSON number
THREADS = 64  # endpoint calls running at once (each mostly waits: for the coordinator's lock, or a lease for a merge)


class BadRequest(Exception):
    """A request refused before any endpoint function runs: HTTP ``status`` and what is wrong."""

    def __init__(self, status: int, message: str, hint: str = "send what the hubgrpo client sends"):
        super().__init__(message)
        self.status, self.message, self.hint = status, message, hint


async def read_body(request: Any, limit: int) -> bytes:
    """The request body; ``BadRequest(413)`` once it is longer than ``limit`` (read no further)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BadRequest(413, f"the body ({int(declared):,} bytes) is larger than the limit of {limit:,} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BadRequest(413, f"the body is larger than the limit of {limit:,} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _number(text: str) -> float:
    if len(text) > MAX_NUMBER:
        raise ValueError(f"a number of {len(text)} characters (at most {MAX_NUMBER})")
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text} is out of range")
    return value


def _integer(text: str) -> int:
    if len(text) > MAX_NUMBER:
        raise ValueError(f"a number of {len(text)} characters (at most {MAX_NUMBER})")
    return int(text)


def _constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


def _check_tree(value: Any) -> None:
    """Depth and strings of a parsed body (iteratively: a deep body cannot exhaust the stack here)."""
    todo = [(value, 1)]
    while todo:
        item, depth = todo.pop()
        if isinstance(item, (dict, list)):
            if depth > MAX_DEPTH:
                raise ValueError(f"nested deeper than {MAX_DEPTH} levels")
            children = list(item.keys()) + list(item.values()) if isinstance(item, dict) else item
            todo.extend((c, depth + 1) for c in children)
        elif isinstance(item, str) and not item.isascii():
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError("a string with a lone surrogate") from None


def parse_arguments(raw: bytes) -> list:
    """The ``data`` list of a strict-JSON body ``{"data": [...]}``; ``BadRequest(400)`` naming what is wrong."""
    try:
        body = json.loads(raw, parse_float=_number, parse_int=_integer, parse_constant=_constant)
        _check_tree(body)
    except RecursionError:
        raise BadRequest(400, f"the body is not accepted JSON: nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as e:  # also UnicodeDecodeError and json.JSONDecodeError
        raise BadRequest(400, f"the body is not accepted JSON: {str(e)[:200]}") from None
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        raise BadRequest(400, "the body is not a JSON object with a 'data' list", 'send {"data": [arguments…]}')
    return data


def parse_binary(raw: bytes) -> list:
    """The ``data`` list of a binary ``upload`` body (``hubgrpo.upload_body``): its JSON head as strict as any
    body, the files cut from the bytes after it; ``BadRequest(400)`` naming what is wrong."""
    try:
        head, data = upload_body.split(raw)
    except ValueError as e:
        raise BadRequest(400, f"the binary body is not an upload: {e}", "send what the hubgrpo client sends") from None
    args = parse_arguments(head)
    if len(args) <= upload_body.FILES_AT:
        raise BadRequest(400, "the binary body's head names no files", "send what the hubgrpo client sends")
    try:
        args[upload_body.FILES_AT] = upload_body.files(args[upload_body.FILES_AT], data)
    except ValueError as e:
        raise BadRequest(400, f"the binary body is not an upload: {e}", "send what the hubgrpo client sends") from None
    return args


# ------------------------------------------------------------------------------------------------ signatures

_JSON_TYPES = {str: (str,), int: (int,), float: (int, float), dict: (dict,), list: (list,), bool: (bool,)}


def _accepted(annotation: Any) -> tuple | None:
    """The Python types of parsed JSON a parameter annotated ``annotation`` accepts; None: anything."""
    if annotation in _JSON_TYPES:
        return _JSON_TYPES[annotation]
    args = typing.get_args(annotation)
    if args and type(None) in args:
        inner = [_accepted(a) for a in args if a is not type(None)]
        kinds = [i for i in inner if i is not None]
        if len(kinds) == len(inner):
            return tuple(t for i in kinds for t in i) + (type(None),)
    return None


def signature_check(name: str, fn: Callable) -> Callable[[list], None]:
    """A check of the positional arguments ``fn`` (an endpoint function) is called with; ``BadRequest(400)``."""
    params = [p for p in inspect.signature(fn).parameters.values() if p.name != "request"]
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # deliberate: an annotation that does not resolve only means no type check for it
        hints = {}
    required = sum(1 for p in params if p.default is inspect.Parameter.empty)
    types = [(p.name, _accepted(hints.get(p.name, Any))) for p in params]

    def check(args: list) -> None:
        if not required <= len(args) <= len(params):
            raise BadRequest(
                400,
                f"{name!r} takes {required} to {len(params)} arguments "
                f"({', '.join(p.name for p in params)}), not {len(args)}",
                "client and coordinator versions may differ",
            )
        for i, (value, (pname, ok)) in enumerate(zip(args, types)):
            if ok is not None and (not isinstance(value, ok) or (isinstance(value, bool) and bool not in ok)):
                want = " or ".join("null" if t is type(None) else t.__name__ for t in ok)
                raise BadRequest(
                    400, f"argument {i + 1} ({pname}) of {name!r} must be {want}, not {type(value).__name__}"
                )

    return check


# ------------------------------------------------------------------------------------------------ the route


def make_route(
    endpoints: dict[str, Callable[..., dict]], limits: dict[str, int] | None = None, auth: Any = None
) -> Callable:
    """The Starlette endpoint serving ``endpoints`` (name → function answering an envelope); ``limits``: body
    limits other than ``MAX_BODY``; ``auth``: the app's auth hook (its ``identify`` checks the header)."""
    import anyio
    from starlette.responses import Response

    threads = anyio.CapacityLimiter(THREADS)
    checks = {name: signature_check(name, fn) for name, fn in endpoints.items()}
    limits = {"status": PRE_AUTH_BODY, **(limits or {})}
    identify = getattr(auth, "identify", None)

    async def handle(name: str, request: Any, binary: bool) -> Any:
        if identify is not None and name in MUTATING:
            refusal = await authenticate(identify, request, threads)
            if refusal is not None:
                return refusal
        raw = await read_body(request, limits.get(f"{name}:binary" if binary else name, limits.get(name, MAX_BODY)))
        args = (parse_binary if binary else parse_arguments)(raw)
        checks[name](args)
        answer = await anyio.to_thread.run_sync(lambda: endpoints[name](*args, request=request), limiter=threads)
        try:
            text = json.dumps(answer, allow_nan=False, separators=(",", ":"))
        except (TypeError, ValueError):
            text = json.dumps(
                {
                    "ok": False,
                    "error": {
                        "error": "CoordinatorError",
                        "code": "internal",
                        "message": f"{name!r} answered what JSON cannot carry",
                        "hint": "a coordinator bug; retry later",
                    },
                }
            )
        return Response(text, media_type="application/json")

    async def route(request: Any) -> Any:
        name = request.path_params["name"]
        if name not in endpoints:
            return envelope(
                404,
                f"no endpoint {name[:60]!r} here (endpoints: {', '.join(sorted(endpoints))})",
                "client and coordinator versions may differ",
            )
        media = request.headers.get("content-type", "").split(";")[0].strip().lower()
        binary = media == upload_body.MEDIA_TYPE and name in BINARY
        if media != "application/json" and not binary:
            return _unsupported(name, media)
        try:
            return await handle(name, request, binary)
        except BadRequest as e:
            return envelope(e.status, f"{name}: {e.message}", e.hint)

    return route


def _unsupported(name: str, media: str) -> Any:
    """The 415 answer to a body of another media type than ``name`` takes."""
    takes = "application/json" + (f" or {upload_body.MEDIA_TYPE}" if name in BINARY else "")
    return envelope(
        415,
        f"{name}: the body must be {takes}, not {media[:60] or 'untyped'}",
        'send the JSON body {"data": [arguments…]} with Content-Type: application/json',
    )


async def authenticate(identify: Callable, request: Any, threads: Any) -> Any:
    """None when the ``Authorization: Bearer`` header names a user of the run (``HubAuth.identify``, a lookup on
    a cache miss: in a thread); else the refusal to answer (401 / 429 / 503), before any body is read."""
    import anyio

    from hubgrpo.errors import HubGrpoError
    from hubgrpo.space.auth import request_token

    try:
        await anyio.to_thread.run_sync(identify, request_token(request), request, limiter=threads)
        return None
    except HubGrpoError as e:
        return refusal(e)


def attach(
    app: Any,
    endpoints: dict[str, Callable[..., dict]],
    limits: dict[str, int] | None = None,
    auth: Any = None,
    coord: CoordinatorLike | None = None,
) -> None:
    """Add ``POST {PREFIX}/{name}`` to the Starlette/FastAPI ``app`` (once; later calls add nothing), and with
    ``coord`` the ``GET`` adapter route (``hubgrpo.space.adapter_route``)."""
    import anyio
    from starlette.routing import Route

    if getattr(app, "hubgrpo_routes", False):
        return
    app.router.routes.insert(0, Route(PREFIX + "/{name}", make_route(endpoints, limits, auth), methods=["POST"]))
    if coord is not None:
        from hubgrpo.space.adapter_route import make_adapter_route

        route = make_adapter_route(coord, auth, anyio.CapacityLimiter(THREADS), authenticate)
        app.router.routes.insert(0, Route(PREFIX + "/adapter/{version}/{aid}/{name}", route, methods=["GET"]))
    app.hubgrpo_routes = True
