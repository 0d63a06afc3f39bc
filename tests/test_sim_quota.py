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
from tests.coord_helpers import make_config
from tests.test_simulate import FakeEngine

ROOT = Path(__file__).resolve().parents[1]
HOUR = 3600.0


def run_sim(tmp: Path, name: str, settings: dict, **opts) -> Simulation:
    cfg = make_config(**{"merge.quorum": 1, "merge.max_staleness": 8, "params.steps_per_round": 1, **settings})
    defaults = dict(workers=2, step_s=4.0, jitter=0.0, eval_every=1000)
    sim = Simulation(cfg, SimOptions(**{**defaults, **opts}), tmp / name, engine=FakeEngine(cfg))
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
