"""Merge latency after the last submission of a quorum: the full merge at the quorum vs FFA folded in as rounds
arrive (``hubgrpo.merge.fold``, what a served coordinator does between merges with ``merge.method: ffa``).

    python benchmarks/merge/merge_latency.py [--quorum 32] [--threads 2] [--repeat 3]
    python benchmarks/merge/merge_latency.py --quorum 2,8,32 --name merge_latency-sweep   # does it grow with N?
    python benchmarks/merge/merge_latency.py --quick   # the script checked: quorum 2, 4 layers, once

Inputs: the global and ``quorum`` rank-16 submissions on every linear layer of Qwen2.5-0.5B (as merge.py:
a pool of 8 distinct drifted adapters referenced ``quorum`` times; FFA ones share the global's A). Rows:

- ``svd`` / ``ffa`` full: ``merge(global, items)`` when the quorum completes — all of it is latency;
- ``ffa folded``: ``quorum − 1`` submissions folded in beforehand (their cost is paid while the last round is
  still training), then the last one folded and the merge finished — that is the latency; the total CPU is
  every fold plus the finish.

Wall-clock and process CPU seconds (all threads), best of ``--repeat``; the 1-minute load average is recorded.
Not included: reading the submissions (the coordinator has them from admission) and the commit to the store.
Writes results/<name>.{md,json} (default merge_latency), one table per quorum.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.common import options, results_dir, start, write  # noqa: E402
from benchmarks.merge.merge import _inputs  # noqa: E402

SHAPE = "0.5B"  # --quick: "0.5B-4L"


def timed(fn):
    start, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - start, time.process_time() - cpu


def full(method: str, n: int) -> dict:
    from hubgrpo.merge import MergeOptions, merge

    global_, items = _inputs(SHAPE, n, method)
    items = [(s, b, 1.0 / n) for s, b, _ in items]
    _, wall, cpu = timed(lambda: merge(global_, items, MergeOptions(method=method)))
    return {"latency_s": wall, "latency_cpu_s": cpu, "total_cpu_s": cpu}


def folded(n: int) -> dict:
    from hubgrpo.merge import MergeOptions
    from hubgrpo.merge.fold import FfaFold

    global_, items = _inputs(SHAPE, n, "ffa")
    fold = FfaFold(global_, 0)
    _, pre_wall, pre_cpu = timed(lambda: [fold.add(f"s{i}", s, b, 1.0) for i, (s, b, _) in enumerate(items[:-1])])
    last, o = items[-1], MergeOptions(method="ffa")

    def finish():
        fold.add(f"s{n - 1}", last[0], last[1], 1.0)
        return fold.result({f"s{i}": 1.0 for i in range(n)}, o)

    result, wall, cpu = timed(finish)
    assert result is not None and result.report["folded"]
    return {"latency_s": wall, "latency_cpu_s": cpu, "total_cpu_s": pre_cpu + cpu, "fold_each_s": pre_wall / (n - 1)}


def best(fn, repeat: int) -> dict:
    runs = [fn() for _ in range(repeat)]
    return {k: min(r[k] for r in runs) for k in runs[0]}


def measure(quorum: int, repeat: int) -> list[dict]:
    return [{"quorum": quorum, "method": "svd (full merge at the quorum)", **best(lambda: full("svd", quorum), repeat)},
            {"quorum": quorum, "method": "ffa (full merge at the quorum)", **best(lambda: full("ffa", quorum), repeat)},
            {"quorum": quorum, "method": "ffa folded as rounds arrive", **best(lambda: folded(quorum), repeat)}]


def to_markdown(setup: dict, rows: list[dict]) -> str:
    quorums = ", ".join(str(q) for q in setup["quorums"])
    lines = [f"# Merge latency after the last of {quorums} submissions ({setup.get('shape', SHAPE)} shapes, "
             "rank 16)", "",
             f"torch threads {setup['threads']}, {setup['cpus']} CPUs; best of {setup['repeat']}. Latency: from the "
             "last submission in hand to the new adapter in memory (no store reads or commits).", "",
             "| quorum | merge | latency s | latency CPU s | total merge CPU s | fold per submission s |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        each = f"{r['fold_each_s']:.4f}" if "fold_each_s" in r else "–"
        lines.append(f"| {r['quorum']} | {r['method']} | {r['latency_s']:.3f} | {r['latency_cpu_s']:.3f} | "
                     f"{r['total_cpu_s']:.3f} | {each} |")
    return "\n".join(lines) + "\n"


def headline(rows: list[dict]) -> str:
    q = max(r["quorum"] for r in rows)
    mine = {r["method"].split(" (")[0].replace(" as rounds arrive", ""): r for r in rows if r["quorum"] == q}
    return (f"quorum {q}: ffa folded {mine['ffa folded']['latency_s']:.3f} s after the last submission, "
            f"full ffa {mine['ffa']['latency_s']:.3f} s, full svd {mine['svd']['latency_s']:.3f} s")


def main() -> None:
    global SHAPE
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quorum", default="32", help="submissions per merge; a comma-separated list for a sweep")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--name", default="merge_latency")
    options(ap, __file__)
    args = ap.parse_args()
    if args.quick:
        args.quorum, args.repeat, SHAPE = "2", 1, "0.5B-4L"
    try:
        quorums = [int(q) for q in args.quorum.split(",")]
    except ValueError:
        sys.exit(f"--quorum {args.quorum!r}: give whole numbers, e.g. 32 or 2,8,32")
    if any(q < 2 for q in quorums):
        sys.exit("--quorum: each quorum must be at least 2 (a fold needs a submission before the last)")
    meta = start(args.quick)
    import torch

    torch.set_num_threads(args.threads)
    rows = [r for q in quorums for r in measure(q, args.repeat)]
    setup = {"quorums": quorums, "shape": SHAPE, "threads": args.threads, "repeat": args.repeat,
             "cpus": os.cpu_count()}
    text = to_markdown(setup, rows)
    write(results_dir(args, __file__), args.name, {"setup": setup, "rows": rows}, text, meta, headline(rows))
    print(text)


if __name__ == "__main__":
    main()
