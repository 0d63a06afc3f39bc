"""Held-out scores in the coordinator: kept until a state.json commit, flushed on their own, and ``merge.eval_gate``
(a bad score makes the next merge start from the best version)."""

from __future__ import annotations

from pathlib import Path

import torch

from hubgrpo import runrepo
from hubgrpo.coordinator.core import Coordinator
from hubgrpo.coordinator.repo_init import init_repo
from hubgrpo.merge import dense_delta, load_adapter_dir
from hubgrpo.space import view
from hubgrpo.store.local import LocalStore
from tests.support.coord_helpers import FakeClock, make_config, push_submission, write_adapter

SECRET = b"evals-secret"


def _coordinator(tmp: Path, **settings) -> tuple[LocalStore, Coordinator, FakeClock]:
    store, clock = LocalStore(tmp / "repo"), FakeClock(1_000_000.0)
    cfg = make_config(**{"merge.quorum": 1, "rounds.versions": 20, **settings})
    init_repo(store, cfg, write_adapter(tmp / "v0", 0))
    return store, Coordinator(store, SECRET, clock=clock, workdir=tmp / "coord"), clock


def _merge(c: Coordinator, store, tmp: Path, seed: int) -> int:
    lease = c.lease(f"w{seed}")
    assert c.submit(lease, push_submission(store, lease, tmp / "rounds", seed=seed))["status"] == "merged"
    return c.state.version


def _delta(store, c: Coordinator, v: int, tmp: Path) -> dict:
    return dense_delta(load_adapter_dir(runrepo.adapter_at(store, c.shas[v], tmp / "check" / str(v))))


def test_scores_wait_for_a_commit_then_reach_state_json_on_their_own(tmp_path):
    store, c, clock = _coordinator(tmp_path)
    _merge(c, store, tmp_path, 1)
    assert c.record_eval(1, 0.25, 8)["status"] == "recorded"
    assert c.status()["versions"][1]["eval_reward"] == 0.25  # shown at once
    curve = view.reward_curve(c.status())  # the Space plots it beside the training reward
    assert sorted(curve[curve["series"] == view.HELD_OUT]["version"]) == [1]
    assert sorted(curve[curve["series"] == view.TRAINING]["version"]) == [1]
    assert runrepo.read_state(store).versions[1].eval_reward is None  # not committed yet
    _merge(c, store, tmp_path, 2)  # … the next merge commit carries it
    assert runrepo.read_state(store).versions[1].eval_reward == 0.25 and c.new_evals == {}
    c.record_eval(2, 0.5, 8)
    c.tick()
    assert runrepo.read_state(store).versions[2].eval_reward is None  # waits refusal_flush_s for a merge
    clock.advance(c.cfg.coordinator.refusal_flush_s + 1)
    c.tick()  # no merge came: a state-only commit
    state = runrepo.read_state(store)
    assert state.versions[2].eval_reward == 0.5 and state.versions[2].eval_samples == 8
    assert "0.5" in store.read("README.md").decode()  # the model card's reward table shows it


def test_eval_gate_starts_the_next_merge_from_the_best_version_once(tmp_path):
    # (outer lr 1 for any fleet: the version is checked against the exact sum of its round)
    store, c, _ = _coordinator(tmp_path, **{"merge.method": "ffa", "merge.eval_gate": 0.1,
                                            "merge.fleet_outer_lr": "null"})
    for seed in (1, 2, 3):
        _merge(c, store, tmp_path, seed)
    for v, score in ((0, 0.2), (1, 0.6), (2, 0.55)):
        c.record_eval(v, score, 4)
    assert _merge(c, store, tmp_path, 4) == 4 and c.state.versions[4].start_version is None  # within the margin
    c.record_eval(3, 0.3, 4)  # 0.3 < 0.6 − 0.1: the next merge starts from version 1
    lease = c.lease("w5")
    sha = push_submission(store, lease, tmp_path / "rounds", seed=5)
    sub = dense_delta(load_adapter_dir(tmp_path / "rounds" / f"w5-{lease.lease_id}"))
    assert c.submit(lease, sha)["status"] == "merged"
    assert c.state.versions[5].start_version == 1 and runrepo.read_state(store).versions[5].start_version == 1
    new, best, base = (_delta(store, c, v, tmp_path) for v in (5, 1, 4))
    for k in new:  # version 5 = version 1 + the round's update (it was trained from version 4)
        assert torch.allclose(new[k], best[k] + sub[k] - base[k], atol=1e-6)
    _merge(c, store, tmp_path, 6)
    assert c.state.versions[6].start_version is None  # one revert per bad score
    rows = view.version_rows(c.status(), dict(c.shas), store)
    assert [r[4] for r in rows if r[0] == 5] == ["v1 (eval gate)"]
