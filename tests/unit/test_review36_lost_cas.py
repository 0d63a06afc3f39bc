"""Review of issue 36: a coordinator that loses a checkpoint's compare-and-swap to another coordinator reloads the
other's state; the next merge must start from the OTHER's adapter of that version, never from its own lost one
(same version number, another adapter id).

Two in-process coordinators on one local folder that counts commits against a quota (as the Hub does)."""

from __future__ import annotations

import pytest
import torch

from hubgrpo.coordinator.core import Coordinator
from hubgrpo.merge import load_adapter_dir
from tests.unit.test_checkpoints import SECRET, _round, _setup

pytestmark = pytest.mark.timeout(120)


def _merge(store, c, tmp, clock, seed: int) -> None:
    lease = c.lease("w0")
    clock.advance(1.0)
    c.submit(lease, _round(store, c, lease, tmp, seed=seed))


def test_after_a_lost_checkpoint_cas_the_next_merge_starts_from_the_winners_adapter(tmp_path):
    store, a, clock = _setup(tmp_path, **{"coordinator.checkpoint_every_s": 86400})
    b = Coordinator(store, SECRET, clock=clock, workdir=tmp_path / "work-b")  # a second coordinator (split brain)
    _merge(store, a, tmp_path / "a", clock, seed=101)
    _merge(store, a, tmp_path / "a", clock, seed=102)  # A: live v1, v2; its checkpoint is still v0
    _merge(store, b, tmp_path / "b", clock, seed=501)  # B: live v1' (another adapter)
    assert a.state.version == 2 and b.state.version == 1 and a.ids[1] != b.ids[1]
    assert b.flush()  # B checkpoints v1' first
    assert not a.flush()  # A loses the CAS and reloads B's checkpoint
    assert a.state.version == 1 and a.ids[1] == b.ids[1]
    winner = load_adapter_dir(b.version_dir(1, b.ids[1])).weights
    used = a.global_adapter().weights  # what A's next merge starts from (and measures rounds on v1' against)
    differ = [k for k in winner if not torch.equal(winner[k], used[k])]
    assert not differ, (f"A merges on top of its own lost v1, not the checkpointed v1' it reloaded "
                        f"({len(differ)} tensors differ, e.g. {differ[:2]})")
