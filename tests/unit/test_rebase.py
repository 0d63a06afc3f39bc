"""merge.rebase (FFA): a round moves onto a newer version between steps — the engine's move, the coordinator's
admission and merge of a rebased round, and the simulator offering the versions a machine would have seen."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from hubgrpo import layout, runrepo
from hubgrpo.errors import ConfigError, InvalidSubmission
from tests.support.coord_helpers import (FakeClock, local_coordinator, make_config, submission_record, write_adapter,
                                 write_rollouts)
from tests.support.models_fixture import make_lease, tiny_cache, tiny_config  # noqa: F401  (fixture)

pytestmark = pytest.mark.timeout(240)
SECRET = b"test-secret"
# outer lr 1 for any fleet (merge.fleet_outer_lr: null): these tests check a version against the exact sum of its rounds
FFA = {"merge.method": "ffa", "merge.rebase": "true", "merge.quorum": 1, "merge.max_staleness": 0,
       "merge.fleet_outer_lr": "null"}


def _setup(tmp_path, **overrides):
    return local_coordinator(tmp_path, SECRET, **overrides)


def _push(store, c, lease, tmp: Path, *, onto: int | None, seed: int) -> tuple[str, dict]:
    """A round of ``lease`` moved onto version ``onto``: the weights of ``onto`` with B + δ; returns (commit, B)."""
    sub_id = layout.submission_id(lease.worker, lease.lease_id)
    trained_on = lease.base_version if onto is None else min(onto, c.state.version)  # a claim may be a lie
    base_dir = runrepo.adapter_at(store, c.shas[trained_on], tmp / "bases")
    base = load_file(base_dir / layout.ADAPTER_WEIGHTS)
    delta = load_file(write_adapter(tmp / f"delta-{seed}", seed, 0.1) / layout.ADAPTER_WEIGHTS)
    weights = {k: base[k] + delta[k] if "lora_B" in k else base[k] for k in base}
    folder = tmp / sub_id
    folder.mkdir(parents=True)
    save_file(weights, str(folder / layout.ADAPTER_WEIGHTS))
    (folder / layout.ADAPTER_CONFIG).write_bytes((base_dir / layout.ADAPTER_CONFIG).read_bytes())
    onto_id = None if onto is None else c.ids.get(onto, c.ids[trained_on])  # a claim may name a version ahead
    record = submission_record(lease).model_copy(update={"rebased_version": onto, "rebased_sha": onto_id})
    (folder / layout.SUBMISSION_FILE).write_bytes(record.to_json())
    write_rollouts(folder, lease, runrepo.read_config(store))
    adds = {layout.submission_path(lease.base_version, sub_id, f.name): f for f in folder.iterdir()}
    return store.commit(adds, message=f"hubgrpo: submission {sub_id}"), weights


def test_rebase_needs_ffa():
    with pytest.raises(ConfigError, match="merge.method: ffa"):
        make_config(**{"merge.rebase": "true"})


def test_a_rebased_round_is_an_update_of_the_version_it_moved_onto(tmp_path):
    """max_staleness 0: the round leased v0 is 1 version old by its lease, 0 by the version it moved onto; with
    outer lr 1 the merge of it alone gives exactly its weights (its update counted from v1, not v0)."""
    store, c, _ = _setup(tmp_path, **FFA)
    slow = c.lease("slow")
    fast = c.lease("fast")
    c.submit(fast, _push(store, c, fast, tmp_path, onto=None, seed=1)[0])
    assert c.state.version == 1
    commit, weights = _push(store, c, slow, tmp_path, onto=1, seed=2)
    assert c.submit(slow, commit)["status"] == "merged"
    entry = runrepo.read_state(store).versions[2].merged[0]
    assert (entry.base_version, entry.staleness) == (1, 0)
    merged = load_file(str(store.local_path(layout.ADAPTER_WEIGHTS)))
    assert all(torch.allclose(merged[k], weights[k], atol=1e-6) for k in weights)


def test_a_round_that_did_not_move_is_still_stale(tmp_path):
    store, c, _ = _setup(tmp_path, **FFA)
    slow, fast = c.lease("slow"), c.lease("fast")
    c.submit(fast, _push(store, c, fast, tmp_path, onto=None, seed=1)[0])
    with pytest.raises(InvalidSubmission) as ei:
        c.submit(slow, _push(store, c, slow, tmp_path, onto=None, seed=2)[0])
    assert ei.value.code == "stale"


@pytest.mark.parametrize("settings,onto,why", [
    ({"merge.quorum": 1, "merge.max_staleness": 4}, 1, "does not rebase"),  # an svd run: no move is exact
    (FFA, 7, "between its lease's 0 and the current 1"),  # a version that does not exist yet
])
def test_a_rebase_the_run_cannot_check_is_refused(tmp_path, settings, onto, why):
    store, c, _ = _setup(tmp_path, **settings)
    slow, fast = c.lease("slow"), c.lease("fast")
    c.submit(fast, _push(store, c, fast, tmp_path, onto=None, seed=1)[0])
    with pytest.raises(InvalidSubmission) as ei:
        c.submit(slow, _push(store, c, slow, tmp_path, onto=onto, seed=2)[0])
    assert ei.value.code == "bad_rebase" and why in ei.value.message
    assert c.status()["refusals"][-1]["code"] == "bad_rebase"


def test_a_rebase_onto_an_older_version_than_the_lease_is_refused(tmp_path):
    store, c, _ = _setup(tmp_path, **{**FFA, "merge.max_staleness": 2})
    first = c.lease("a")
    c.submit(first, _push(store, c, first, tmp_path, onto=None, seed=1)[0])
    late = c.lease("b")  # leased at v1
    with pytest.raises(InvalidSubmission) as ei:
        c.submit(late, _push(store, c, late, tmp_path, onto=0, seed=2)[0])
    assert ei.value.code == "bad_rebase"


def test_a_worker_moves_onto_the_coordinators_version_at_its_next_poll_never_onto_a_tag(tmp_path):
    """The version and sha come from the coordinator's status: a tag someone with write access pushed ahead of
    the coordinator is not followed."""
    from hubgrpo.worker.rebase import CoordinatorSource

    store, c, _ = _setup(tmp_path, **FFA)
    clock = FakeClock(0.0)
    source = CoordinatorSource(InProcess(c), tmp_path / "cache", 1 << 30, poll_s=10, clock=clock)
    store.tag(layout.version_tag(7), store.history()[0].sha)  # a forged "newer version"
    assert source(1, 0) is None  # the coordinator is at version 0
    fast = c.lease("fast")
    c.submit(fast, _push(store, c, fast, tmp_path, onto=None, seed=1)[0])
    clock.advance(5)
    assert source(2, 0) is None  # polled 5 s ago: not again yet
    clock.advance(5)
    version, folder = source(3, 0)
    got, head = load_file(folder / layout.ADAPTER_WEIGHTS), load_file(str(store.local_path(layout.ADAPTER_WEIGHTS)))
    assert version == 1 and got.keys() == head.keys() and all(torch.equal(got[k], head[k]) for k in got)
    clock.advance(10)
    assert source(4, 1) is None  # nothing newer than what it is on


class InProcess:
    """The coordinator's status and adapter route, in process."""

    def __init__(self, c):
        self.c = c

    def status(self):
        return self.c.status()

    def adapter(self, version, adapter_id, cache, max_bytes):
        return self.c.version_dir(version, adapter_id)


class _Down:
    def status(self):
        from hubgrpo.errors import CoordinatorError

        raise CoordinatorError("coordinator unreachable")


def test_an_unreachable_coordinator_leaves_the_round_where_it_is(tmp_path):
    from hubgrpo.worker.rebase import CoordinatorSource

    store, _, _ = _setup(tmp_path, **FFA)
    assert CoordinatorSource(_Down(), tmp_path / "cache", 1 << 30, poll_s=0)(1, 0) is None


def test_a_rebased_rounds_lease_may_be_at_most_max_lease_age_old(tmp_path):
    """The staleness of a rebased round is the worker's word; its lease's age is the coordinator's own bound."""
    store, c, _ = _setup(tmp_path, **{**FFA, "merge.max_lease_age": 2})
    old = c.lease("old")
    for i in range(3):
        lease = c.lease(f"w{i}")
        c.submit(lease, _push(store, c, lease, tmp_path, onto=None, seed=10 + i)[0])
    assert c.state.version == 3
    with pytest.raises(InvalidSubmission) as ei:
        c.submit(old, _push(store, c, old, tmp_path, onto=3, seed=2)[0])
    assert ei.value.code == "stale" and "at most 2 versions old (merge.max_lease_age)" in ei.value.message


def test_a_record_without_rebase_keeps_the_old_format():
    record = submission_record(make_lease())
    assert b"rebased_version" not in record.to_json()
    moved = record.model_copy(update={"rebased_version": 1})
    assert layout.Submission.from_json(moved.to_json()).rebased_version == 1


# --------------------------------------------------------------------------------------------- the engine


def test_the_engine_moves_a_round_exactly_and_keeps_its_optimizer(tiny_cache, tmp_path):
    """A 3-step ffa round offered v1 after step 1: B becomes B_v1 + (B − B_v0) at once (checked inside the next
    offer), the parameters stay the same objects (AdamW's state is keyed by them), no offer after the last step."""
    from hubgrpo.worker.engine import RoundEngine

    eng = RoundEngine(tiny_config(["merge.method=ffa", "merge.rebase=true"]), worker="w1")
    v0 = eng.init_adapter(tmp_path / "v0")
    w0 = load_file(v0 / layout.ADAPTER_WEIGHTS)
    shift = {k: (0.01 * torch.ones_like(v) if "lora_B" in k else torch.zeros_like(v)) for k, v in w0.items()}
    v1 = tmp_path / "v1"
    v1.mkdir()
    save_file({k: w0[k] + shift[k] for k in w0}, str(v1 / layout.ADAPTER_WEIGHTS))
    (v1 / layout.ADAPTER_CONFIG).write_bytes((v0 / layout.ADAPTER_CONFIG).read_bytes())
    calls, seen = [], {}

    def source(step, current):
        calls.append((step, current))
        state = {k: v.detach().clone() for k, v in eng._adapter_state().items()}
        seen[step] = (state, [id(p) for p in eng.trainer.model.parameters()])
        return (1, v1) if step == 1 else None

    sub = eng.run_round(v0, make_lease(steps=3), tmp_path / "out", rebase=source)
    assert calls == [(1, 0), (2, 1)] and sub.rebased_version == 1 and "rebase" in sub.timings
    before, after = seen[1][0], seen[2][0]  # step 2 trained in between: compare what the move did via step 1
    assert seen[1][1] == seen[2][1]
    record = _record(tmp_path / "out")
    assert record.rebased_version == 1 and record.trained_base == 1
    for k in w0:
        if "lora_A" in k:
            assert torch.equal(after[k], w0[k])
    # the move alone, on the state after step 1: B + shift (checked by replaying it on a fresh rebaser)
    eng._rebaser.start(eng, source, 0)
    from peft import set_peft_model_state_dict

    set_peft_model_state_dict(eng.trainer.model, before)
    eng._rebaser._base = {k: w0[k].clone() for k in w0}
    eng._rebaser._move(1, v1)
    moved = eng._adapter_state()
    assert all(torch.allclose(moved[k], before[k] + shift[k], atol=1e-7) for k in w0)
    eng._rebaser.source = None


def test_the_engine_does_not_move_onto_another_lora_a_or_when_the_source_fails(tiny_cache, tmp_path):
    from hubgrpo.worker.engine import RoundEngine

    eng = RoundEngine(tiny_config(["merge.method=ffa", "merge.rebase=true"]), worker="w1")
    v0 = eng.init_adapter(tmp_path / "v0")
    w0 = load_file(v0 / layout.ADAPTER_WEIGHTS)
    other = tmp_path / "other"
    other.mkdir()
    save_file({k: w0[k] + 1.0 if "lora_A" in k else w0[k] for k in w0}, str(other / layout.ADAPTER_WEIGHTS))
    (other / layout.ADAPTER_CONFIG).write_bytes((v0 / layout.ADAPTER_CONFIG).read_bytes())
    sub = eng.run_round(v0, make_lease(steps=2), tmp_path / "out", rebase=lambda step, cur: (3, other))
    assert sub.rebased_version is None
    sub = eng.run_round(v0, make_lease(steps=2), tmp_path / "out2", rebase=lambda step, cur: 1 / 0)
    assert sub.rebased_version is None and sub.steps == 2  # a failing source costs nothing but the move


def _record(folder: Path):
    return layout.Submission.from_json((folder / layout.SUBMISSION_FILE).read_bytes())


def test_a_one_step_round_moves_between_its_generation_and_its_backward(tiny_cache, tmp_path):
    """merge.rebase_after_generation: a 1-step round (which has no step boundary to move at) is offered a newer
    version once its completions are sampled; it moves, so its update and staleness count from that version and
    its one step is taken at the newer model. Without the setting no offer comes."""
    from hubgrpo.worker.engine import RoundEngine

    for after_generation in (True, False):
        eng = RoundEngine(tiny_config(["merge.method=ffa", "merge.rebase=true",
                                       f"merge.rebase_after_generation={str(after_generation).lower()}"]),
                          worker="w1")
        v0 = eng.init_adapter(tmp_path / f"v0-{after_generation}")
        w0 = load_file(v0 / layout.ADAPTER_WEIGHTS)
        v1 = tmp_path / f"v1-{after_generation}"
        v1.mkdir()
        shift = {k: (0.5 * torch.ones_like(v) if "lora_B" in k else torch.zeros_like(v)) for k, v in w0.items()}
        save_file({k: w0[k] + shift[k] for k in w0}, str(v1 / layout.ADAPTER_WEIGHTS))
        (v1 / layout.ADAPTER_CONFIG).write_bytes((v0 / layout.ADAPTER_CONFIG).read_bytes())
        calls = []

        def source(step, current, generated=False):
            calls.append((step, current, generated))
            return (1, v1) if generated else None

        out = tmp_path / f"out-{after_generation}"
        sub = eng.run_round(v0, make_lease(steps=1), out, rebase=source)
        if not after_generation:
            assert calls == [] and sub.rebased_version is None
            continue
        assert calls == [(0, 0, True)] and sub.rebased_version == 1 and _record(out).trained_base == 1
        trained = load_file(out / layout.ADAPTER_WEIGHTS)
        b_keys = [k for k in w0 if "lora_B" in k]
        assert all(torch.equal(trained[k], w0[k]) for k in w0 if "lora_A" in k)
        # B is v1's B plus one AdamW step (each entry moves by at most about the learning rate, 0.02 here), not
        # v0's: the move happened before the step, and the step itself is still in the round
        step = max(float((trained[k] - w0[k] - shift[k]).abs().max()) for k in b_keys)
        assert 0 < step < 0.05
