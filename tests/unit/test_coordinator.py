"""Coordinator logic on a LocalStore with synthetic adapters and a fake clock (no model, no network)."""

from __future__ import annotations

import math
import time

import pytest
import torch
from safetensors.torch import load_file, save_file

from hubgrpo import layout, runrepo
from hubgrpo.coordinator.core import Coordinator
from hubgrpo.errors import InvalidSubmission, LeaseError, Refused
from hubgrpo.store.local import LocalStore
from tests.support.coord_helpers import local_coordinator, push_submission

SECRET = b"test-secret"
pytestmark = pytest.mark.timeout(120)


def _setup(tmp_path, **overrides):
    return local_coordinator(tmp_path, SECRET, **overrides)


def test_quorum_merge_writes_one_commit_and_a_tag(tmp_path):
    store, c, _ = _setup(tmp_path)
    l1, l2 = c.lease("w1"), c.lease("w2")
    assert l1.base_version == 0 and set(l1.prompt_indices).isdisjoint(l2.prompt_indices)
    assert c.submit(l1, push_submission(store, l1, tmp_path, seed=1, reward=0.25))["status"] == "admitted"
    before = len(store.history())
    assert c.submit(l2, push_submission(store, l2, tmp_path, seed=2, reward=0.75))["status"] == "merged"
    assert len(store.history()) == before + 2  # w2's submission commit + ONE merge commit
    state = runrepo.read_state(store)
    assert state.version == 1 and sorted(state.merged_ids) == sorted(c.state.merged_ids)
    v1 = state.versions[1]
    assert len(v1.merged) == 2 and math.isclose(sum(m.weight for m in v1.merged), 1.0)
    assert math.isclose(v1.reward_mean, 0.5, rel_tol=1e-6)  # recomputed from the rollouts
    assert store.tags()[layout.version_tag(1)] == store.history()[0].sha
    root = load_file(str(store.local_path(layout.ADAPTER_WEIGHTS)))
    assert any(k.endswith("lora_B.weight") and v.abs().sum() > 0 for k, v in root.items())


def test_duplicate_submit_is_not_merged_twice(tmp_path):
    store, c, _ = _setup(tmp_path)
    l1, l2 = c.lease("w1"), c.lease("w2")
    sha1 = push_submission(store, l1, tmp_path, seed=1)
    c.submit(l1, sha1)
    assert c.submit(l1, sha1)["status"] == "duplicate"
    c.submit(l2, push_submission(store, l2, tmp_path, seed=2))
    assert c.submit(l1, sha1)["status"] == "duplicate"
    assert runrepo.read_state(store).merged_ids.count(layout.submission_id("w1", l1.lease_id)) == 1


def test_stale_submission_is_refused_with_reason(tmp_path):
    store, c, _ = _setup(tmp_path, **{"merge.max_staleness": 0})
    old = c.lease("slow")
    for w, seed in (("w1", 1), ("w2", 2)):
        lease = c.lease(w)
        c.submit(lease, push_submission(store, lease, tmp_path, seed=seed))
    assert c.state.version == 1
    with pytest.raises(InvalidSubmission) as ei:
        c.submit(old, push_submission(store, old, tmp_path, seed=3))
    assert ei.value.code == "stale" and "1 versions old" in ei.value.message
    assert c.status()["refusals"][-1]["code"] == "stale"


def test_stale_but_allowed_submission_uses_its_own_base(tmp_path):
    store, c, _ = _setup(tmp_path, **{"merge.max_staleness": 2, "merge.quorum": 1})
    old = c.lease("slow")
    lease = c.lease("w1")
    c.submit(lease, push_submission(store, lease, tmp_path, seed=1))
    assert c.state.version == 1
    c.submit(old, push_submission(store, old, tmp_path, seed=2))
    v2 = runrepo.read_state(store).versions[2]
    assert v2.merged[0].staleness == 1 and v2.merged[0].base_version == 0
    assert v2.merged[0].weight == pytest.approx(1.0)


def test_staleness_limit_grows_with_live_workers(tmp_path):
    """merge.staleness_per_worker: the limit is that many versions per distinct worker that leased or renewed
    within lease_timeout_s (the coordinator's count), never below max_staleness, never above max_lease_age."""
    store, c, clock = _setup(tmp_path, **{"merge.max_staleness": 0, "merge.staleness_per_worker": 1,
                                          "merge.quorum": 1, "rounds.versions": 20})
    old = c.lease("slow")
    for w, seed in (("w1", 1), ("w2", 2)):
        lease = c.lease(w)
        c.submit(lease, push_submission(store, lease, tmp_path, seed=seed))
    assert c.state.version == 2  # slow, w1 and w2 leased just now: a round 2 versions old is admitted
    c.submit(old, push_submission(store, old, tmp_path, seed=3))
    assert c.state.version == 3 and runrepo.read_state(store).versions[3].merged[0].staleness == 2
    clock.advance(c.cfg.coordinator.lease_timeout_s + 1)  # the first fleet is gone; two machines remain
    late = c.lease("late")
    for seed in (4, 5, 6):
        lease = c.lease("w3")
        c.submit(lease, push_submission(store, lease, tmp_path, seed=seed))
    with pytest.raises(InvalidSubmission) as ei:
        c.submit(late, push_submission(store, late, tmp_path, seed=7))
    assert ei.value.code == "stale" and "3 versions old" in ei.value.message
    assert "limit 2 with staleness_per_worker 1" in ei.value.message


def test_the_fleet_outer_lr_applies_while_two_or_more_workers_are_live(tmp_path):
    """merge.fleet_outer_lr: a version merged while the coordinator counts two live workers steps by it (the
    ledger records the step); one machine alone, or a fleet gone quiet, steps by outer_lr."""
    store, c, clock = _setup(tmp_path, **{"merge.quorum": 1, "merge.fleet_outer_lr": 1.5, "rounds.versions": 20})
    alone = c.lease("w1")
    c.submit(alone, push_submission(store, alone, tmp_path, seed=1))
    c.lease("w2")
    both = c.lease("w1")
    c.submit(both, push_submission(store, both, tmp_path, seed=2))
    clock.advance(c.cfg.coordinator.lease_timeout_s + 1)  # w2 has gone quiet: w1 is alone again
    again = c.lease("w1")
    c.submit(again, push_submission(store, again, tmp_path, seed=3))
    assert [v.outer_lr for v in runrepo.read_state(store).versions[1:4]] == [1.0, 1.5, 1.0]


def test_a_fleet_step_that_decays_fades_with_the_learning_rate(tmp_path):
    """merge.fleet_outer_lr_decays (the default): the fleet's step above outer_lr follows the schedule's learning
    rate at the version being merged: 1.5 before a wsd decay, back towards 1 over it."""
    store, c, clock = _setup(tmp_path, **{"merge.quorum": 1, "merge.fleet_outer_lr": 1.5, "rounds.versions": 4,
                                          "rounds.lr_schedule": "wsd", "rounds.lr_decay": 0.5})
    c.lease("w2")  # a second live worker all along
    for seed in (1, 2, 3, 4):
        lease = c.lease("w1")
        c.submit(lease, push_submission(store, lease, tmp_path, seed=seed))
    steps = [v.outer_lr for v in runrepo.read_state(store).versions[1:5]]
    scales = [c.cfg.rounds.lr_scale(v) for v in range(1, 5)]
    assert scales[:2] == [1.0, 1.0] and scales[3] < scales[2] < 1.0  # stable, then the decay
    assert steps == pytest.approx([1 + 0.5 * s for s in scales])


def test_a_restarted_coordinator_keeps_its_fleet_count(tmp_path):
    """The workers' last contact is in state.json: a round pushed just before a restart, as stale as the fleet
    allowed, is admitted by the new coordinator (whose live leases have not come back yet)."""
    store, c, clock = _setup(tmp_path, **{"merge.max_staleness": 0, "merge.staleness_per_worker": 1,
                                          "merge.quorum": 1})
    old = c.lease("slow")
    for w, seed in (("w1", 1), ("w2", 2)):
        lease = c.lease(w)
        c.submit(lease, push_submission(store, lease, tmp_path, seed=seed))
    push_submission(store, old, tmp_path, seed=3)  # 2 versions old; the coordinator dies before its submit
    c2 = Coordinator(store, SECRET, clock=clock, workdir=tmp_path / "work2")
    assert c2.active == {} and list(c2.pending) == [layout.submission_id("slow", old.lease_id)]
    assert c2.maybe_merge() and c2.state.version == 3


def test_an_admitted_round_is_not_refused_when_the_fleet_shrinks(tmp_path):
    """A pending round keeps the limit it was admitted under: the merge does not refuse it because the workers
    counted then have gone quiet since."""
    store, c, clock = _setup(tmp_path, **{"merge.max_staleness": 0, "merge.staleness_per_worker": 1,
                                          "merge.quorum": 2})
    old = c.lease("slow")
    for seed in (1, 3):
        l1, l2 = c.lease("w1"), c.lease("w2")
        c.submit(l1, push_submission(store, l1, tmp_path, seed=seed))
        c.submit(l2, push_submission(store, l2, tmp_path, seed=seed + 1))
    assert c.state.version == 2
    assert c.submit(old, push_submission(store, old, tmp_path, seed=5))["status"] == "admitted"  # 2 old, 3 live
    clock.advance(c.cfg.coordinator.lease_timeout_s + 1)  # now only w4 counts: a limit of 1
    fresh = c.lease("w4")
    assert c.submit(fresh, push_submission(store, fresh, tmp_path, seed=6))["status"] == "merged"
    v3 = runrepo.read_state(store).versions[3]
    assert sorted((m.worker, m.staleness) for m in v3.merged) == [("slow", 2), ("w4", 0)]


def test_the_trainer_of_a_round_is_its_signed_lease_not_its_record(tmp_path):
    """submission.json naming another user (to take their place on the leaderboard, or in the fleet count) is
    overruled by the lease it was submitted with; a record whose lease names them is refused (``lease_mismatch``:
    a verifier replays with the record's lease, so it must be the signed one)."""
    import json as _json

    store, c, _ = _setup(tmp_path, **{"merge.quorum": 1})

    def claim_alice(in_lease: bool):
        def mutate(folder):
            rec = _json.loads((folder / layout.SUBMISSION_FILE).read_text())
            rec["user"] = "alice"
            if in_lease:
                rec["lease"]["user"] = "alice"
            (folder / layout.SUBMISSION_FILE).write_text(_json.dumps(rec))

        return mutate

    forged = c.lease("gpu1", user="mallory")
    with pytest.raises(InvalidSubmission) as e:
        c.submit(forged, push_submission(store, forged, tmp_path, seed=1, mutate=claim_alice(True)))
    assert e.value.code == "lease_mismatch" and "user" in e.value.message
    lease = c.lease("gpu2", user="mallory")
    c.submit(lease, push_submission(store, lease, tmp_path, seed=2, mutate=claim_alice(False)))
    entry = runrepo.read_state(store).versions[1].merged[0]
    assert entry.user == "mallory" and not [k for k in c.state.workers if k.startswith("alice/")]


def test_staleness_limit_bounds():
    from hubgrpo.config import MergeSection

    m = MergeSection(max_staleness=4, staleness_per_worker=2, max_lease_age=32)
    assert [m.staleness_limit(n) for n in (0, 1, 2, 4, 8, 100)] == [4, 4, 4, 8, 16, 32]
    assert m.lease_age_limit() == 32  # what the pruning of never-submitted folders may assume
    assert MergeSection(max_staleness=4, staleness_per_worker=0).staleness_limit(100) == 4  # 0: off
    assert MergeSection(max_staleness=4).staleness_limit(100) == 32  # the default follows the fleet, to max_lease_age
    with pytest.raises(ValueError):
        MergeSection(staleness_per_worker=float("nan"))
    fleet = MergeSection(outer_lr=0.8, fleet_outer_lr=1.5)
    assert [fleet.fleet_lr(n) for n in (0, 1, 2, 8)] == [0.8, 0.8, 1.5, 1.5]
    assert MergeSection(outer_lr=0.8, fleet_outer_lr=None).fleet_lr(8) == 0.8  # None: outer_lr for any fleet
    assert [MergeSection().fleet_lr(n) for n in (1, 2)] == [1.0, 1.5]  # the default recipe
    # the default fades with the schedule's rate (wsd's last version: lr_final 0.1), clamped to [0, 1]
    assert [MergeSection().fleet_lr(2, s) for s in (0.1, 0.0, 2.0)] == pytest.approx([1.05, 1.0, 1.5])
    assert MergeSection(fleet_outer_lr_decays=False).fleet_lr(2, 0.1) == 1.5  # false: 1.5 to the last version
    assert MergeSection().fleet_lr(1, 0.1) == 1.0  # a machine alone: outer_lr whatever the schedule
    for bad in (0, -1, 11, float("nan")):
        with pytest.raises(ValueError):
            MergeSection(fleet_outer_lr=bad)


def test_leases_carry_the_run_learning_rate_schedule(tmp_path):
    """rounds.lr_schedule: a lease on version v trains at run_lr(v) — signed into the lease, and the bound on
    how far its steps may move an entry uses it."""
    from hubgrpo.coordinator.admission import step_bound

    store, c, _ = _setup(tmp_path, **{"rounds.lr_schedule": "cosine", "rounds.lr_final": 0.1,
                                      "rounds.versions": 4, "merge.quorum": 1})
    first = c.lease("w1")
    assert first.params == {"learning_rate": pytest.approx(0.1)}
    c.submit(first, push_submission(store, first, tmp_path, seed=1))
    second = c.lease("w1")
    assert second.base_version == 1 and second.params["learning_rate"] == pytest.approx(c.cfg.run_lr(1))
    assert 0.01 < second.params["learning_rate"] < 0.1
    bound, why = step_bound(c.cfg, second, c.adapter(1))
    assert f"learning rate {c.cfg.run_lr(1):g}" in why
    forged = second.model_copy(update={"params": {"learning_rate": 1.0}})
    with pytest.raises(LeaseError, match="signature"):
        c.submit(forged, push_submission(store, forged, tmp_path, seed=2))
    assert _setup(tmp_path / "plain")[1].lease("w1").params == {}  # constant: the worker's config applies


def test_expired_lease_returns_its_prompts(tmp_path):
    store, c, clock = _setup(tmp_path)
    lease = c.lease("w1")
    clock.advance(c.cfg.coordinator.lease_timeout_s + 1)
    c.tick()
    assert c.active == {}
    # heartbeats lost while the coordinator was unreachable: honoured within one round of grace, and the revived
    # lease takes its prompts back from the pool, so they are not handed out twice ...
    assert c.heartbeat(lease).deadline > clock()
    fresh = c.lease("w2")
    assert not set(fresh.prompt_indices) & set(lease.prompt_indices)
    # ... but once its prompts went to another live lease, the expired lease is not revived
    clock.advance(c.cfg.coordinator.lease_timeout_s + 1)
    c.tick()
    assert c.active == {}
    again = c.lease("w3")
    assert again.prompt_indices == lease.prompt_indices  # returned prompts are handed out first
    with pytest.raises(LeaseError, match="leased again"):
        c.heartbeat(lease)
    # ... and a lease that expired longer ago than round_timeout_s is refused whatever its prompts
    clock.advance(c.cfg.coordinator.lease_timeout_s + c.cfg.coordinator.round_timeout_s + 1)
    with pytest.raises(LeaseError, match="expired"):
        c.heartbeat(again)


def test_heartbeat_extends_and_forged_lease_is_refused(tmp_path):
    store, c, clock = _setup(tmp_path)
    lease = c.lease("w1")
    clock.advance(c.cfg.coordinator.lease_timeout_s - 1)
    renewed = c.heartbeat(lease)
    assert renewed.deadline > lease.deadline
    clock.advance(10)
    c.heartbeat(renewed)
    forged = renewed.model_copy(update={"base_version": 0, "steps": 999})
    with pytest.raises(LeaseError, match="invalid signature"):
        c.heartbeat(forged)
    other = Coordinator(store, b"another-secret", clock=clock, workdir=tmp_path / "w2")
    with pytest.raises(LeaseError):
        other.heartbeat(renewed)


def test_round_deadline_merges_a_single_submission(tmp_path):
    store, c, clock = _setup(tmp_path, **{"merge.quorum": 3})
    lease = c.lease("w1")
    assert c.submit(lease, push_submission(store, lease, tmp_path, seed=1))["status"] == "admitted"
    c.tick()
    assert c.state.version == 0
    clock.advance(c.cfg.coordinator.round_timeout_s + 1)
    c.tick()
    assert c.state.version == 1 and runrepo.read_state(store).version == 1


def test_restarted_coordinator_loses_nothing_and_merges_nothing_twice(tmp_path):
    store, c, clock = _setup(tmp_path)
    l1, l2 = c.lease("w1"), c.lease("w2")
    c.submit(l1, push_submission(store, l1, tmp_path, seed=1))
    sha2 = push_submission(store, l2, tmp_path, seed=2)  # pushed, but the coordinator dies before submit
    c2 = Coordinator(store, SECRET, clock=clock, workdir=tmp_path / "work2")
    assert sorted(c2.pending) == sorted([layout.submission_id("w1", l1.lease_id),
                                         layout.submission_id("w2", l2.lease_id)])
    assert c2.maybe_merge() and c2.state.version == 1
    assert c2.submit(l2, sha2)["status"] == "duplicate"
    c3 = Coordinator(store, SECRET, clock=clock, workdir=tmp_path / "work3")
    assert c3.pending == {} and c3.state.version == 1
    assert len(c3.state.merged_ids) == len(set(c3.state.merged_ids)) == 2


def test_missing_tag_after_crash_is_reconciled(tmp_path):
    store, c, clock = _setup(tmp_path, **{"merge.quorum": 1})
    lease = c.lease("w1")
    c.submit(lease, push_submission(store, lease, tmp_path, seed=1))
    tags = store.tags()
    sha = tags.pop(layout.version_tag(1))
    # simulate a crash between the merge commit and its tag: a fresh store without that tag
    import json

    (store.meta / "tags.json").write_text(json.dumps(tags))
    c2 = Coordinator(store, SECRET, clock=clock, workdir=tmp_path / "w2")
    assert store.tags()[layout.version_tag(1)] == sha and c2.state.version == 1


def test_commit_budget_refuses_leases_with_a_wait(tmp_path):
    # the init commit + 1 live lease + its merge share = 3 planned commits; a second lease would make 4
    store, c, _ = _setup(tmp_path, **{"coordinator.commit_budget_per_hour": 3})
    c.lease("w1")
    with pytest.raises(Refused) as ei:
        c.lease("w2")
    assert ei.value.code == "budget" and "wait_s=" in ei.value.hint
    assert c.status()["commits_last_hour"] >= 1


def _nan(folder):
    sd = load_file(str(folder / layout.ADAPTER_WEIGHTS))
    k = sorted(sd)[0]
    sd[k][0, 0] = float("nan")
    save_file(sd, str(folder / layout.ADAPTER_WEIGHTS))


def test_hostile_submission_refused_and_recorded(tmp_path):
    store, c, _ = _setup(tmp_path)
    bad, l1, l2 = c.lease("evil"), c.lease("w1"), c.lease("w2")
    with pytest.raises(InvalidSubmission) as ei:
        c.submit(bad, push_submission(store, bad, tmp_path, seed=9, mutate=_nan))
    assert ei.value.code == "nonfinite"
    for lease, seed in ((l1, 1), (l2, 2)):
        c.submit(lease, push_submission(store, lease, tmp_path, seed=seed))
    state = runrepo.read_state(store)
    assert state.version == 1 and [r.code for r in state.refused] == ["nonfinite"]
    assert state.workers["evil"].refused == 1 and state.workers["w1"].accepted == 1
    assert torch.isfinite(load_file(str(store.local_path(layout.ADAPTER_WEIGHTS)))[
        sorted(load_file(str(store.local_path(layout.ADAPTER_WEIGHTS))))[0]]).all()


def test_run_finishes_at_target_versions(tmp_path):
    store, c, _ = _setup(tmp_path, **{"rounds.versions": 2, "merge.quorum": 1})
    for i in range(2):
        lease = c.lease(f"w{i}")
        c.submit(lease, push_submission(store, lease, tmp_path, seed=i + 1))
    assert c.state.finished and runrepo.read_state(store).finished
    with pytest.raises(Refused) as ei:
        c.lease("late")
    assert ei.value.code == "finished"


def test_every_unsaved_refusal_stays_visible_in_the_status(tmp_path):
    """A round admitted while a merge computes, refused as too stale when the next merge is planned, with no merge
    after it: its refusal is saved only with a later merge, and must not drop out of the status behind newer
    refusals (the load benchmark once counted two such rounds as lost)."""
    store, c, clock = _setup(tmp_path, **{"merge.max_staleness": 0, "coordinator.commit_budget_per_hour": 1000})
    c.use_merge_thread()  # as under the server: submits only admit; merges go plan → compute → finish
    l1, l2, late = c.lease("w1"), c.lease("w2"), c.lease("late")
    for lease, seed in ((l1, 1), (l2, 2)):
        c.submit(lease, push_submission(store, lease, tmp_path, seed=seed))
    plan = c.plan_merge()
    assert c.submit(late, push_submission(store, late, tmp_path, seed=3))["status"] == "admitted"
    assert c.finish_merge(plan, plan.compute()) and c.state.version == 1
    clock.advance(c.cfg.coordinator.round_timeout_s + 1)  # the round deadline makes a merge of late due
    assert c.merge_due() and c.plan_merge() is None  # late's base is 1 version old: refused, nothing to merge
    for i in range(60):  # newer refusals; no merge comes to save any of them
        lease = c.lease(f"bad{i}")
        with pytest.raises(InvalidSubmission):
            c.submit(lease, "0" * 40)
    status = c.status()
    assert status["refusals_unsaved"] == 61 and status["pending"] == []
    late_id = layout.submission_id("late", late.lease_id)
    assert [r["code"] for r in status["refusals"] if r["submission_id"] == late_id] == ["stale"]


def test_two_coordinators_on_one_repo_never_lose_or_double_a_step(tmp_path):
    """Two coordinators (a Space and a forgotten local one, say) on one repo with outer momentum: the one whose
    checkpoint loses the compare-and-swap reloads — state, tags and the momentum the other wrote — and, finding its
    round again in the repo, merges it on top."""
    from hubgrpo.merge import MergeOptions, load_adapter_dir, merge
    from safetensors.torch import load

    store, c1, clock = _setup(tmp_path, **{"merge.quorum": 1, "merge.outer_momentum": 0.9, "merge.nesterov": "true"})
    c2 = Coordinator(store, SECRET, clock=clock, workdir=tmp_path / "work2")
    l1, l2 = c1.lease("w1"), c2.lease("w2")
    s1, s2 = push_submission(store, l1, tmp_path, seed=1), push_submission(store, l2, tmp_path, seed=2)
    assert c1.submit(l1, s1)["status"] == "merged"
    m1 = load(store.read(layout.MOMENTUM_FILE))
    answer = c2.submit(l2, s2)  # c2 merges a live version 1; its checkpoint loses the CAS: it reloads c1's
    assert answer["status"] == "merged" and c2.state.version == 1 and c2.momentum is None
    assert c2.shas[1] == store.tags()["v000001"] and c2.ids[1] == c1.ids[1]
    assert c2.scan_pass(force=True) == 1  # its round, merged only into the version it lost, is found again
    assert c2.maybe_merge() and c2.state.version == 2
    state = runrepo.read_state(store)
    assert [v.version for v in state.versions] == [0, 1, 2]
    assert sorted(state.merged_ids) == sorted({layout.submission_id("w1", l1.lease_id),
                                               layout.submission_id("w2", l2.lease_id)})
    assert state.versions[2].merged[0].staleness == 1
    # version 2's momentum continues version 1's (m2 = μ·m1 + g2), i.e. c1's step was not dropped
    v1 = load_adapter_dir(runrepo.adapter_at(store, c2.shas[1], tmp_path / "a"))
    v0 = load_adapter_dir(runrepo.adapter_at(store, c2.shas[0], tmp_path / "a"))
    sub2 = load_adapter_dir(runrepo.submission_at(store, 0, layout.submission_id("w2", l2.lease_id), s2,
                                                  tmp_path / "sub2"))
    opts = MergeOptions(outer_momentum=0.9, nesterov=True, rank=c2.cfg.lora.r)
    want = merge(v1, [(sub2, v0, 1.0)], opts, momentum=m1).momentum
    got = load(store.read(layout.MOMENTUM_FILE))
    assert all(torch.allclose(got[k], want[k], atol=1e-6) for k in want)
    fresh = merge(v1, [(sub2, v0, 1.0)], opts, momentum=None).momentum
    assert not all(torch.allclose(got[k], fresh[k], atol=1e-6) for k in fresh)
    # c1 still holds version 1's momentum in memory; its next merge loses the CAS to c2's version 2, reloads, and
    # must continue from version 2's momentum (the old in-memory one would silently drop c2's step)
    l3 = c1.lease("w3")
    s3 = push_submission(store, l3, tmp_path, seed=3)
    assert c1.submit(l3, s3)["status"] == "merged" and c1.state.version == 2  # lost the CAS: reloaded c2's v2
    assert c1.scan_pass(force=True) == 1
    assert c1.maybe_merge() and runrepo.read_state(store).version == 3
    v2 = load_adapter_dir(runrepo.adapter_at(store, c1.shas[2], tmp_path / "a"))
    sub3 = load_adapter_dir(runrepo.submission_at(store, 1, layout.submission_id("w3", l3.lease_id), s3,
                                                  tmp_path / "sub3"))
    want3 = merge(v2, [(sub3, v1, 1.0)], opts, momentum=got).momentum
    got3 = load(store.read(layout.MOMENTUM_FILE))
    assert all(torch.allclose(got3[k], want3[k], atol=1e-6) for k in want3)


def test_a_restarted_coordinator_continues_the_delayed_nesterov_buffer_from_the_repo(tmp_path):
    """merge.momentum_every 2: the buffer and its count live in the momentum file, so a coordinator that restarts
    between two merges updates the momentum at the right merge, with both outer gradients."""
    from hubgrpo.merge import MergeOptions, load_adapter_dir, merge
    from safetensors.torch import load

    store, c, clock = _setup(tmp_path, **{"merge.quorum": 1, "merge.outer_momentum": 0.9, "merge.nesterov": "true",
                                          "merge.momentum_every": 2})
    counts, states, shas = [], [], []
    for i in range(3):
        if i == 1:  # restart: nothing in memory, the momentum and its buffer come from the repo
            c = Coordinator(store, SECRET, clock=clock, workdir=tmp_path / f"work{i}")
        lease = c.lease(f"w{i}")
        shas.append(push_submission(store, lease, tmp_path, seed=i + 1))
        assert c.submit(lease, shas[-1])["status"] == "merged"
        states.append(load(store.read(layout.MOMENTUM_FILE)))
        counts.append(int(states[-1]["delayed_nesterov.buffered"]))
    assert counts == [1, 0, 1]
    assert not any(k.endswith(".momentum_B") for k in states[0]) and any(k.endswith(".buffer_B") for k in states[0])
    assert any(k.endswith(".momentum_B") for k in states[1]) and not any(k.endswith(".buffer_B") for k in states[1])
    # version 2's momentum is the mean of both outer gradients, as one uninterrupted merge sequence computes it
    opts = MergeOptions(outer_momentum=0.9, nesterov=True, momentum_every=2, rank=c.cfg.lora.r)
    v1 = load_adapter_dir(runrepo.adapter_at(store, c.shas[1], tmp_path / "a1"))
    entry = runrepo.read_state(store).versions[2].merged[0]
    sub = load_adapter_dir(runrepo.submission_at(store, 1, entry.submission_id, shas[1], tmp_path / "s"))
    want = merge(v1, [(sub, v1, 1.0)], opts, momentum=states[0]).momentum
    assert all(torch.allclose(states[1][k].float(), want[k].float(), atol=1e-6) for k in want)


class _SlowStore(LocalStore):
    """The real local store, slower to read (a remote bucket): concurrent readers overlap for sure."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.adapter_reads = 0

    def local_path(self, path, revision=None):
        if path == "adapter_model.safetensors":
            self.adapter_reads += 1
        time.sleep(0.05)
        return super().local_path(path, revision)


def test_submits_checked_at_once_read_the_global_adapter_once_and_all_get_it(tmp_path):
    """Parallel admission checks all need the base version's adapter: one read, no caller sees a half-deleted
    folder (it used to answer 'is not a PEFT adapter folder' to a worker, which then died)."""
    import threading

    store, _, clock = _setup(tmp_path)
    slow = _SlowStore(tmp_path / "repo")
    c = Coordinator(slow, SECRET, clock=clock, workdir=tmp_path / "work2")
    c.adapters.clear()
    barrier, results, errors = threading.Barrier(6), [], []

    def read():
        barrier.wait()
        try:
            results.append(c.adapter(0))
        except Exception as e:  # noqa: BLE001 - collected for the assertion
            errors.append(e)

    threads = [threading.Thread(target=read) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    assert len(results) == 6 and all(r is results[0] for r in results)
    assert slow.adapter_reads == 1


def test_a_budget_wait_never_exceeds_an_hour_when_the_store_clock_differs(tmp_path):
    """Commit times come from the store (the Hub's clock, or the real clock under a simulation's virtual one): a
    commit stamped later than the coordinator's now counts as made now, so a budget wait is at most an hour (a
    virtual clock at 0 once waited ~1.8e9 s for a commit stamped with the epoch)."""
    from hubgrpo.coordinator.core import Coordinator
    from tests.support.coord_helpers import FakeClock

    store, _, _ = _setup(tmp_path, **{"coordinator.commit_budget_per_hour": 3})
    c = Coordinator(store, SECRET, clock=FakeClock(1000.0), workdir=tmp_path / "virtual")
    c.lease("w1")
    with pytest.raises(Refused) as ei:
        c.lease("w2")
    assert ei.value.code == "budget" and 0 < ei.value.wait_s <= 3600
