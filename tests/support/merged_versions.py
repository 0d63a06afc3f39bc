"""A coordinator that merges versions from synthetic rounds, each version a tagged checkpoint, on any store."""

from __future__ import annotations

from pathlib import Path

from hubgrpo.coordinator.core import Coordinator
from hubgrpo.coordinator.repo_init import init_repo
from tests.support.coord_helpers import FakeClock, make_config, push_submission, write_adapter

SECRET = b"storage-secret"


def run_versions(store, tmp: Path, n: int, c: Coordinator | None = None, **settings) -> Coordinator:
    """A coordinator (quorum 1) that merges ``n`` versions from synthetic rounds, each version a checkpoint (tagged)
    on any store unless ``coordinator.checkpoint_every_s`` is given."""
    if c is None:
        init_repo(
            store,
            make_config(**{"merge.quorum": 1, "rounds.versions": 100, "coordinator.checkpoint_every_s": 0, **settings}),
            write_adapter(tmp / "v0", seed=0),
        )
        c = Coordinator(store, SECRET, clock=FakeClock(1_000_000.0), workdir=tmp / "coord")
    for i in range(n):
        lease = c.lease(f"w{i % 3}")
        assert c.submit(lease, push_submission(store, lease, tmp / "rounds", seed=i + 1))["status"] == "merged"
    return c
