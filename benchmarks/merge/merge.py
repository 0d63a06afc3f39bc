"""Merge benchmark: time and peak memory of every merge method, and the error of factor averaging vs drift.

    python benchmarks/merge/merge.py [--threads 2]
    python benchmarks/merge/merge.py --quick   # the script checked: 4 layers of 0.5B, N = 2 (seconds)

Cases: N = 2, 8, 32, 128 rank-16 adapters on all linear layers of Qwen2.5-0.5B (24 layers, hidden 896,
intermediate 4864, 14 heads / 2 KV heads of dim 64) and Qwen2.5-1.5B (28 layers, hidden 1536, intermediate 8960,
12 / 2 heads of dim 128); methods svd (auto → randomized beyond tiny N), svd-exact (QR + SVD; 0.5B, N ≤ 32),
stack (uncapped, N ≤ 32: its output has rank 16·N, i.e. N adapters' worth of memory), ffa (submissions share
the global's A) and naive. Each case runs in its own subprocess with ``torch.set_num_threads(threads)`` and
``OMP_WAIT_POLICY=PASSIVE`` (on a shared machine, spinning OpenMP threads make 2-thread runs 5–10× slower).
Inputs are a pool of 8 distinct adapters referenced N times (the merge does the same work as for N distinct
ones; only input memory is saved).

Memory: peak RSS of the merge itself, measured as VmHWM − VmRSS around the call after resetting the high-water
mark (``echo 5 > /proc/self/clear_refs``); if that reset is refused, the ru_maxrss delta (a lower bound). Torch
CPU allocations go through malloc, so RSS sees them (tracemalloc would not). Time: the first call (cold) and
the best of ``--repeat`` more, wall-clock and process CPU seconds (all threads); on a shared machine the CPU
seconds of a 1-thread run are the load-independent figure. The 1-minute load average is recorded per case.

Drift: 8 workers = a common rank-16 adapter (the global) with relative Gaussian noise ``drift`` on every factor;
the relative error ‖ΔW_method − ΔW_exact‖/‖ΔW_exact‖ against the exact mean (``stack``) is computed exactly from
Gram matrices in float64, for ``naive`` and for ``svd`` (whose error is its truncation residual), relative to
‖ΔW_exact‖ and to the round's update ‖ΔW_exact − ΔW_global‖.

Writes results/merge.{md,json} (merge-t<threads>.* for other thread counts).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.common import options, results_dir, start, write  # noqa: E402
RANK, POOL = 16, 8
METHODS = ("svd", "svd-exact", "stack", "ffa", "naive")


def _shapes(name: str) -> dict:
    """All LoRA modules of the model, or of its first 4 layers for "0.5B-4L"."""
    from tests.support.adapter_factory import QWEN_05B, QWEN_15B

    if name == "0.5B-4L":
        return {k: v for k, v in QWEN_05B.items() if int(k.split(".layers.")[1].split(".")[0]) < 4}
    return {"0.5B": QWEN_05B, "1.5B": QWEN_15B}[name]


def _inputs(shape: str, n: int, method: str):
    """(global, items): the global and N submissions drawn from a pool of POOL drifted adapters."""
    from hubgrpo.merge import Adapter
    from tests.support.adapter_factory import drifted, make_adapter

    global_ = make_adapter(_shapes(shape), r=RANK, seed=0, alpha=32)
    pool = [drifted(global_, 0.5, seed=i + 1) for i in range(min(n, POOL))]
    if method == "ffa":  # FFA-LoRA: A frozen and shared with the global
        pool = [Adapter({k: (global_.weights[k] if "lora_A" in k else v) for k, v in p.weights.items()},
                        global_.config) for p in pool]
    subs = [Adapter(dict(pool[i % len(pool)].weights), global_.config) for i in range(n)]
    return global_, [(s, global_, 1.0) for s in subs]


def _options(method: str):
    from hubgrpo.merge import MergeOptions

    if method == "svd-exact":
        return MergeOptions(method="svd", svd_algorithm="exact")
    return MergeOptions(method=method)


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _reset_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def run_case(case: dict) -> dict:
    """One (shape, N, method) case, inside its own process."""
    import torch

    torch.set_num_threads(case["threads"])
    from hubgrpo.merge import merge

    global_, items = _inputs(case["shape"], case["n"], case["method"])
    opts = _options(case["method"])
    input_mb = sum(v.numel() * v.element_size() for v in global_.weights.values()) * min(case["n"], POOL) / 2**20
    rss0, maxrss0, exact_peak = _status_kb("VmRSS"), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, _reset_peak()
    load0 = os.getloadavg()[0]
    start, cpu = time.perf_counter(), time.process_time()
    result = merge(global_, items, opts)
    cold, cold_cpu = time.perf_counter() - start, time.process_time() - cpu
    peak_kb = (_status_kb("VmHWM") - rss0) if exact_peak else \
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - maxrss0
    times, cpus = [cold], [cold_cpu]
    for _ in range(case["repeat"]):
        start, cpu = time.perf_counter(), time.process_time()
        merge(global_, items, opts)
        times.append(time.perf_counter() - start)
        cpus.append(time.process_time() - cpu)
    rep = result.report
    return {**case, "cold_s": cold, "best_s": min(times), "best_cpu_s": min(cpus), "peak_mb": peak_kb / 1024,
            "input_pool_mb": input_mb,
            "memory_method": "VmHWM-VmRSS" if exact_peak else "ru_maxrss delta", "algorithm": rep["algorithm"],
            "residual": rep["residual"], "residual_estimated": rep["residual_estimated"],
            "out_rank": int(result.adapter.config["r"]), "load": [load0, os.getloadavg()[0]]}


def _lowrank_terms(adapter, sign: float) -> dict:
    from hubgrpo.merge import parse_modules

    specs, _ = parse_modules(adapter)
    return {p: (sign * s.scaling, adapter.weights[s.key_b].float(), adapter.weights[s.key_a].float())
            for p, s in specs.items()}


def distance(got, want=None) -> float:
    """Exact ‖ΔW_got − ΔW_want‖ (or ‖ΔW_got‖) over all modules, from float64 Gram matrices (no dense ΔW)."""
    import torch

    from hubgrpo.merge.lowrank import gram_sq_norm

    a = _lowrank_terms(got, 1.0)
    b = _lowrank_terms(want, -1.0) if want is not None else {}
    total = sum(gram_sq_norm([a[p]] + ([b[p]] if b else []), dtype=torch.float64) for p in a)
    return max(total, 0.0) ** 0.5


def run_drift(case: dict) -> dict:
    """naive and svd error vs the exact mean for 8 workers at relative factor drift ``case['drift']``."""
    import torch

    torch.set_num_threads(case["threads"])
    from hubgrpo.merge import MergeOptions, merge
    from tests.support.adapter_factory import drifted, make_adapter

    global_ = make_adapter(_shapes(case["shape"]), r=RANK, seed=0, alpha=32)
    items = [(drifted(global_, case["drift"], seed=i + 1), global_, 1.0) for i in range(8)]
    exact = merge(global_, items, MergeOptions(method="stack")).adapter
    size, step = distance(exact), distance(exact, global_)
    out = {**case}
    for name, opts in (("naive", MergeOptions(method="naive")), ("svd", MergeOptions()),
                       ("svd_r32", MergeOptions(rank=32))):
        err = distance(merge(global_, items, opts).adapter, exact)
        out[name], out[name + "_vs_update"] = err / size, err / step
    return out


def _spawn(kind: str, case: dict) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(case["threads"]), "MKL_NUM_THREADS": str(case["threads"]),
           "OMP_WAIT_POLICY": "PASSIVE"}
    proc = subprocess.run([sys.executable, __file__, f"--{kind}", json.dumps(case)], capture_output=True, text=True,
                          env=env, cwd=ROOT)
    if proc.returncode != 0:
        return {**case, "error": proc.stderr.strip().splitlines()[-1] if proc.stderr else f"rc {proc.returncode}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def plan(quick: bool, threads: int, repeat: int) -> tuple[list[dict], list[dict]]:
    if quick:  # a check of the script: the first 4 layers of 0.5B, two submissions, the shipped methods once
        return ([{"shape": "0.5B-4L", "n": 2, "method": m, "threads": threads, "repeat": 1} for m in ("svd", "ffa")],
                [{"shape": "0.5B-4L", "drift": 0.1, "threads": threads}])
    cases = []
    for shape in ("0.5B", "1.5B"):
        for n in (2, 8, 32, 128):
            for method in METHODS:
                if method == "svd-exact" and (shape != "0.5B" or n > 32):
                    continue
                if method == "stack" and n > 32:
                    continue
                cases.append({"shape": shape, "n": n, "method": method, "threads": threads, "repeat": repeat})
    drifts = [{"shape": "0.5B", "drift": d, "threads": threads} for d in (0.01, 0.1, 0.5, 1.0)]
    return cases, drifts


def _cell(d: dict, key: str) -> str:
    nan = float("nan")
    return f"{d.get(key, nan):.3g} ({d.get(key + '_vs_update', nan):.3g})"


def to_markdown(cases: list[dict], drifts: list[dict], setup: dict) -> str:
    lines = [f"# Merge benchmark ({setup['mode']}, torch threads {setup['threads']}, {setup['cpus']} CPUs)", "",
             f"{setup['note']}", "",
             "| model | N | method | algorithm | out r | cold s | best s | best CPU s | s / N | peak MB (merge) "
             "| residual | load |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in cases:
        if "error" in c:
            lines.append(f"| {c['shape']} | {c['n']} | {c['method']} | error: {c['error'][:60]} | | | | | | | | |")
            continue
        est = " (est.)" if c["residual_estimated"] else ""
        lines.append(f"| {c['shape']} | {c['n']} | {c['method']} | {c['algorithm']} | {c['out_rank']} | "
                     f"{c['cold_s']:.2f} | {c['best_s']:.2f} | {c['best_cpu_s']:.2f} | {c['best_s'] / c['n']:.3f} | "
                     f"{c['peak_mb']:.0f} | "
                     f"{c['residual']:.3g}{est} | {c['load'][0]:.1f} |")
    shape = drifts[0]["shape"] if drifts else "-"
    lines += ["", f"Error vs the exact weighted mean (8 workers, {shape} shapes), relative to ‖ΔW_exact‖ and, in "
              "brackets, to the round's update ‖ΔW_exact − ΔW_global‖ (stack is exact: 0):", "",
              "| drift | naive (r 16) | svd (r 16) | svd (r 32) |", "|---|---|---|---|"]
    for d in drifts:
        lines.append(f"| {d['drift']} | {_cell(d, 'naive')} | {_cell(d, 'svd')} | {_cell(d, 'svd_r32')} |")
    return "\n".join(lines) + "\n"


def headline(cases: list[dict]) -> str:
    """The largest N measured: seconds of each method's merge on the largest model."""
    ok = [c for c in cases if "error" not in c]
    if not ok:
        return "every case failed"
    shape = ok[-1]["shape"]
    n = max(c["n"] for c in ok if c["shape"] == shape)
    return f"{n} submissions of {shape} shapes merge in " + ", ".join(
        f"{c['best_s']:.2f} s ({c['method']})" for c in ok if (c["shape"], c["n"]) == (shape, n))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2, help="timed repeats after the cold call")
    ap.add_argument("--case", help=argparse.SUPPRESS)
    ap.add_argument("--drift", help=argparse.SUPPRESS)
    options(ap, __file__)
    args = ap.parse_args()
    if args.case or args.drift:
        print(json.dumps(run_case(json.loads(args.case)) if args.case else run_drift(json.loads(args.drift))))
        return
    meta = start(args.quick)
    cases, drifts = plan(args.quick, args.threads, 1 if args.quick else args.repeat)
    t0 = time.perf_counter()
    done = []
    for case in cases:
        done.append(_spawn("case", case))
        c = done[-1]
        print(f"{c['shape']} N={c['n']:3d} {c['method']:9s} " + (f"error {c['error']}" if "error" in c else
              f"{c['best_s']:.2f}s (cpu {c['best_cpu_s']:.2f}s) peak {c['peak_mb']:.0f}MB residual "
              f"{c['residual']:.3g} load {c['load'][0]:.1f}"), flush=True)
    drift_done = [_spawn("drift", d) for d in drifts]
    setup = {"mode": "quick" if args.quick else "full", "threads": args.threads, "cpus": os.cpu_count(),
             "seconds": round(time.perf_counter() - t0, 1),
             "note": "Times are wall-clock on a possibly shared machine (see the load column); peak MB is the "
                     "merge's own RSS growth (inputs excluded, VmHWM − VmRSS)."}
    text = to_markdown(done, drift_done, setup)
    stem = "merge" if args.threads == 2 else f"merge-t{args.threads}"  # the 2-thread run is the reference
    write(results_dir(args, __file__), stem, {"setup": setup, "cases": done, "drift": drift_done}, text, meta,
          headline(done))
    print(text)


if __name__ == "__main__":
    main()
