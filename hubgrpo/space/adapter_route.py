"""``GET /hubgrpo/api/adapter/<version>/<adapter id>/<file>``: a recent version's adapter, served by the coordinator.

Versions between checkpoints are not in the run repo, so workers download the one they leased (and rebasing
rounds each newer one) here (``hubgrpo.worker.downloads``). A version is addressed by its number AND its adapter
id (``layout.adapter_id``): the answer for one address never changes, so it carries ``ETag`` and
``Cache-Control: private, max-age=31536000, immutable`` (a repeated request with ``If-None-Match`` gets 304); a
version this coordinator does not have under that id (lost with a restart, evicted, never made) is 404 with an
envelope naming it. On a coordinator with auth the ``Authorization: Bearer`` token must name a user of the run,
checked before anything else is done (as for the mutating routes). The path is checked before it names a folder:
a number, 40 lowercase hex digits, one of the two file names.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hubgrpo import layout
from hubgrpo.space.guard import envelope

if TYPE_CHECKING:
    from hubgrpo.space.endpoints import CoordinatorLike

FILES = {layout.ADAPTER_WEIGHTS: "application/octet-stream", layout.ADAPTER_CONFIG: "application/json"}
_ID = re.compile(r"[0-9a-f]{40}")
_VERSION = re.compile(r"[0-9]{1,10}")  # ASCII digits only ('²'.isdigit() is True)
CHUNK = 1 << 20
CACHE = "private, max-age=31536000, immutable"


def _chunks(f):
    """The open file in 1 MiB pieces, closed at the end (Starlette iterates it in a worker thread)."""
    try:
        while chunk := f.read(CHUNK):
            yield chunk
    finally:
        f.close()


def make_adapter_route(coord: CoordinatorLike, auth: Any, threads: Any, authenticate: Callable) -> Callable:
    """The Starlette endpoint serving ``coord.version_dir(version, adapter_id)``'s files; ``authenticate`` is the
    plain routes' check of the ``Authorization`` header (``routes.authenticate``)."""
    import anyio
    from starlette.responses import Response, StreamingResponse

    from hubgrpo.errors import NotFound

    identify = None if auth is None else getattr(auth, "identify", None) or auth  # never open when auth is on

    def open_file(version: int, aid: str, name: str):
        return open(coord.version_dir(version, aid) / name, "rb")  # open: readable even if evicted meanwhile

    async def route(request: Any) -> Any:
        version, aid, name = (request.path_params.get(k, "") for k in ("version", "aid", "name"))
        if not (_VERSION.fullmatch(version) and _ID.fullmatch(aid) and name in FILES):
            return envelope(
                404,
                f"no such adapter file: the path is /hubgrpo/api/adapter/<version>/<adapter id>/<{' | '.join(FILES)}>",
                "lease a round: the lease names the version and its id",
            )
        if identify is not None:
            refused = await authenticate(identify, request, threads)
            if refused is not None:
                return refused
        etag = f'"{aid}-{name}"'
        if request.headers.get("if-none-match") == etag:
            return Response(status_code=304, headers={"ETag": etag, "Cache-Control": CACHE})
        try:
            f = await anyio.to_thread.run_sync(open_file, int(version), aid, name, limiter=threads)
        except NotFound as e:
            return envelope(404, e.message, e.hint or "lease again")
        except FileNotFoundError:  # evicted between the lookup and the open
            return envelope(404, f"version {version} left the coordinator's cache", "lease again")
        size = os.fstat(f.fileno()).st_size
        return StreamingResponse(
            _chunks(f),
            media_type=FILES[name],
            headers={"ETag": etag, "Cache-Control": CACHE, "Content-Length": str(size)},
        )

    return route
