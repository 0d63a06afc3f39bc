"""The coordinator's HTTP API: a thin Gradio layer over a ``Coordinator`` (leases, heartbeats, submissions).

Seven ``gr.api`` endpoints, named exactly ``lease``, ``heartbeat``, ``release``, ``submit``, ``verdict``,
``status`` and ``record_eval`` (an evaluator's held-out score of a version), take and return plain JSON; the same
functions are served as plain routes ``POST /hubgrpo/api/<name>`` on the same app (``hubgrpo.space.routes``: a
fraction of Gradio's CPU per call). Every answer is an envelope, never a raw exception or a traceback::

    {"ok": true,  "result": ...}
    {"ok": false, "error": {"error": "LeaseError", "code": "lease", "message": "...", "hint": "..."}}

``error`` is ``HubGrpoError.to_dict()`` (plus ``wait_s`` when the error carries a wait, e.g. a rate limit);
``hubgrpo.errors.from_dict`` rebuilds it on the worker's side. Anything that is not a ``HubGrpoError`` is logged
here (with tokens redacted) and answered as ``CoordinatorError`` with code ``internal``.

Submissions are checked off the request path (``hubgrpo.space.admission_queue``): ``submit`` does the cheap checks
(lease form, owner, signature; the commit id), queues the round and — on the plain route — answers ``checking``
at once; admission threads read and check the round and keep its verdict, which ``verdict`` answers. The
``gr.api`` ``submit`` waits for the verdict and answers it (synchronous, as gradio_client users expect).

Thread safety is the coordinator's: it holds its own lock and takes it for each call's bookkeeping (``lease``,
``heartbeat``, ``release``, admission, ``tick``); ``status`` runs unlocked. No network I/O ever runs under that lock
(store reads, merge commits, ``whoami``, the repo scan and the refusal flush all run outside it): a Hub answering
429 delays a merge commit, never a heartbeat. A daemon thread (``hubgrpo.space.ticker``, started by the app's
startup event, so ``blocks.launch()`` on a Space ticks too) calls ``coord.tick()`` every ``tick_interval`` seconds.

Merges run in that same thread, off the request path (``hubgrpo.space.ticker``). A ``lease`` asked while a merge is
due or running waits for it, up to ``coordinator.lease_waits_for_merge_s`` in all, holding a server thread for at
most ``LEASE_HOLD_S`` of it (``hubgrpo.space.endpoints``); then it is answered ``merging`` with a short ``wait_s``
and the worker asks again.

Bodies are bounded and timed before anyone is known, on every route of the app (``hubgrpo.space.guard``, installed
by ``build_app``); ``verdict`` checks the lease's signature, as ``heartbeat`` and ``submit`` do.

The ``gr.api`` endpoints are registered with ``queue=False``, so that raw HTTP may use ``POST
/gradio_api/run/<name>`` (one round trip), which Gradio serves even on Spaces (where ``api_open`` is off). See
``benchmarks/load/results/api_latency.md``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, cast

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # before gradio is imported: no phoning home

import gradio as gr  # noqa: E402

from hubgrpo.space import guard  # noqa: E402
from hubgrpo.space.endpoints import ENDPOINTS, AuthHook, CoordinatorApi, CoordinatorLike  # noqa: E402
from hubgrpo.space.ticker import Ticker  # noqa: E402
from hubgrpo.space.wire import free_port  # noqa: E402

if TYPE_CHECKING:
    from hubgrpo.coordinator.core import Coordinator


class HubgrpoBlocks(Protocol):
    """The attributes hubgrpo sets on the app's ``gr.Blocks``: by ``build_app``, ``guard.install`` and
    ``upload_route.add_upload`` (read them through ``extras(blocks)``)."""

    hubgrpo_ticker: Ticker
    hubgrpo_endpoints: dict[str, Callable[..., Any]]
    hubgrpo_body_limits: dict[str, int]
    hubgrpo_guard: guard.Policy
    hubgrpo_uploads: Any  # hubgrpo.space.upload.Uploads


def extras(blocks: gr.Blocks) -> HubgrpoBlocks:
    """``blocks`` as the carrier of hubgrpo's own attributes (``HubgrpoBlocks``)."""
    return cast(HubgrpoBlocks, blocks)


# ------------------------------------------------------------------------------------------------ app


def build_app(
    coord: CoordinatorLike,
    *,
    tick_interval: float = 1.0,
    blocks: gr.Blocks | None = None,
    auth: AuthHook | None = None,
    queue: bool = False,
) -> gr.Blocks:
    """Add the coordinator API endpoints to ``blocks`` (a new ``gr.Blocks`` when None) and return it.

    ``auth(token, request) -> user`` authenticates mutating calls (``status`` stays public). The tick thread
    starts when the app starts (``launch()`` or a mounted app's startup) and stops when it closes.
    ``queue=True`` routes calls through Gradio's queue instead (kept for benchmarks).
    """
    blocks = blocks if blocks is not None else gr.Blocks(title="hubgrpo coordinator")
    coord.warm_up()  # before the launch: not in the tick thread while Gradio checks that the app answers
    api = CoordinatorApi(coord, auth=auth, alive=lambda: blocks.is_running)  # queued rounds: coord.in_flight
    coord.use_merge_thread()  # merges run in the tick thread, off the request path
    with blocks:
        for name in ENDPOINTS:
            gr.api(
                getattr(api, name),
                api_name=name,
                queue=queue,
                concurrency_limit=None,
                api_description=getattr(api, name).__doc__,
            )
    ticker = Ticker(api, blocks, tick_interval)
    guard.install(blocks, auth)  # bodies bounded and timed before auth, on every route of the app it launches
    ext = extras(blocks)
    ext.hubgrpo_endpoints = {name: getattr(api, name) for name in ENDPOINTS}
    ext.hubgrpo_endpoints.update(submit=api.submit_queued, verdict=api.verdict)

    async def _start() -> None:
        attach_routes(blocks)
        ticker.start()

    blocks.extra_startup_events.append(_start)
    ext.hubgrpo_ticker = ticker  # serve() starts it too, in case a Gradio version skips startup events
    return blocks


def attach_routes(blocks: gr.Blocks) -> None:
    """Serve ``blocks.hubgrpo_endpoints`` as plain routes (``hubgrpo.space.routes``) on the launched app."""
    from hubgrpo.space import routes

    app = getattr(blocks, "server_app", None) or getattr(blocks, "app", None)
    if app is not None:
        ext = extras(blocks)
        routes.attach(
            app,
            ext.hubgrpo_endpoints,
            getattr(blocks, "hubgrpo_body_limits", None),
            ext.hubgrpo_ticker.api.auth,
            ext.hubgrpo_ticker.api.coord,
        )


def serve(
    coord: CoordinatorLike,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    tick_interval: float = 1.0,
    auth: AuthHook | None = None,
    blocks: gr.Blocks | None = None,
    queue: bool = False,
    uploads: bool | None = None,
    **launch_kw: Any,
) -> tuple[gr.Blocks, str]:
    """Build and launch the app without blocking; returns ``(app, url)``. ``port=0`` picks a free port. Without
    ``auth`` only a loopback ``host`` is served (``guard.check_exposure``: ``ConfigError`` otherwise). ``uploads``:
    serve ``upload`` too (``upload_route``); None: when the run's rounds come that way (``hub.submissions``).

    Close it with ``app.close()`` (the tick thread then stops). Extra keyword arguments go to ``launch()``.
    """
    app = build_app(coord, tick_interval=tick_interval, blocks=blocks, auth=auth, queue=queue)
    from hubgrpo.space.upload_route import add_upload

    if uploads or (uploads is None and coord.rounds_via_upload()):
        add_upload(app, cast("Coordinator", coord))  # uploads take the whole coordinator (store, inbox, checks)
    launch_kw = {"prevent_thread_lock": True, "quiet": True, "ssr_mode": False, **launch_kw}
    app.launch(server_name=host, server_port=port or free_port(host), **launch_kw)
    attach_routes(app)
    extras(app).hubgrpo_ticker.start()
    return app, str(app.local_url).rstrip("/")  # a str once launched (gradio declares it None)


STOP_REPORT_S = 30.0  # a stop still running after this long writes every thread's stack to stderr (once)
CLOSE_LIMIT_S = 30.0  # after the last checkpoint, closing the server and the process may take this long at most


def stop(app: gr.Blocks, coord: CoordinatorLike) -> None:
    """Ctrl-C to a served coordinator: commit the uploads still queued, then a last checkpoint (a stop loses no live
    version), then close the server. The checkpoint may wait on the store (a Hub 429) for as long as it must; if it
    takes over ``STOP_REPORT_S``, the threads' stacks go to stderr once, so a stuck stop shows where. Closing the
    server and ending the process are bounded: past ``CLOSE_LIMIT_S`` the stacks go to stderr and the process ends
    (exit code 1) instead of hanging the terminal or the job."""
    import faulthandler

    faulthandler.dump_traceback_later(STOP_REPORT_S)
    try:
        uploads = getattr(app, "hubgrpo_uploads", None)
        if uploads is not None:
            uploads.close()  # queued for a batch commit: committed first
        coord.flush()
    finally:
        faulthandler.cancel_dump_traceback_later()
    faulthandler.dump_traceback_later(CLOSE_LIMIT_S, exit=True)  # stays armed through the interpreter's exit
    app.close()
    close = getattr(coord, "close", None)
    if close is not None:  # its version folder: what a restart would delete anyway
        close()
