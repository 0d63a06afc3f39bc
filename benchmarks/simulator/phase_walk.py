"""How the two machines of a real ``hubgrpo run --workers 2`` keep out of phase: the measured phase walk.

    python benchmarks/simulator/phase_walk.py benchmarks/speedup/results/speedup-real-decay-s*.json [--name phase-walk]

With 1-step rounds and two machines, a round is fresh (τ = 0) or two versions stale (τ = 2) only when the two
machines' deliveries cross in time; otherwise it is one version stale. The simulator draws each round's duration
independently (± jitter), so the offset between the machines is a free random walk and keeps crossing; the real
runs never crossed after their first rounds. This script measures, from the real runs' delivered rounds alone:

- the phase: where the other machine's delivery falls inside each round of the first machine (0 = just after its
  own delivery, 1 = just before its next); its per-round step (sd), its closest approach to 0 or 1, crossings;
  and the rounds that were not one version stale (τ ≠ 1) after the first, from the runs' own staleness;
- the chance that a free random walk with that seed's own step, from that seed's first phase, crosses within as many
  rounds (Monte Carlo), and that none of the seeds does;
- the mean change of the phase per round by phase (drift: a pull away from 0 and 1 is what keeps them apart);
- each machine's round (delivery to delivery) by where the other's delivery fell in it.

Writes results/NAME.{md,json}. Reads only the JSON files (the output of ``benchmarks/speedup/speedup_real.py``):
seconds, so ``--quick`` only writes to a temporary folder.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.common import options, results_dir, start, write  # noqa: E402


def admitted(run: dict) -> list[dict]:
    """The run's admitted rounds in delivery order."""
    return sorted((r for r in run["rounds"] if r.get("status") == "admitted"), key=lambda r: r["at"])


def deliveries(run: dict) -> tuple[list[float], list[float]]:
    """Delivery times (``at``: when each admitted round's submit returned) of the run's two machines, in name
    order. Staleness is decided at the lease and at the merge, up to ~0.3 s (lease + submit) from ``at``: phases
    within ~0.03 of 0 or 1 can give a τ = 0 / τ = 2 pair without crossing here."""
    rounds = admitted(run)
    names = sorted({r["worker"] for r in rounds})
    if len(names) != 2:
        raise SystemExit(f"a run with {len(names)} machines: the phase walk needs exactly two")
    return ([r["at"] for r in rounds if r["worker"] == names[0]], [r["at"] for r in rounds if r["worker"] == names[1]])


def phases(a: list[float], b: list[float]) -> list[float]:
    """For each round of machine a after its first (delivery k to k+1): where b's one delivery in it falls, 0..1.
    Rounds holding no or two deliveries of b (a crossing) give None."""
    out = []
    for k in range(1, len(a) - 1):
        inside = [t for t in b if a[k] < t <= a[k + 1]]
        out.append((inside[0] - a[k]) / (a[k + 1] - a[k]) if len(inside) == 1 else None)
    return out


def crossing_chance(start: float, step_sd: float, steps: int, rng: random.Random, trials: int = 20000) -> float:
    """Share of free random walks (Gaussian steps of ``step_sd``) from ``start`` that leave (0, 1) within ``steps``."""
    crossed = 0
    for _ in range(trials):
        p = start
        for _ in range(steps):
            p += rng.gauss(0.0, step_sd)
            if not 0.0 < p < 1.0:
                crossed += 1
                break
    return crossed / trials


def seed_row(seed, run: dict, rng: random.Random) -> dict:
    a, b = deliveries(run)
    ph = phases(a, b)
    known = [p for p in ph if p is not None]
    steps = [y - x for x, y in zip(ph, ph[1:]) if x is not None and y is not None]
    if len(steps) < 2:
        raise SystemExit(f"seed {seed}: too few rounds ({len(ph)}) for a phase walk")
    sd = statistics.pstdev(steps)
    rounds = admitted(run)
    off = [(i, r["staleness"], round(r["at"] - rounds[0]["at"], 1)) for i, r in enumerate(rounds)
           if i > 0 and r["staleness"] != 1]  # the first round is always fresh
    return {"seed": seed, "rounds": len(ph), "first": known[0], "step_sd": sd, "crossings": ph.count(None),
            "closest": min(min(known), 1.0 - max(known)), "phases": ph, "off_one": off,
            "free_walk_crossing": crossing_chance(known[0], sd, len(ph) - 1, rng)}


def drift_table(rows: list[dict]) -> list[tuple[float, int, float]]:
    """(phase bin, n, mean change of the phase over the next round) over every seed."""
    pairs = [(x, y - x) for r in rows for x, y in zip(r["phases"], r["phases"][1:]) if None not in (x, y)]
    out = []
    for lo in [i / 10 for i in range(10)]:
        sel = [d for p, d in pairs if lo <= p < lo + 0.1]
        if sel:
            out.append((lo, len(sel), statistics.mean(sel)))
    return out


def round_by_phase(runs: list[dict]) -> list[tuple[float, int, float]]:
    """(bin of where the other's delivery fell, n, mean round in s) over both machines of every run."""
    cells: dict[float, list[float]] = {}
    for run in runs:
        a, b = deliveries(run)
        for mine, other in ((a, b), (b, a)):
            for k in range(2, len(mine)):
                inside = [t for t in other if mine[k - 1] < t <= mine[k]]
                if len(inside) == 1:
                    x = (inside[0] - mine[k - 1]) / (mine[k] - mine[k - 1])
                    cells.setdefault(min(0.9, math.floor(x * 10) / 10), []).append(mine[k] - mine[k - 1])
    return [(lo, len(v), statistics.mean(v)) for lo, v in sorted(cells.items())]


def markdown(rows: list[dict], drift, by_phase, files: list[str]) -> str:
    none_cross = math.prod(1.0 - r["free_walk_crossing"] for r in rows)
    lines = ["# The real 2-machine runs' phase walk", "", f"From {', '.join(files)}.", "",
             "| seed | rounds | first phase | step sd | closest to 0 or 1 | crossings | free walk crosses | "
             "rounds with τ ≠ 1 after the first (index, τ, s) |", "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['seed']} | {r['rounds']} | {r['first']:.2f} | {r['step_sd']:.3f} | {r['closest']:.2f} | "
              f"{r['crossings']} | {100 * r['free_walk_crossing']:.0f} % | "
              f"{', '.join(f'{i}: τ {t} at {s} s' for i, t, s in r['off_one']) or '—'} |" for r in rows]
    lines += ["", f"A free random walk with each seed's own step would leave no seed uncrossed with a chance of "
              f"{100 * none_cross:.2f} %; the real delivery phases crossed {sum(r['crossings'] for r in rows)} "
              "times. (Phases come from when each submit returned; staleness is decided at the lease and the "
              "merge, so a phase within ~0.03 of 0 or 1 can give a τ = 0 / τ = 2 pair without a crossing here.)", "",
              "| phase | n | mean change over the next round |", "|---|---|---|"]
    lines += [f"| {lo:.1f}–{lo + 0.1:.1f} | {n} | {d:+.3f} |" for lo, n, d in drift]
    lines += ["", "| other's delivery at | rounds | mean round (s) |", "|---|---|---|"]
    lines += [f"| {lo:.1f}–{lo + 0.1:.1f} | {n} | {s:.2f} |" for lo, n, s in by_phase]
    lines += ["", "Phases per seed (— = a crossing):", ""]
    lines += [f"- seed {r['seed']}: " + " ".join("—" if p is None else f"{p:.2f}" for p in r["phases"])
              for r in rows]
    return "\n".join(lines) + "\n"


def headline(rows: list[dict]) -> str:
    none_cross = math.prod(1.0 - r["free_walk_crossing"] for r in rows)
    return (f"{len(rows)} real 2-machine runs: the delivery phases crossed {sum(r['crossings'] for r in rows)} "
            f"times; a free random walk leaves all uncrossed with a chance of {100 * none_cross:.2f} %")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("real", nargs="+", type=Path, help="speedup_real.py result JSONs")
    ap.add_argument("--name", default="phase-walk")
    options(ap, __file__)
    args = ap.parse_args()
    meta = start(args.quick)
    rng = random.Random(0)
    runs, rows = [], []
    for path in args.real:
        for raw in json.loads(path.read_text())["raw"]:
            runs.append(raw["run"])
            rows.append(seed_row(raw["run"].get("seed", raw["train"].get("seed")), raw["run"], rng))
    drift, by_phase = drift_table(rows), round_by_phase(runs)
    text = markdown(rows, drift, by_phase, [p.name for p in args.real])
    data = {"sources": [str(p) for p in args.real], "seeds": rows, "drift": drift, "round_by_phase": by_phase}
    write(results_dir(args, __file__), args.name, data, text, meta, headline(rows))
    print(text)


if __name__ == "__main__":
    main()
