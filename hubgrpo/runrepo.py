"""Reading and writing a run repo through a Store: config, state, adapters at a version, the initial commit.

Used by the coordinator, the worker, ``hubgrpo init``, ``status`` and ``push``. Paths come from ``layout``.
"""

from __future__ import annotations

import shutil
import time
import uuid
from pathlib import Path

from hubgrpo import layout
from hubgrpo.config import Config, loads, to_yaml
from hubgrpo.errors import NotFound, StoreError
from hubgrpo.layout import RunState, VersionRecord
from hubgrpo.store.base import Store


def cache_root() -> Path:
    import os

    return Path(os.environ.get("HUBGRPO_CACHE", Path.home() / ".cache" / "hubgrpo"))


def read_config(store: Store, revision: str | None = None) -> Config:
    """The resolved config stored in the repo (secrets are never stored: they come from the environment)."""
    try:
        text = store.read(layout.CONFIG_FILE, revision).decode()
    except NotFound:
        raise NotFound(f"{store.location} has no {layout.CONFIG_FILE}: it is not a hubgrpo run repo",
                       hint="create it with `hubgrpo init CONFIG --repo REPO`") from None
    return loads(text, source=f"{store.location}/{layout.CONFIG_FILE}")


def read_state(store: Store, revision: str | None = None) -> RunState:
    try:
        return RunState.from_json(store.read(layout.STATE_FILE, revision))
    except NotFound:
        raise NotFound(f"{store.location} has no {layout.STATE_FILE}: it is not a hubgrpo run repo",
                       hint="create it with `hubgrpo init CONFIG --repo REPO`") from None


def version_shas(store: Store) -> dict[int, str]:
    """version number → commit sha, from the vNNNNNN tags."""
    out = {}
    for name, sha in store.tags().items():
        v = layout.parse_tag(name)
        if v is not None:
            out[v] = sha
    return out


def fetch_dir(store: Store, files: dict[str, str], revision: str, dest: Path) -> Path:
    """Copy repo files (repo path → local file name) at ``revision`` into ``dest`` (cached per revision)."""
    if dest.is_dir():  # only ever created by the atomic rename below, so it is complete
        return dest
    tmp = dest.with_name(dest.name + f".tmp-{uuid.uuid4().hex[:8]}")
    tmp.mkdir(parents=True, exist_ok=True)
    for repo_path, name in files.items():
        shutil.copyfile(store.local_path(repo_path, revision), tmp / name)
    try:
        tmp.rename(dest)
    except OSError:  # another process won the race: use its copy
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def adapter_at(store: Store, revision: str, cache: Path | None = None) -> Path:
    """A local PEFT folder with the global adapter at ``revision`` (cached; the revision should be a sha)."""
    cache = cache or cache_root() / "adapters"
    key = "".join(c if c.isalnum() else "_" for c in f"{store.location}")[-80:]
    files = {f: f for f in layout.ADAPTER_FILES}
    return fetch_dir(store, files, revision, cache / key / revision)


def submission_at(store: Store, base_version: int, sub_id: str, revision: str, dest: Path) -> Path:
    """Copy one submission folder at ``revision`` into ``dest`` (every file in it, for admission checks)."""
    prefix = layout.submission_dir(base_version, sub_id)
    names = store.list_files(prefix, revision)
    if not names:
        raise NotFound(f"no submission at {prefix} in {store.location} at revision {revision[:12]}",
                       hint="push the submission commit before calling submit")
    files = {p: p[len(prefix) + 1:].replace("/", "__") for p in names}
    return fetch_dir(store, files, revision, dest)


def initial_state(cfg: Config, now: float) -> RunState:
    v0 = VersionRecord(version=0, tag=layout.version_tag(0), created_at=now, method="init")
    return RunState(run_id=uuid.uuid4().hex, project_name=cfg.project_name, versions=[v0], started_at=now)


def init_repo(store: Store, cfg: Config, adapter_dir: Path, *, force: bool = False,
              clock=time.time) -> tuple[str, RunState]:
    """Create the run repo with the version-0 adapter, config, state and card; tag v000000."""
    store.create(exist_ok=True, private=cfg.hub.private)
    head = store.head()
    if head is not None and store.exists_file(layout.STATE_FILE, head):
        state = read_state(store, head)
        if not force:
            raise StoreError(f"{store.location} is already a hubgrpo run (version {state.version})",
                             hint="resume it with `hubgrpo run`/`hubgrpo worker`, or pass --force to start over")
    state = initial_state(cfg, clock())
    adds = {
        layout.ADAPTER_WEIGHTS: adapter_dir / layout.ADAPTER_WEIGHTS,
        layout.ADAPTER_CONFIG: adapter_dir / layout.ADAPTER_CONFIG,
        layout.CONFIG_FILE: to_yaml(cfg, drop_secrets=True).encode(),
        layout.STATE_FILE: state.to_json(),
        layout.MODEL_CARD: render_card(cfg, state).encode(),
    }
    deletes = []
    if head is not None and force:
        deletes = [p for p in store.list_files("", head) if p not in adds]
        tags = [t for t in store.tags() if layout.parse_tag(t) is not None]
        if tags:
            raise StoreError(f"{store.location} has version tags ({len(tags)}); a forced re-init cannot remove them",
                             hint="use a new repo for a new run")
    sha = store.commit(adds, deletes, message=f"hubgrpo: init {cfg.project_name} (version 0)")
    store.tag(layout.version_tag(0), sha, exist_ok=False)
    return sha, state


def render_card(cfg: Config, state: RunState) -> str:
    """The run repo's model card: a PEFT adapter card with the reward per version."""
    from hubgrpo.card import render_model_card

    rows = [{"version": v.version, "reward": v.reward_mean, "submissions": len(v.merged),
             "samples": v.samples, "residual": v.residual} for v in state.versions]
    body = (f"Trained with hubgrpo (asynchronous GRPO + LoRA): {len(state.workers)} workers, "
            f"{state.samples_total} completions, merge method `{cfg.merge.method}`.")
    return render_model_card(cfg, title=f"{cfg.project_name} (hubgrpo run, version {state.version})",
                             reward_rows=rows, body=body)
