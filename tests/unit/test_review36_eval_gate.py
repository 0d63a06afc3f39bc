"""Review of issue 36 — DEFECT (fails against the code at review time; not committed): with ``merge.eval_gate`` a
merge starts from the best-scored version after a bad score; that version may be a live one that was never
checkpointed and has left the version cache since, and then every merge fails and the run stalls.

In-process coordinator on a local folder that counts commits against a quota, as the Hub does."""

from __future__ import annotations

import pytest

from hubgrpo.coordinator.admission import staleness_limit
from hubgrpo.coordinator.core import Coordinator
from tests.unit.test_checkpoints import SECRET, _round, _setup

pytestmark = pytest.mark.timeout(180)


def _merge(store, c, tmp, clock, seed: int) -> None:
    lease = c.lease(f"w{seed % 3}")
    clock.advance(1.0)
    c.submit(lease, _round(store, c, lease, tmp, seed=seed))


def test_the_eval_gate_never_starts_a_merge_from_a_version_the_coordinator_no_longer_has(tmp_path):
    store, c, clock = _setup(tmp_path, **{"merge.eval_gate": 0.05, "coordinator.checkpoint_every_s": 86400})
    _merge(store, c, tmp_path, clock, seed=1)
    c.record_eval(1, 0.9, 8)  # v1 scored well; it is live only (the checkpoint is still v0)
    keep = c.cfg.merge.lease_age_limit() + 2
    for i in range(keep + 2):
        _merge(store, c, tmp_path, clock, seed=10 + i)
    assert c.versions.path(1) is None and 1 not in c.shas  # evicted, never checkpointed
    latest = c.state.version
    c.record_eval(latest, 0.1, 8)  # the newest scored badly: the gate wants to start from v1
    assert c.flush()  # a checkpoint holds both scores
    c = Coordinator(store, SECRET, clock=clock, workdir=tmp_path / "restarted")  # a restart: nothing cached
    _merge(store, c, tmp_path, clock, seed=99)  # raises: version 1 is not available any more
    assert c.state.version == latest + 1


def test_the_in_memory_adapters_stay_bounded_when_every_read_is_a_hit(tmp_path):
    store, c, clock = _setup(tmp_path, **{"coordinator.checkpoint_every_s": 86400})
    limit = staleness_limit(c)
    for i in range(limit + 6):
        _merge(store, c, tmp_path, clock, seed=10 + i)
    assert len(c.adapters) <= limit + 2, (f"{len(c.adapters)} adapters in memory after {c.state.version} "
                                           f"versions (staleness limit {limit}): one more per version, for ever")
