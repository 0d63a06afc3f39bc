"""The ``upload`` endpoint on a served coordinator app (the Space, and ``hubgrpo coordinator``): a worker's round as
``{file name: base64}`` (or the binary body of ``hubgrpo.upload_body`` on the plain route), for workers that do not
write the run repo (``hubgrpo.space.upload`` checks it, then
commits it in a batch, or puts it in the run's inbox: ``hub.submissions: coordinator`` or another inbox).

``add_upload(blocks, coord)`` registers it on ``blocks`` after ``hubgrpo.space.api.build_app`` and before the
launch: as a ``gr.api`` endpoint and as the plain route ``POST /hubgrpo/api/upload``, whose body limit (and the
guard's, on Gradio's routes alike) is what one round of the run can weigh in base64 (``upload_body_limit``); a
binary body's, what it weighs as it is (``binary_body_limit``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import gradio as gr

from hubgrpo.space.upload import Uploads, binary_body_limit, upload_body_limit
from hubgrpo.space.wire import caller_token

if TYPE_CHECKING:
    from hubgrpo.coordinator.core import Coordinator
    from hubgrpo.space.api import HubgrpoBlocks


def add_upload(blocks: gr.Blocks, coord: Coordinator, *, batch_size: int = 8, batch_wait_s: float = 5.0) -> Uploads:
    """Register ``upload`` on ``blocks`` (built by ``build_app``, not launched yet); ``blocks.hubgrpo_uploads`` is
    the returned ``Uploads`` (close it to flush the queued uploads of a run whose rounds are commits)."""
    ext = cast("HubgrpoBlocks", blocks)  # hubgrpo's attributes on the app (set by build_app)
    api = ext.hubgrpo_ticker.api  # the server's endpoint object: its auth hook, its merge thread's wake-up
    uploads = Uploads(coord, batch_size=batch_size, batch_wait_s=batch_wait_s, on_merge_due=api.merge_is_due)

    def upload(lease: dict, files: dict, token: str | None = None, request: gr.Request | None = None) -> dict:
        """Upload a round's submission ({file name: base64} of adapter_model.safetensors, adapter_config.json,
        rollouts.json.gz and submission.json) for a worker without write access; checked, committed in a batch
        (or put in the run's inbox), then submitted."""
        token = caller_token(token, request)

        def run() -> Any:
            return uploads.handle(api._owned_lease(lease, token, request), files)

        return api._answer("upload", token, run)

    with blocks:
        gr.api(upload, api_name="upload", queue=False, concurrency_limit=None, api_description=upload.__doc__)
    ext.hubgrpo_endpoints["upload"] = upload  # on the plain routes too, with a body fit for one round:
    ext.hubgrpo_body_limits = {  # the global adapter + rollouts, in base64 (JSON) or as they are (binary)
        "upload": upload_body_limit(coord),
        "upload:binary": binary_body_limit(coord),
    }
    ext.hubgrpo_guard.upload_limit = ext.hubgrpo_body_limits["upload"]  # Gradio's routes alike
    ext.hubgrpo_uploads = uploads
    return uploads
