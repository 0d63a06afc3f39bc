"""Merge latency after the last submission of a quorum: the full merge at the quorum vs FFA folded in as rounds
arrive (``hubgrpo.merge.fold``, what a served coordinator does between merges with ``merge.method: ffa``).

    .venv/bin/python benchmarks/merge_latency.py [--quorum 32] [--threads 2] [--repeat 3]
    .venv/bin/python benchmarks/merge_latency.py --quorum 2,8,32 --name merge_latency-sweep   # does it grow with N?

Inputs: the global and ``quorum`` rank-16 submissions on every linear layer of Qwen2.5-0.5B (as benchmarks/merge.py:
a pool of 8 distinct drifted adapters referenced ``quorum`` times; FFA ones share the global's A). Rows:

- ``svd`` / ``ffa`` full: ``merge(global, items)`` when the quorum completes — all of it is latency;
- ``ffa folded``: ``quorum − 1`` submissions folded in beforehand (their cost is paid while the last round is
  still training), then the last one folded and the merge finished — that is the latency; the total CPU is
  every fold plus the finish.

Wall-clock and process CPU seconds (all threads), best of ``--repeat``; the 1-minute load average is recorded.
Not included: reading the submissions (the coordinator has them from admission) and the commit to the store.
Writes benchmarks/results/<name>.{md,json} (default merge_latency), one table per quorum.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def timed(fn):
    start, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - start, time.process_time() - cpu


def full(method: str, n: int) -> dict:
    from merge import _inputs

    from hubgrpo.merge import MergeOptions, merge

    global_, items = _inputs("0.5B", n, method)
    items = [(s, b, 1.0 / n) for s, b, _ in items]
    _, wall, cpu = timed(lambda: merge(global_, items, MergeOptions(method=method)))
    return {"latency_s": wall, "latency_cpu_s": cpu, "total_cpu_s": cpu}


def folded(n: int) -> dict:
    from merge import _inputs

    from hubgrpo.merge import MergeOptions
    from hubgrpo.merge.fold import FfaFold

    global_, items = _inputs("0.5B", n, "ffa")
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


def to_markdown(meta: dict, rows: list[dict]) -> str:
    quorums = ", ".join(str(q) for q in meta["quorums"])
    lines = [f"# Merge latency after the last of {quorums} submissions (Qwen2.5-0.5B shapes, rank 16) — "
             f"{meta['date']}", "",
             f"torch threads {meta['threads']}, {meta['cpus']} CPUs, load average {meta['load'][0]:.1f} → "
             f"{meta['load'][1]:.1f}; best of {meta['repeat']}. Latency: from the last submission in hand to the new "
             "adapter in memory (no store reads or commits).", "",
             "| quorum | merge | latency s | latency CPU s | total merge CPU s | fold per submission s |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        each = f"{r['fold_each_s']:.4f}" if "fold_each_s" in r else "–"
        lines.append(f"| {r['quorum']} | {r['method']} | {r['latency_s']:.3f} | {r['latency_cpu_s']:.3f} | "
                     f"{r['total_cpu_s']:.3f} | {each} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quorum", default="32", help="submissions per merge; a comma-separated list for a sweep")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--results", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--name", default="merge_latency")
    args = ap.parse_args()
    try:
        quorums = [int(q) for q in args.quorum.split(",")]
    except ValueError:
        sys.exit(f"--quorum {args.quorum!r}: give whole numbers, e.g. 32 or 2,8,32")
    if any(q < 2 for q in quorums):
        sys.exit("--quorum: each quorum must be at least 2 (a fold needs a submission before the last)")
    import torch

    torch.set_num_threads(args.threads)
    load0 = os.getloadavg()[0]
    rows = [r for q in quorums for r in measure(q, args.repeat)]
    meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "quorums": quorums, "threads": args.threads,
            "repeat": args.repeat, "load": [load0, os.getloadavg()[0]], "cpus": os.cpu_count()}
    out = Path(args.results)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.name}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    text = to_markdown(meta, rows)
    (out / f"{args.name}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
