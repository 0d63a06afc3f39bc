"""rounds.fleet_batch split: the run's batch is the fleet's, shared out by the coordinator in signed leases."""

from __future__ import annotations

import pytest

from hubgrpo import runrepo
from hubgrpo.config import loads
from hubgrpo.errors import ConfigError, LeaseError
from tests.support.coord_helpers import local_coordinator, push_submission

SECRET = b"s" * 32
SPLIT = {"rounds.fleet_batch": "split", "params.per_device_train_batch_size": 8, "merge.quorum": 1,
         "rounds.versions": 20}  # num_generations 2: four prompt groups per step


def _batch(lease, default: int = 8) -> int:
    return lease.params.get("per_device_train_batch_size", default)


def test_the_fleet_batch_is_shared_by_the_live_workers(tmp_path):
    """Each lease takes ⌈4 groups ÷ live workers⌉ groups of 2 (at least one), and as many prompts per step; a
    worker that has been quiet for lease_timeout_s no longer counts."""
    store, c, clock = local_coordinator(tmp_path, SECRET, **SPLIT)
    steps = c.cfg.rounds.steps
    alone = c.lease("w1")
    assert "per_device_train_batch_size" not in alone.params and len(alone.prompt_indices) == 4 * steps
    second = c.lease("w2")
    assert _batch(second) == 4 and len(second.prompt_indices) == 2 * steps
    assert [_batch(c.lease(w)) for w in ("w3", "w4", "w5")] == [4, 2, 2]  # ⌈4/3⌉ = 2 groups, then one
    clock.advance(c.cfg.coordinator.lease_timeout_s + 1)
    assert "per_device_train_batch_size" not in c.lease("w6").params  # the first fleet is gone


def test_a_split_round_is_verified_and_counted_at_its_leased_batch(tmp_path):
    """The coordinator checks the rollouts of a split round against the lease's batch and counts its samples from
    it; the batch is part of the lease's signature, so a worker cannot enlarge or shrink its share."""
    store, c, _ = local_coordinator(tmp_path, SECRET, **SPLIT)
    c.lease("w1")
    lease = c.lease("w2")
    assert _batch(lease) == 4
    assert c.submit(lease, push_submission(store, lease, tmp_path, seed=1))["status"] == "merged"
    v1 = runrepo.read_state(store).versions[1]
    assert v1.samples == 4 * lease.steps
    forged = c.lease("w3")
    forged = forged.model_copy(update={"params": {**forged.params, "per_device_train_batch_size": 8}})
    with pytest.raises(LeaseError):
        c.submit(forged, push_submission(store, forged, tmp_path, seed=2))


def test_per_worker_leases_carry_no_batch(tmp_path):
    store, c, _ = local_coordinator(tmp_path, SECRET, **{**SPLIT, "rounds.fleet_batch": "per_worker"})
    leases = [c.lease(w) for w in ("w1", "w2", "w3")]
    assert all("per_device_train_batch_size" not in lease.params for lease in leases)
    assert {len(lease.prompt_indices) for lease in leases} == {4 * c.cfg.rounds.steps}


def test_split_needs_whole_prompt_groups():
    base = ("base_model: builtin:tiny\nproject_name: t\n"
            "params: {per_device_train_batch_size: 6, num_generations: 4}\nrounds: {fleet_batch: split}\n")
    with pytest.raises(ConfigError) as ei:
        loads(base)
    assert "multiple of num_generations" in str(ei.value)
    cfg = loads(base.replace("6", "16"))
    assert [cfg.worker_batch(n) for n in (1, 2, 3, 4, 5, 64)] == [16, 8, 8, 4, 4, 4]
