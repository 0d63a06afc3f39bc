"""Issue 36's chaos test: a coordinator SIGKILLed at random moments and restarted loses at most the versions merged
since its last checkpoint, merges no round twice, and every checkpoint tag loads with PEFT.

Real processes and real HTTP: the Hub emulator on 127.0.0.1 with the Hub's commit quota on, the coordinator in a
subprocess (restarted on the same port after each kill), four model-free workers in threads (leasing, getting the
leased version from the coordinator's adapter route, uploading a round through it: ``hub.submissions:
coordinator``, rounds kept on the coordinator's disk across its restarts), so the only commits are checkpoints
(every 3 s here; versions come every fraction of a second).
"""

from __future__ import annotations

import pytest

from tests.support.restart_loop import REPO, check_history, kill_loop
from tests.support.space_support import make_run, start_emulator

KILLS = 2  # each restart starts a coordinator process (~15 s)


def _setup(tmp_path):
    emu = start_emulator()
    emu.set_commit_quota(128)
    store = make_run(emu, tmp_path, REPO.split("/")[1], **{
        "merge.quorum": 1, "rounds.versions": 100000, "coordinator.checkpoint_every_s": 3,
        "hub.submissions": "coordinator", "coordinator.lease_timeout_s": 30, "merge.max_staleness": 4,
        "coordinator.rate_limit_per_minute": 6000})
    return emu, store


@pytest.mark.timeout(300)
def test_a_killed_coordinator_loses_at_most_the_versions_since_its_checkpoint(tmp_path):
    emu, store = _setup(tmp_path)
    try:
        restarts, answers = kill_loop(store, emu.url, tmp_path, KILLS)
        final = check_history(store, tmp_path)
    finally:
        emu.stop()
    for live, cp, held, _ in restarts:  # each restart went on from the checkpoint the repo held at the kill ...
        assert [v.adapter_id for v in final.versions[:held.version + 1]] == [v.adapter_id for v in held.versions]
        assert 0 <= live - held.version <= live - cp  # ... and lost only versions merged after the last checkpoint
    assert any(a.get("status") in ("admitted", "merged") for a in answers)
