"""The Space's reward plot: each version's training reward, a smoothed line over it, and held-out scores."""

from __future__ import annotations

import random
import statistics

from hubgrpo.space import view


def test_short_runs_are_drawn_as_they_are_and_long_ones_smoothed():
    assert view.smoothed([0.1, 0.9, 0.4]) == [0.1, 0.9, 0.4]
    rng = random.Random(0)
    trend = [min(1.0, v / 200) for v in range(300)]
    noisy = [t + rng.gauss(0, 0.3) for t in trend]
    line = view.smoothed(noisy)
    assert line[0] == noisy[0]  # debiased: the first point is not pulled towards 0
    err_raw = statistics.fmean((a - t) ** 2 for a, t in zip(noisy, trend))
    err_line = statistics.fmean((a - t) ** 2 for a, t in zip(line[30:], trend[30:]))
    assert err_line < err_raw / 4  # the line is much closer to the trend than the points
    assert abs(line[-1] - 1.0) < 0.15


def test_reward_curve_has_the_three_series_per_version():
    status = {"versions": [{"version": v, "reward": 0.1 * v, "eval_reward": 0.5 if v == 2 else None}
                           for v in range(4)]}
    curve = view.reward_curve(status)
    series = {name: list(curve[curve["series"] == name]["version"]) for name in set(curve["series"])}
    assert series == {view.TRAINING: [0, 1, 2, 3], view.SMOOTHED: [0, 1, 2, 3], view.HELD_OUT: [2]}


def test_a_finished_run_shows_no_pending_rounds_or_live_leases():
    class Store:
        location = "runs/x"

    status = {"version": 5, "finished": True, "pending": [{"submission_id": "s"}], "leases": [{"lease_id": "l"}]}
    cards = view.summary_html(status, Store())
    assert ">pending</div><div class=\"hg-v\">-<" in cards and ">live leases</div><div class=\"hg-v\">-<" in cards
    running = view.summary_html({**status, "finished": False}, Store())
    assert ">pending</div><div class=\"hg-v\">1<" in running
