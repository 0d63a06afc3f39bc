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

import re
from typing import Any, Callable

from hubgrpo import layout
from hubgrpo.space.guard import envelope

FILES = {layout.ADAPTER_WEIGHTS: "application/octet-stream", layout.ADAPTER_CONFIG: "application/json"}
_ID = re.compile(r"[0-9a-f]{40}")
CACHE = "private, max-age=31536000, immutable"


def make_adapter_route(coord: Any, auth: Any, threads: Any, authenticate: Callable) -> Callable:
    """The Starlette endpoint serving ``coord.version_dir(version, adapter_id)``'s files; ``authenticate`` is the
    plain routes' check of the ``Authorization`` header (``routes.authenticate``)."""
    import anyio
    from starlette.responses import FileResponse, Response

    from hubgrpo.errors import NotFound

    identify = getattr(auth, "identify", None)

    async def route(request: Any) -> Any:
        version, aid, name = (request.path_params.get(k, "") for k in ("version", "aid", "name"))
        if not (version.isdigit() and len(version) <= 10 and _ID.fullmatch(aid) and name in FILES):
            return envelope(404, "no such adapter file: the path is /hubgrpo/api/adapter/<version>/<adapter id>/"
                                 f"<{' | '.join(FILES)}>", "lease a round: the lease names the version and its id")
        if identify is not None:
            refused = await authenticate(identify, request, threads)
            if refused is not None:
                return refused
        etag = f'"{aid}-{name}"'
        if request.headers.get("if-none-match") == etag:
            return Response(status_code=304, headers={"ETag": etag, "Cache-Control": CACHE})
        try:
            folder = await anyio.to_thread.run_sync(coord.version_dir, int(version), aid, limiter=threads)
        except NotFound as e:
            return envelope(404, e.message, e.hint or "lease again")
        return FileResponse(folder / name, media_type=FILES[name], headers={"ETag": etag, "Cache-Control": CACHE})

    return route
