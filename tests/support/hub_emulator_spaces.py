"""Space settings for the local Hub emulator: variables and secrets (``HfApi.add_space_variable`` & co).

Routes (huggingface_hub 2.4 ``hf_api.py``), all under ``/api/spaces/{ns}/{name}/``:

- ``GET variables`` → ``{key: {"value", "description", "updatedAt"}}``; ``POST variables`` with
  ``{"key", "value", "description"?}`` answers the same map; ``DELETE variables`` with ``{"key"}``.
- ``GET secrets`` → ``{key: {"description", "updatedAt"}}`` (values are write-only); ``POST secrets`` with
  ``{"key", "value", "description"?}``; ``DELETE secrets`` with ``{"key"}``.

Only the Space's owner may read or change them (401 anonymous, 403 others, 404 unknown Space). Values are kept in
``SpaceSettings.data`` so tests can check what was set (the real Hub never shows a secret's value).
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from tests.support.hub_emulator_state import HubError, iso


class SpaceSettings:
    """Variables and secrets per Space id: ``data[space_id] = {"variables": {...}, "secrets": {...}}``."""

    def __init__(self):
        self.data: dict[str, dict[str, dict[str, dict]]] = {}
        self._lock = threading.Lock()

    def route(self, api, req, rid: str, rest: list[str]) -> tuple[str, Callable] | None:
        """(endpoint name, thunk) for a settings route of Space ``rid``, else None."""
        kind = rest[0] if rest else ""
        if kind not in ("variables", "secrets") or len(rest) != 1 or req.method not in ("GET", "POST", "DELETE"):
            return None
        return f"space-{kind}", lambda: self.handle(api, req, rid, kind)

    def handle(self, api, req, rid: str, kind: str):
        """Read, set or delete one variable/secret of an owned Space; answers like the Hub."""
        from tests.support.hub_emulator_api import json_resp

        api._repo(req, "space", rid, write=True)  # 401/403/404 exactly like a write to the repo
        with self._lock:
            store = self.data.setdefault(rid, {"variables": {}, "secrets": {}})[kind]
            if req.method in ("POST", "DELETE"):
                body = req.json()
                key = body.get("key")
                if not isinstance(key, str) or not key:
                    raise HubError(400, f"Invalid {kind[:-1]}: a key is required")
                if req.method == "DELETE":
                    store.pop(key, None)
                elif not isinstance(body.get("value"), str):
                    raise HubError(400, f"Invalid {kind[:-1]} {key!r}: value must be a string")
                else:
                    store[key] = {"value": body["value"], "description": body.get("description"),
                                  "updatedAt": iso(time.time())}
            shown = {k: ({kk: vv for kk, vv in v.items() if kk != "value"} if kind == "secrets" else dict(v))
                     for k, v in store.items()}
        return json_resp(shown)
