"""The Gradio Space: the coordinator's API endpoints plus the page people look at, in one app.

``build_space(coord, auth=...)`` lays out the UI, then lets ``hubgrpo.space.api.build_app`` add the six API endpoints
(``lease``, ``heartbeat``, ``release``, ``submit``, ``status``, ``record_eval``) to the same ``gr.Blocks``, and adds
a seventh, ``upload``, for workers without write access to the run repo (``hubgrpo.space.upload``: checked before
it is committed, many submissions per commit). The page shows

- header cards (version / target, samples, workers, live leases, pending submissions, commits in the last hour);
- reward curves: per version the merged rounds' training reward (recomputed from their rollouts) beside the
  held-out reward an evaluator recorded, and each worker's round rewards per version;
- the leaderboard, the versions table (merge residual, staleness, contributors, a link to each commit),
  live leases, refusals with their reasons, and the run config (YAML, secrets shown as ``***``).

A ``gr.Timer`` refreshes everything every ``refresh_s`` seconds from ``coord.status()`` (lock-free). Its events and
the page-load event are ``api_visibility="private"``: they are not part of the public API (``view_api`` lists only
the seven coordinator endpoints, and API clients cannot call them).

Run it with ``hubgrpo space --repo REPO`` (this module's ``serve_space``) or on a Space with ``space/app.py``.
Gradio 6 takes the theme and CSS at ``launch()``: pass ``**launch_kwargs()``.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Literal

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # before gradio is imported: no phoning home

import gradio as gr  # noqa: E402

from hubgrpo.space import view  # noqa: E402
from hubgrpo.space.api import AuthHook, attach_routes, build_app, extras, free_port  # noqa: E402
from hubgrpo.space.upload import UPLOAD_FILES  # noqa: E402
from hubgrpo.space.upload_route import add_upload  # noqa: E402

if TYPE_CHECKING:
    from hubgrpo.coordinator.core import Coordinator

CSS = """
.hg-head h1 {margin: 0 0 2px 0; font-size: 1.6rem;}
.hg-sub {color: var(--body-text-color-subdued); font-size: .9rem; margin-bottom: 10px;}
.hg-cards {display: flex; flex-wrap: wrap; gap: 10px;}
.hg-card {flex: 1 1 120px; border: 1px solid var(--border-color-primary); border-radius: 10px;
          padding: 8px 12px; background: var(--block-background-fill);}
.hg-k {font-size: .75rem; text-transform: uppercase; letter-spacing: .04em; color: var(--body-text-color-subdued);}
.hg-v {font-size: 1.35rem; font-weight: 600;}
"""


def launch_kwargs() -> dict:
    """Keyword arguments for ``launch()``: theme, CSS, no Node SSR server."""
    return {"theme": gr.themes.Soft(primary_hue="orange", secondary_hue="slate"), "css": CSS, "ssr_mode": False}


def _table(headers: list[str], label: str, elem_id: str, markdown_last: bool = False) -> gr.Dataframe:
    last: Literal["str", "markdown"] = "markdown" if markdown_last else "str"
    datatype: list[Literal["str", "markdown"]] = ["str"] * (len(headers) - 1)
    datatype.append(last)
    return gr.Dataframe(
        headers=headers,
        datatype=datatype,
        label=label,
        interactive=False,
        wrap=True,
        max_height=420,
        show_label=True,
        elem_id=elem_id,
    )


def _layout(coord: Coordinator) -> dict[str, Any]:
    """Create the UI components (inside an open ``gr.Blocks``); returns them by name."""
    c: dict[str, Any] = {"summary": gr.HTML(elem_id="hg-summary")}
    with gr.Row(equal_height=True):
        # versions are whole numbers: integer tick labels, and an axis at least MIN_VERSION_AXIS wide so that the
        # ticks fall on whole numbers (see _refresher)
        c["reward"] = gr.LinePlot(
            x="version",
            y="reward",
            color="series",
            title="Reward per global version",
            x_title="version",
            y_title="reward",
            height=300,
            x_axis_format="d",
            elem_id="hg-reward-plot",
        )
        c["workers"] = gr.LinePlot(
            x="version",
            y="reward",
            color="worker",
            title="Round reward per worker",
            x_title="version",
            y_title="round reward",
            height=300,
            x_axis_format="d",
            elem_id="hg-worker-plot",
        )
    c["leaderboard"] = _table(view.LEADERBOARD_COLUMNS, "Leaderboard", "hg-leaderboard")
    c["versions"] = _table(view.VERSION_COLUMNS, "Versions", "hg-versions", markdown_last=True)
    with gr.Row():
        c["leases"] = _table(view.LEASE_COLUMNS, "Live workers and leases", "hg-leases")
        c["refusals"] = _table(view.REFUSAL_COLUMNS, "Refused submissions", "hg-refusals")
    with gr.Accordion("Run config (read-only; secrets redacted)", open=False):
        c["config"] = gr.Code(language="yaml", interactive=False, show_label=False)
    repo = getattr(coord.store, "repo_id", None) or coord.store.location
    gr.Markdown(view.join_markdown(repo, os.environ.get("SPACE_ID"), os.environ.get("HF_ENDPOINT")))
    return c


MIN_VERSION_AXIS = 10  # versions 0..10 at least: a narrower axis would put ticks at 0.5, 1.5, …


def _refresher(coord: Coordinator, comps: dict[str, Any]):
    """The refresh function for the timer and page load, and its output components (same order)."""
    names = ["summary", "reward", "workers", "leaderboard", "versions", "leases", "refusals", "config"]

    def refresh():
        snap = view.snapshot(coord)
        x_lim = [0, max(MIN_VERSION_AXIS, snap["status"]["version"])]
        for plot in ("reward", "workers"):
            snap[plot] = gr.LinePlot(value=snap[plot], x_lim=x_lim)
        return tuple(snap[n] for n in names)

    return refresh, [comps[n] for n in names]


def build_space(
    coord: Coordinator,
    *,
    auth: AuthHook | None = None,
    refresh_s: float = 5.0,
    tick_interval: float = 1.0,
    batch_size: int = 8,
    batch_wait_s: float = 5.0,
) -> gr.Blocks:
    """The coordinator app with its UI: API endpoints (``server.build_app``) + ``upload`` + the page.

    ``auth``: the ``hubgrpo.space.auth.make_auth(coord)`` hook (None = open API). ``batch_size`` / ``batch_wait_s``:
    uploads are committed when that many wait, or that long after the first. The returned blocks carry
    ``hubgrpo_uploads`` (close it to flush queued uploads) and ``hubgrpo_ticker`` (see ``server``).
    """
    blocks = gr.Blocks(title=f"hubgrpo · {coord.cfg.project_name}", fill_width=False)
    with blocks:
        comps = _layout(coord)
        refresh, outputs = _refresher(coord, comps)
        timer = gr.Timer(refresh_s)
        timer.tick(refresh, outputs=outputs, api_visibility="private", show_progress="hidden", queue=False)
        blocks.load(refresh, outputs=outputs, api_visibility="private", show_progress="hidden", queue=False)
    build_app(coord, blocks=blocks, auth=auth, tick_interval=tick_interval)
    add_upload(blocks, coord, batch_size=batch_size, batch_wait_s=batch_wait_s)
    return blocks


def serve_space(
    coord: Coordinator,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    auth: AuthHook | None = None,
    refresh_s: float = 5.0,
    tick_interval: float = 1.0,
    batch_size: int = 8,
    batch_wait_s: float = 5.0,
    **launch_kw: Any,
) -> tuple[gr.Blocks, str]:
    """Build and launch the Space app without blocking; returns ``(app, url)``. ``port=0`` picks a free port.
    Without ``auth`` only a loopback ``host`` is served (``hubgrpo.space.guard.check_exposure``: ``ConfigError``)."""
    app = build_space(
        coord,
        auth=auth,
        refresh_s=refresh_s,
        tick_interval=tick_interval,
        batch_size=batch_size,
        batch_wait_s=batch_wait_s,
    )
    launch_kw = {"prevent_thread_lock": True, "quiet": True, **launch_kwargs(), **launch_kw}
    app.launch(server_name=host, server_port=port or free_port(host), **launch_kw)
    attach_routes(app)
    extras(app).hubgrpo_ticker.start()
    return app, str(app.local_url).rstrip("/")  # a str once launched (gradio declares it None)


__all__ = ["CSS", "UPLOAD_FILES", "build_space", "launch_kwargs", "serve_space"]
