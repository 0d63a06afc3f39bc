"""``hubgrpo simulate``: the discrete-event loop, with a fake round engine (fast, exact). The installed command is in
tests/system/test_simulate_command.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from hubgrpo.errors import ConfigError
from hubgrpo.sim.fleet import parse_speeds, parse_starts
from hubgrpo.sim.loop import SimOptions, Simulation
from tests.support.coord_helpers import make_config
from tests.support.sim_support import FakeSimEngine, deterministic_part


def simulate(tmp: Path, name: str, settings: dict | None = None, **opts):
    cfg = make_config(**{"merge.quorum": 1, "merge.max_staleness": 8, "rounds.steps": 2, **(settings or {})})
    defaults = dict(workers=4, step_s=1.0, jitter=0.0, until_version=8)
    sim = Simulation(cfg, SimOptions(**{**defaults, **opts}), tmp / name, engine=FakeSimEngine(cfg))
    sim.run()
    return sim


def test_equal_workers_finish_together_and_each_merge_is_one_version_staler(tmp_path):
    sim = simulate(tmp_path, "a")
    r = sim.result()
    assert r["versions"][-1]["version"] == 8
    # 4 equal workers, no jitter: every 2 s four rounds from the same version arrive; quorum 1 merges each one
    assert r["staleness_histogram"] == {"0": 2, "1": 2, "2": 2, "3": 2}
    assert [v["virtual_time_s"] for v in r["versions"][1:]] == [2.0] * 4 + [4.0] * 4
    assert r["rounds_by_status"]["merged"] == 8


def test_the_same_seed_gives_the_same_simulation_and_another_differs(tmp_path):
    a = simulate(tmp_path, "a", jitter=0.3, dropout=0.2, speeds="spread:2", seed=3).result()
    b = simulate(tmp_path, "b", jitter=0.3, dropout=0.2, speeds="spread:2", seed=3).result()
    c = simulate(tmp_path, "c", jitter=0.3, dropout=0.2, speeds="spread:2", seed=4).result()
    assert deterministic_part(a) == deterministic_part(b)
    assert [v["virtual_time_s"] for v in a["versions"]] != [v["virtual_time_s"] for v in c["versions"]]


def test_faster_workers_deliver_more_rounds(tmp_path):
    sim = simulate(tmp_path, "a", workers=2, speeds="1,3", until_version=12)
    merged = [r.worker for r in sim.rounds if r.status == "merged"]
    assert merged.count("sim01") >= 2.5 * merged.count("sim00") > 0


def test_dropped_rounds_expire_and_their_prompts_are_handed_out_again(tmp_path):
    short = {"coordinator.lease_timeout_s": 20, "coordinator.heartbeat_interval_s": 5}
    sim = simulate(tmp_path, "a", short, dropout=0.3, until_version=120, seed=1)
    dropped = [r for r in sim.rounds if r.status == "dropped"]
    assert dropped, "dropout 0.3 dropped no round"
    assert sim.coord.state.version == 120 and sim.now > 60
    old = {r.lease_id for r in dropped if r.t_lease < sim.now - 40}  # long enough ago to have expired
    assert old and not old & set(sim.coord.active)  # expired (or given back when their worker leased again)
    first = dropped[0]
    later = {i for r in sim.rounds if r.t_lease > first.t_lease for i in sim.prompts[r.lease_id]}
    assert set(sim.prompts[first.lease_id]) <= later, "a dropped round's prompts were never leased again"


def test_speed_specs():
    assert parse_speeds("1", 3) == [1.0, 1.0, 1.0]
    spread = parse_speeds("spread:2", 5)
    assert spread[-1] == pytest.approx(2 * spread[0]) and sum(spread) / 5 == pytest.approx(1.0)
    assert parse_speeds("spread:2", 1) == [1.0]
    assert parse_speeds("1,0.5", 3) == [1.0, 0.5, 1.0]
    for bad in ("fast", "spread:0.5", "0", "-1", "1,,x"):
        with pytest.raises(ConfigError):
            parse_speeds(bad, 2)


def test_start_specs():
    assert parse_starts("0", 3, seed=0) == [0.0, 0.0, 0.0]
    assert parse_starts("0,1.5", 3, seed=0) == [0.0, 1.5, 0.0]
    spread = parse_starts("spread:10", 4, seed=1)
    assert spread == parse_starts("spread:10", 4, seed=1) != parse_starts("spread:10", 4, seed=2)
    assert all(0 <= t <= 10 for t in spread) and len(set(spread)) == 4
    for bad in ("soon", "-1", "nan", "inf", "1e400", "spread:-1", "spread:nan", "0,,x"):
        with pytest.raises(ConfigError, match="--starts"):
            parse_starts(bad, 2, seed=0)


def test_machines_that_start_apart_stay_out_of_phase(tmp_path):
    # no jitter, equal speeds, 2-step rounds of 2 s: started together, every other round is fresh (τ = 0) and the
    # two arrive in the same instant; half a second apart, they alternate and only the very first round is fresh
    together = simulate(tmp_path, "together", workers=2).result()
    apart = simulate(tmp_path, "apart", workers=2, starts="0,0.5").result()
    assert together["staleness_histogram"] == {"0": 4, "1": 4}
    assert apart["staleness_histogram"] == {"0": 1, "1": 7}
    assert [v["virtual_time_s"] for v in apart["versions"][1:5]] == [2.0, 2.5, 4.0, 4.5]
    assert apart["starts"] == [0.0, 0.5]


def test_balanced_rounds_give_faster_workers_more_steps(tmp_path):
    sim = simulate(tmp_path, "a", {"rounds.balance": "true", "rounds.steps": 4}, workers=3,
                   speeds="1,1,3", until_version=30)
    steps = {name: [len(sim.prompts[r.lease_id]) for r in sim.rounds if r.worker == name][-3:]
             for name in ("sim00", "sim02")}
    per_step = len(sim.prompts[sim.rounds[0].lease_id]) // 4
    assert all(s == 4 * per_step for s in steps["sim00"])  # the median speed keeps rounds.steps
    assert all(s >= 3 * 4 * per_step * 0.75 for s in steps["sim02"]), steps  # 3× as fast: ~3× the steps


def test_staggered_first_rounds_spread_equal_machines_over_one_round(tmp_path):
    """rounds.stagger: 4 equal machines that start together get 4, 2, 1, 3 steps in their first rounds
    (1, 1/2, 1/4, 3/4 of rounds.steps), full rounds after; their deliveries stay one step apart, where without
    it all four arrive at once."""
    settings = {"rounds.steps": 4}
    together = simulate(tmp_path, "together", settings, until_version=8)
    sim = simulate(tmp_path, "stagger", {**settings, "rounds.stagger": "true"}, until_version=8)
    per_step = len(together.prompts[together.rounds[0].lease_id]) // 4
    steps = lambda r: len(sim.prompts[r.lease_id]) // per_step  # noqa: E731
    assert sorted(steps(r) for r in sim.rounds if r.t_lease == 0) == [1, 2, 3, 4]
    later = [steps(r) for r in sim.rounds if r.t_lease > 0]
    assert later and all(s == 4 for s in later)
    times = lambda s: [v["virtual_time_s"] for v in s.result()["versions"][1:]]  # noqa: E731
    assert times(together)[:4] == [4.0] * 4
    assert times(sim)[:8] == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]


def test_rebased_rounds_move_onto_the_versions_published_before_each_step(tmp_path):
    """merge.rebase (ffa), max_staleness 0: a slow machine's rounds are one or more versions old by their lease
    and would all be refused; each moves, after a step, onto the newest version published by the end of that step
    (never one published later), and is merged with the staleness counted from there."""
    settings = {"merge.method": "ffa", "merge.max_staleness": 0, "rounds.steps": 4}
    plain = simulate(tmp_path, "plain", settings, workers=2, speeds="1,4", until_version=12)
    sim = simulate(tmp_path, "rebase", {**settings, "merge.rebase": "true"}, workers=2, speeds="1,4",
                   until_version=12)
    slow = lambda s: [r for r in s.rounds if r.worker == "sim00" and r.t_deliver is not None]  # noqa: E731
    assert slow(plain) and all(r.status == "refused" for r in slow(plain))
    assert any(r.status == "merged" and r.rebased_version is not None for r in slow(sim))
    rounds = {r.lease_id: r for r in sim.rounds}
    for lease_id, step, version in sim.engine.offers:
        r = rounds[lease_id]
        speed = sim.fleet[int(r.worker[3:])].speed
        t_step = r.t_lease + step * 1.0 / speed  # step_s 1, no latency, no jitter
        published = [v["version"] for v in sim.versions if v["virtual_time_s"] <= t_step + 1e-9]
        assert version == max(published), (lease_id, step, version, published)
    assert sim.engine.offers
    merged = [m for v in sim.coord.state.versions for m in v.merged]
    assert all(m.staleness == 0 for m in merged)
    from hubgrpo.sim.report import summary_lines

    moved = sum(r.rebased_version is not None for r in sim.rounds if r.t_deliver is not None)
    assert any(f"; {moved} of " in line and "moved onto a newer version" in line for line in summary_lines(sim.result()))
    assert not any("moved onto" in line for line in summary_lines(plain.result()))


def test_a_round_moves_after_its_generation_onto_the_versions_published_by_then(tmp_path):
    """merge.rebase_after_generation with 1-step rounds (no step boundary): a round is offered the versions
    published a generate_share into its step (0.5 here), and moves onto the newest of them, never a later one;
    without the setting a 1-step round never moves."""
    settings = {"merge.method": "ffa", "merge.rebase": "true", "rounds.steps": 1}
    plain = simulate(tmp_path, "plain", settings, workers=2, speeds="1,3", until_version=12)
    assert not plain.engine.offers and all(r.rebased_version is None for r in plain.rounds)
    sim = simulate(tmp_path, "gen", {**settings, "merge.rebase_after_generation": "true"}, workers=2,
                   speeds="1,3", until_version=12, generate_share=0.5)
    rounds = {r.lease_id: r for r in sim.rounds}
    assert any(r.rebased_version is not None and r.status == "merged" for r in sim.rounds)
    for lease_id, step, version in sim.engine.offers:
        r = rounds[lease_id]
        t_gen = r.t_lease + step * 1.0 / sim.fleet[int(r.worker[3:])].speed  # step 0.5: half-way, step_s 1
        published = [v["version"] for v in sim.versions if v["virtual_time_s"] <= t_gen + 1e-9]
        assert version == max(published), (lease_id, step, version, published)
    merged = [m for v in sim.coord.state.versions for m in v.merged]
    assert sum(m.staleness for m in merged) < sum(m.staleness for v in plain.coord.state.versions for m in v.merged)


def test_a_split_fleet_batch_makes_each_round_cheaper(tmp_path):
    """rounds.fleet_batch split (make_config: 4 completions per step, groups of 2): the first worker leases alone
    and gets the whole batch; the three after it one group each, and a round of half the batch costs
    FIXED_SHARE + (1 − FIXED_SHARE) / 2 of a whole one in virtual time."""
    from hubgrpo.sim.fleet import FIXED_SHARE

    sim = simulate(tmp_path, "split", {"rounds.fleet_batch": "split"}, until_version=8)
    r = sim.result()
    half = 2 * (FIXED_SHARE["builtin:tiny"] + (1 - FIXED_SHARE["builtin:tiny"]) / 2)  # 2 steps at step_s 1
    times = [v["virtual_time_s"] for v in r["versions"][1:]]
    assert times[:4] == pytest.approx([half] * 3 + [2.0])
    total = [v["samples"] for v in r["versions"][:5]]  # the run's samples so far: completions × 2 steps each
    assert [b - a for a, b in zip(total, total[1:])] == [4, 4, 4, 8]
    assert r["config"]["fleet_batch"] == "split"


def test_a_machine_that_drops_out_stays_away_rejoin_s(tmp_path):
    sim = simulate(tmp_path, "a", {"coordinator.lease_timeout_s": 20}, workers=2, dropout=0.3, rejoin_s=50.0,
                   until_version=30, seed=1)
    dropped = [r for r in sim.rounds if r.status == "dropped"]
    assert dropped, "dropout 0.3 dropped no round"
    for r in dropped:  # the machine's next process (name + "r<k>") leases 50 s after the drop, at the earliest
        machine = r.worker.split("r")[0]
        nxt = [o.t_lease for o in sim.rounds if o.t_lease > r.t_lease and o.worker.split("r")[0] == machine]
        assert not nxt or nxt[0] >= r.t_lease + 50.0
    assert sim.result()["rejoin_s"] == 50.0


def test_a_run_until_a_reward_scores_only_every_kth_version_and_stops_at_a_scored_one(tmp_path):
    """--eval-every holds with --until-reward too: a sampled held-out score costs as much as a training step, and
    scoring every version made a long reference run twice as slow as its training."""
    r = simulate(tmp_path, "k", until_version=None, until_reward=1e-9, eval_every=3, max_virtual_s=60).result()
    scored = [v["version"] for v in r["versions"] if v["eval_reward"] is not None]
    assert scored and all(v % 3 == 0 for v in scored)
    assert r["versions"][-1]["version"] == scored[-1] and scored[-1] >= 3


def test_a_simulation_keeps_the_run_learning_rate_schedule(tmp_path):
    """The simulation's own stop (until_version 12) neither stretches nor drops the run's schedule: wsd over the
    config's 8 versions (decay over the last 3), so the fleet's step is 1.5 to version 5, falls, and stays at its
    floor (1 + 0.5 × lr_final) past version 8, as in `hubgrpo run`."""
    settings = {"rounds.lr_schedule": "wsd", "rounds.versions": 8, "merge.fleet_outer_lr": 1.5}
    sim = simulate(tmp_path, "wsd", settings, until_version=12)
    assert sim.coord.cfg.rounds.schedule_span() == 8 and sim.coord.cfg.rounds.versions == 12
    steps = [v.outer_lr for v in sim.coord.state.versions[1:13]]
    assert steps[:5] == [1.5] * 5
    assert 1.5 > steps[5] > steps[6] > 1.05
    assert steps[7:] == pytest.approx([1.05] * 5)
