"""``hubgrpo simulate`` under the Hub's commit quota: commits on the virtual clock, the quota enforced by the
simulated run repo itself (the Hub's 429), the coordinator's budget set to it, and the report saying which quota
was in force (with a fake round engine: fast, exact; and the installed command)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hubgrpo.sim.loop import SimOptions, Simulation
from tests.support.coord_helpers import make_config
from tests.support.sim_support import FakeSimEngine

ROOT = Path(__file__).resolve().parents[2]
HOUR = 3600.0


def run_sim(tmp: Path, name: str, settings: dict, **opts) -> Simulation:
    cfg = make_config(**{"merge.quorum": 1, "merge.max_staleness": 8, "rounds.steps": 1, **settings})
    defaults = dict(workers=2, step_s=4.0, jitter=0.0, eval_every=1000)
    sim = Simulation(cfg, SimOptions(**{**defaults, **opts}), tmp / name, engine=FakeSimEngine(cfg))
    sim.run()
    return sim


@pytest.mark.timeout(120)
def test_a_kept_budget_waits_on_the_virtual_clock_and_a_restart_counts_the_same_commits(tmp_path):
    """keep_budget, 20 commits an hour: the run waits out its budget on the virtual clock (never a jump of more
    than an hour), and every commit the coordinator can see is stamped on that clock: a coordinator restarted on
    the repo at the virtual now counts the commits of the last virtual hour that the running one counts."""
    from hubgrpo.coordinator.core import Coordinator

    sim = run_sim(tmp_path, "kept", {"coordinator.commit_budget_per_hour": 20}, keep_budget=True, until_version=30)
    times = [v["virtual_time_s"] for v in sim.versions]
    assert times[-1] > HOUR, "the budget never made the run wait"
    assert max(b - a for a, b in zip(times, times[1:])) <= HOUR
    stamps = [c.created_at for c in sim.store.history()]
    assert all(0.0 <= t <= sim.now for t in stamps), (min(stamps), max(stamps), sim.now)
    restarted = Coordinator(sim.store, b"restart", clock=lambda: sim.now, workdir=tmp_path / "restarted")
    live = sorted(t for t in sim.coord.commit_times if t > sim.now - HOUR)
    assert sorted(restarted.commit_times) == live
    assert len(live) <= 20


def test_the_coordinator_budget_is_the_quota_unless_the_config_sets_one(tmp_path):
    from hubgrpo.sim.loop import sim_config

    cfg = make_config()
    assert sim_config(cfg, SimOptions(workers=1, commit_quota=20)).coordinator.commit_budget_per_hour == 20
    assert sim_config(cfg, SimOptions(workers=1)).coordinator.commit_budget_per_hour == 10**9  # lifted: as before
    own = make_config(**{"coordinator.commit_budget_per_hour": 10})
    assert sim_config(own, SimOptions(workers=1, commit_quota=20)).coordinator.commit_budget_per_hour == 10
    assert sim_config(cfg, SimOptions(workers=1, commit_quota=20, keep_budget=True)).coordinator \
        .commit_budget_per_hour == cfg.coordinator.commit_budget_per_hour


@pytest.mark.timeout(180)
def test_the_store_refuses_commits_past_the_quota_like_the_hub_and_the_run_waits_them_out(tmp_path):
    """A coordinator whose own budget (60, kept) is above the quota (20): the simulated run repo answers the
    Hub's 429 past 20 commits in a rolling virtual hour; the run waits and carries on, and no rolling hour holds
    more than 20 commits."""
    sim = run_sim(tmp_path, "over", {"coordinator.commit_budget_per_hour": 60}, keep_budget=True, commit_quota=20,
                  until_version=25)
    q = sim.result()["quota"]
    assert sim.coord.state.version == 25 and sim.now > HOUR
    assert q["quota_per_hour"] == 20 and q["in_force"] and q["commit_budget_per_hour"] == 60
    assert q["refused_429"] > 0 and sum(q["waits"].values()) == q["refused_429"]
    assert 0 < q["peak_commits_per_hour"] <= 20


@pytest.mark.timeout(180)
def test_with_rounds_in_a_inbox_the_quota_costs_the_fleet_no_time(tmp_path):
    """Rounds off the commit path (``hub.submissions``) and versions off it (checkpoints): 4 machines making
    ~a version a second keep their free-commit pace under a quota of 128 an hour, within it."""
    inbox = {"hub.submissions": "./inbox", "merge.staleness_per_worker": 2}
    free = run_sim(tmp_path, "free", inbox, workers=4, step_s=1.0, jitter=0.1, until_version=300)
    held = run_sim(tmp_path, "held", inbox, workers=4, step_s=1.0, jitter=0.1, until_version=300, commit_quota=128)
    t = lambda s: [v["virtual_time_s"] for v in s.versions]  # noqa: E731
    assert t(held) == t(free)
    q = held.result()["quota"]
    assert held.result()["rounds_via"] == "inbox" and q["refused_429"] == 0
    assert 2 <= q["peak_commits_per_hour"] <= 128 and q["commit_budget_per_hour"] == 128
    assert free.result()["quota"]["peak_commits_per_hour"] > 300  # free: a commit per version
    assert not (tmp_path / "inbox").exists() and (tmp_path / "held" / "inbox").is_dir()


def simulate_cmd(tmp: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("hubgrpo")
    return subprocess.run([str(exe), "simulate", str(ROOT / "configs" / "tiny.yaml"), "--workers", "2",
                           "--until-version", "2", "--eval-samples", "2", "--no-progress", "--set",
                           "rounds.steps=1", *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.timeout(300)
def test_simulate_runs_under_the_hubs_quota_by_default_and_says_so(tmp_path):
    """The installed command: by default the Hub's 128 commits an hour, the coordinator's budget with it, both in
    simulation.json and in the summary; ``--commit-quota off`` lifts it (and says that)."""
    for name, extra, quota, budget in (("default", [], 128, 128), ("off", ["--commit-quota", "off"], None, 10**9)):
        out = tmp_path / name
        r = simulate_cmd(tmp_path, "--output", str(out), *extra)
        assert r.returncode == 0, r.stderr[-2000:]
        q = json.loads((out / "simulation.json").read_text())["quota"]
        assert (q["quota_per_hour"], q["in_force"], q["commit_budget_per_hour"]) == (quota, quota is not None, budget)
        assert q["commits"] >= 3 and q["peak_commits_per_hour"] == q["commits"]  # init + versions, within an hour
        line = next(x for x in r.stdout.splitlines() if x.startswith("Hub commit quota"))
        assert (f"{quota} commits per rolling virtual hour" if quota else "off") in line
        assert f"peak {q['peak_commits_per_hour']} commits in a rolling virtual hour" in line


def test_a_quota_on_the_command_line_is_a_count_or_off():
    from hubgrpo.sim.store import parse_quota

    assert parse_quota("64") == 64 and parse_quota("off") is None


@pytest.mark.parametrize("value", ["0", "-5", "many", "1e9", "12.5"])
def test_simulate_refuses_a_quota_that_is_not_a_count_naming_it(tmp_path, value):
    r = simulate_cmd(tmp_path, "--commit-quota", value, "--output", str(tmp_path / "x"), timeout=120)
    assert r.returncode == 2 and f"--commit-quota {value!r}" in r.stderr and "off" in r.stderr, r.stderr[-1500:]
    assert not (tmp_path / "x").exists()


@pytest.mark.timeout(240)
def test_a_coordinator_whose_budget_is_the_quota_never_meets_the_429(tmp_path):
    """Rounds in the run repo (a commit each), the demo's recipe, budget = quota = 128: the coordinator's own
    pacing keeps every commit inside the quota, so the simulated Hub refuses none."""
    settings = {"merge.method": "ffa", "merge.rebase": "true", "merge.staleness_per_worker": 2}
    sim = run_sim(tmp_path, "paced", settings, until_version=300, commit_quota=128)
    q = sim.result()["quota"]
    assert sim.now > HOUR and q["peak_commits_per_hour"] <= 128  # the quota bound: the run waited
    assert q["refused_429"] == 0, q
