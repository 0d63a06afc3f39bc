"""An in-process coordinator on a local folder that counts commits against an hourly quota, as the Hub does, and
its rounds: trained from the version the coordinator serves and committed (or put in a folder inbox).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from hubgrpo import layout
from hubgrpo.coordinator.core import Coordinator
from hubgrpo.coordinator.repo_init import init_repo
from hubgrpo.store.local import LocalStore
from tests.support.coord_helpers import (
    FakeClock,
    make_config,
    submission_record,
    trained_adapter,
    write_adapter,
    write_rollouts,
)

SECRET = b"test-secret"


class QuotaStore(LocalStore):
    """A local folder whose commits count against an hourly quota (the Hub's), so checkpoints follow the budget."""

    hourly_commit_quota = 128


class InProcess:
    """What the adapter route serves, in process (``CoordinatorClient.adapter``'s contract)."""

    def __init__(self, c):
        self.c = c

    def adapter(self, version, adapter_id, cache, max_bytes):
        dest = Path(cache) / adapter_id
        if not dest.is_dir():
            shutil.copytree(self.c.version_dir(version, adapter_id), dest)
        return dest


def setup_run(tmp_path, **overrides):
    """A run (quorum 1, ``overrides`` on top) on a ``QuotaStore``: (store, its coordinator, the fake clock)."""
    cfg = make_config(**{"merge.quorum": 1, "merge.max_staleness": 8, "rounds.versions": 50, **overrides})
    store, clock = QuotaStore(tmp_path / "repo"), FakeClock()
    init_repo(store, cfg, write_adapter(tmp_path / "v0", seed=0, b_scale=0.0), clock=clock)
    return store, Coordinator(store, SECRET, clock=clock, workdir=tmp_path / "work"), clock


def committed_round(store, c, lease, tmp: Path, seed: int) -> str:
    """A trained round of ``lease`` (its base from the coordinator, as a worker gets it), committed; the commit."""
    sub_id = layout.submission_id(lease.worker, lease.lease_id)
    folder = trained_adapter(InProcess(c), lease, tmp / "rounds" / sub_id, seed, 0.1)
    (folder / layout.SUBMISSION_FILE).write_bytes(submission_record(lease).to_json())
    write_rollouts(folder, lease, c.cfg)
    if c.cfg.hub.submissions:  # a folder inbox: the round costs no commit
        from hubgrpo.worker.delivery import deliver

        return deliver(c.cfg.hub.submissions, lease, folder)
    adds = {layout.submission_path(lease.base_version, sub_id, f.name): f for f in folder.iterdir()}
    return store.commit(adds, message=f"hubgrpo: submission {sub_id}")
