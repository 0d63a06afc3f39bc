"""A free-rider against a served coordinator (HTTP + repo commits, the ``Run`` of test_adversarial): it trains
nothing (its adapter is the leased one, or that plus noise far below a step) and submits completions copied from
the data set's answers, so every recomputed reward is 1.0 — true of what it submitted, and worthless. Its rounds
are admitted but merged with weight 0, earn no leaderboard credit and never rank it above an honest worker; the
model card says what is and is not verified."""

from __future__ import annotations

import pytest
from safetensors.torch import load_file

from hubgrpo import layout
from hubgrpo.layout import RunState
from tests.support.adversarial_run import Run
from tests.support.coord_helpers import submission_record, trained_adapter, write_rollouts


def free_ride(run: Run, name: str = "mallory", noise: float = 0.0) -> dict:
    """One free-riding round: the leased adapter back (B + ``noise``), the data set's answers as completions."""
    lease = run.client.lease(name)
    run.seed += 1
    folder = trained_adapter(run.client, lease, run.tmp / "free" / lease.lease_id, run.seed, b_scale=noise)
    (folder / layout.SUBMISSION_FILE).write_bytes(submission_record(lease, reward=1.0).to_json())
    write_rollouts(folder, lease, run.coord.cfg, reward=1.0)  # every completion is the row's answer
    if noise == 0.0:
        base = load_file(run.client.adapter(lease.base_version, lease.base_sha, run.tmp / "bases", 1 << 30)
                         / layout.ADAPTER_WEIGHTS)
        assert all((load_file(folder / layout.ADAPTER_WEIGHTS)[k] == v).all() for k, v in base.items())
    return run.deliver(lease, folder)


def entries_of(state: RunState, worker: str) -> list:
    return [m for v in state.versions for m in v.merged if m.worker == worker]


@pytest.mark.timeout(240)
def test_a_free_rider_gets_no_merge_weight_no_credit_and_no_rank(tmp_path):
    run = Run(tmp_path, **{"merge.quorum": 2})
    try:
        for i in range(4):  # honest and free-riding rounds merged together, two per version
            honest = run.client.lease("honest")
            answer = run.deliver(honest, run.folder(honest))
            ride = free_ride(run, noise=0.0 if i < 3 else 1e-5)  # later: noise far below one step's norm
            assert ride["status"] in ("admitted", "merged"), ride
            run.wait_merged(ride["submission_id"])
            run.wait_merged(answer["submission_id"])
        state = run.saved_state()
        ridden, honest_rounds = entries_of(state, "mallory"), entries_of(state, "honest")
        assert len(ridden) == 4 and len(honest_rounds) == 4
        assert all(m.reward_mean == 1.0 for m in ridden)  # what it submitted does score 1.0 ...
        assert all(m.weight == 0.0 for m in ridden), [m.weight for m in ridden]  # ... and moves nothing
        assert all(m.weight == 1.0 for m in honest_rounds)
        assert all(v.reward_mean == 0.5 for v in state.versions[1:])  # the versions' reward: the credited rounds'
        board = run.client.status()["leaderboard"]
        assert board[0]["worker"] == "honest", board
        row = next(r for r in board if r["worker"] == "mallory")
        assert row["accepted"] == 0 and row["samples"] == 0 and row["mean_reward"] is None
        assert row["uncredited"] == 4
        card = run.store.read(layout.MODEL_CARD).decode()
        assert "Not verified" in card and "weight 0" in card
        run.check_state_and_restart()
    finally:
        run.close()


@pytest.mark.timeout(120)
def test_a_version_of_free_riders_alone_leaves_the_adapter_as_it_was(tmp_path):
    run = Run(tmp_path)  # quorum 1: the free-rider's round alone makes the version
    try:
        run.honest_version()
        run.saved_state()  # the honest version's checkpoint (its adapter) is in the repo: versions go live first
        before = run.store.read(layout.ADAPTER_WEIGHTS)
        ride = free_ride(run)
        version = run.wait_merged(ride["submission_id"])
        state = run.saved_state()
        assert state.versions[version].merged[0].weight == 0.0 and state.versions[version].reward_mean is None
        assert load_file_bytes(run.store.read(layout.ADAPTER_WEIGHTS)) == load_file_bytes(before)
        assert run.honest_version() == version + 1  # the run goes on
    finally:
        run.close()


def load_file_bytes(data: bytes) -> dict:
    from safetensors.torch import load

    return {k: v.tolist() for k, v in load(data).items()}
