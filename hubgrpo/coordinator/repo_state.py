"""The run repo as the coordinator loads it: config, state, version tags, commit log and checkpoint adapter.

``RepoStateMixin`` (``Coordinator`` inherits it) reads all of it with store reads only (``read_repo``) and adopts
it (``apply_repo``) at start, after a lost checkpoint race and after ``hubgrpo gc`` rewrote the history. Adopting
keeps what the repo cannot know: live leases keep their prompts, adapters of this lineage stay in memory.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, cast

from hubgrpo import runrepo
from hubgrpo.coordinator import norms, reconcile
from hubgrpo.coordinator.prompt_pool import PromptPool
from hubgrpo.errors import NotFound

if TYPE_CHECKING:
    from hubgrpo.config import Config
    from hubgrpo.coordinator.core import Coordinator
    from hubgrpo.layout import RunState
    from hubgrpo.store.base import Store


class RepoStateMixin:
    """What the coordinator loads from its run repo (``Coordinator`` inherits it)."""

    store: Store
    scratch: Path
    clock: Callable[[], float]
    head: str
    cfg: Config
    state: RunState
    shas: dict[int, str]
    pool: PromptPool
    last_merge_at: float
    norm_history: norms.NormHistory

    def read_repo(self) -> dict:
        """Everything the coordinator loads from the repo (store reads only; no state changes)."""
        head = self.store.head()
        if head is None:
            raise NotFound(f"{self.store.location} is empty", hint="create the run with `hubgrpo init`")
        state = runrepo.read_state(self.store, head)
        shas = reconcile.version_shas(self.store, state.version)  # tags a crashed gc or merge left missing
        history = self.store.history(limit=200)
        download = self.scratch / uuid.uuid4().hex  # one per read; the whole folder goes once adopted (or not)
        adapter = runrepo.adapter_at(self.store, shas[state.version], download)
        return {
            "head": head,
            "cfg": runrepo.read_config(self.store, head),
            "state": state,
            "shas": shas,
            "history": [c.created_at for c in history],
            "adapter": adapter,
            "download": download,
            "head_at": next((c.created_at for c in history if c.sha == head), None),
        }

    def apply_repo(self, repo: dict) -> None:
        """Adopt what ``read_repo`` read: config, state, tags, commit log; outer momentum is re-read at the next
        merge; the prompt pool never goes back below a live lease's prompts."""
        c = cast("Coordinator", self)
        c.head, c.cfg, c.state, c.shas = repo["head"], repo["cfg"], repo["state"], repo["shas"]
        old_ids = dict(c.ids)
        c._adopt_lineage(repo)
        old = getattr(c, "pool", None)
        c.pool = PromptPool(c.state.next_prompt) if old is None else old
        live = [i for lease in c.active.values() for i in lease.prompt_indices]
        c.pool.next_index = max(c.pool.next_index, c.state.next_prompt, max(live, default=-1) + 1)
        c.momentum = None
        c.last_merge_at = c.state.versions[-1].created_at if c.state.versions else c.clock()
        now = c.clock()  # a commit stamped after now (the Hub's clock ahead, a virtual clock) counts as now
        c.commit_times = sorted(min(t, now) for t in repo["history"] if t > now - 3600)
        # only adapters of this lineage: a number merged again by another is another adapter
        c.adapters.retain(lambda v: v in c.ids and old_ids.get(v) == c.ids[v])
        if c.fold is not None and old_ids.get(c.fold.version) != c.ids.get(c.fold.version):
            c.fold = None
        c.pending = {k: p for k, p in c.pending.items() if k not in set(c.state.merged_ids)}
        c.norm_history = norms.rebuild(c.state.versions, c.cfg.merge.max_norm_factor)

    def reload(self) -> None:
        self.apply_repo(self.read_repo())
