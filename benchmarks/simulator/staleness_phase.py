"""Why the simulator sees more fresh (τ = 0) rounds than the real 2-worker run: the timing alone.

    python benchmarks/simulator/staleness_phase.py [--seeds 8] [--versions 60]
    python benchmarks/simulator/staleness_phase.py --quick   # the script checked: 2 settings, 2 seeds, 8 versions

Two simulated workers with 1-step rounds of 8 virtual seconds (the demo's), the real coordinator and merge, and
a model-free round engine (the tests' ``FakeEngine``: staleness depends only on when rounds arrive), for equal
speeds and for the few-per-cent speed difference the real runs' two workers show (speedup-real-decay-s*: median
rounds 7.89 / 8.13 s, 8.00 / 8.58 s, …), at the default jitter 0.1 and at 0.05, started together or a second or
so apart (``--starts``, as the real machines' phases were). A round is fresh when the other worker delivered
nothing while it trained; that happens when the two workers' phases cross. The fresh share per setting (mean ± sd
over seeds); writes results/<name>.{md,json}.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.common import options, results_dir, start, write  # noqa: E402


SETTINGS = [  # speeds, jitter, starts
    ("1", 0.1, "0"), ("1", 0.05, "0"), ("1,0.97", 0.1, "0"), ("1,0.97", 0.05, "0"), ("1,0.94", 0.1, "0"),
    ("1,0.94", 0.05, "0"), ("1.01,0.99", 0.1, "0,1"), ("1.003,0.997", 0.1, "0,1.3"), ("1.003,0.997", 0.06, "0,1.5"),
]


def fresh_share(speeds: str, seed: int, jitter: float, versions: int, starts: str = "0") -> float:
    from hubgrpo.sim.loop import SimOptions, Simulation
    from tests.support.coord_helpers import make_config
    from tests.support.sim_support import FakeSimEngine as FakeEngine

    cfg = make_config(**{"merge.quorum": 1, "merge.max_staleness": 8, "rounds.steps": 1,
                         "rounds.versions": versions})
    with tempfile.TemporaryDirectory() as d:
        sim = Simulation(cfg, SimOptions(workers=2, step_s=8.0, jitter=jitter, until_version=versions,
                                         speeds=speeds, seed=seed, starts=starts), Path(d), engine=FakeEngine(cfg))
        sim.run()
        hist = sim.result()["staleness_histogram"]
    return hist.get("0", 0) / sum(hist.values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--versions", type=int, default=60)
    ap.add_argument("--name", default="staleness_phase")
    options(ap, __file__)
    args = ap.parse_args()
    settings = SETTINGS
    if args.quick:
        args.seeds, args.versions, settings = 2, 8, SETTINGS[:2]
    meta = start(args.quick)
    rows = []
    for speeds, jitter, starts in settings:
        shares = [fresh_share(speeds, s, jitter, args.versions, starts) for s in range(args.seeds)]
        rows.append({"speeds": speeds, "jitter": jitter, "starts": starts, "fresh_shares": shares,
                     "mean": statistics.mean(shares), "sd": statistics.stdev(shares)})
        print(f"speeds {speeds:12} jitter {jitter:<5} starts {starts:6} fresh share {rows[-1]['mean']:.3f} ± "
              f"{rows[-1]['sd']:.3f}", flush=True)
    lines = ["# Fresh (τ = 0) rounds of two simulated workers, by timing alone", "",
             f"Model-free rounds of 8 virtual s, {args.versions} versions, {args.seeds} seeds per setting.", "",
             "| speeds | jitter | starts (s) | fresh share (mean ± sd) |", "|---|---|---|---|"]
    lines += [f"| {r['speeds']} | {r['jitter']} | {r['starts']} | {r['mean']:.3f} ± {r['sd']:.3f} |" for r in rows]
    equal = rows[0]
    write(results_dir(args, __file__), args.name, {"seeds": args.seeds, "versions": args.versions, "rows": rows},
          "\n".join(lines), meta, f"two equal simulated workers, jitter {equal['jitter']}: "
          f"{100 * equal['mean']:.1f} ± {100 * equal['sd']:.1f} % fresh rounds ({args.seeds} seeds)")


if __name__ == "__main__":
    main()
