"""The first commit of a run repo: version-0 adapter, resolved config, initial state, model card; tag v000000."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

from hubgrpo import layout
from hubgrpo.card import run_card
from hubgrpo.config import Config, check_storable, loads, to_yaml
from hubgrpo.errors import StoreError
from hubgrpo.layout import RunState, VersionRecord
from hubgrpo.runrepo import read_state
from hubgrpo.store.base import Store


def initial_state(cfg: Config, now: float, adapter_id: str | None = None) -> RunState:
    v0 = VersionRecord(version=0, tag=layout.version_tag(0), created_at=now, method="init", adapter_id=adapter_id)
    return RunState(run_id=uuid.uuid4().hex, project_name=cfg.project_name, versions=[v0], started_at=now)


def init_repo(
    store: Store, cfg: Config, adapter_dir: Path, *, force: bool = False, clock=time.time
) -> tuple[str, RunState]:
    """Create the run repo with the version-0 adapter, config, state and card; tag v000000. The stored config holds
    placeholders where ``cfg`` has values from the user's environment (``check_storable``), and the card is made
    from that stored copy, so neither shows such a value."""
    check_storable(cfg)
    text = to_yaml(cfg, drop_secrets=True)
    stored = loads(text, source=layout.CONFIG_FILE, expand=False)  # what every reader will load
    store.create(exist_ok=True, private=cfg.hub.private)
    head = store.head()
    if head is not None and store.exists_file(layout.STATE_FILE, head):
        state = read_state(store, head)
        if not force:
            raise StoreError(
                f"{store.location} is already a hubgrpo run (version {state.version})",
                hint="resume it with `hubgrpo run`/`hubgrpo worker`, or pass --force to start over",
            )
    aid = layout.adapter_id(
        (adapter_dir / layout.ADAPTER_WEIGHTS).read_bytes(), (adapter_dir / layout.ADAPTER_CONFIG).read_bytes()
    )
    state = initial_state(cfg, clock(), aid)
    adds: dict[str, bytes | Path] = {
        layout.ADAPTER_WEIGHTS: adapter_dir / layout.ADAPTER_WEIGHTS,
        layout.ADAPTER_CONFIG: adapter_dir / layout.ADAPTER_CONFIG,
        layout.CONFIG_FILE: text.encode(),
        layout.STATE_FILE: state.to_json(),
        layout.MODEL_CARD: run_card(stored, state).encode(),
    }
    deletes = []
    if head is not None and force:
        deletes = [p for p in store.list_files("", head) if p not in adds]
        tags = [t for t in store.tags() if layout.parse_tag(t) is not None]
        if tags:
            raise StoreError(
                f"{store.location} has version tags ({len(tags)}); a forced re-init cannot remove them",
                hint="use a new repo for a new run",
            )
    sha = store.commit(adds, deletes, message=f"hubgrpo: init {cfg.project_name} (version 0)")
    store.tag(layout.version_tag(0), sha, exist_ok=False)
    return sha, state
