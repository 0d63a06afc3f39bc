"""Commit and read-back latency of an adapter-sized file on LocalStore and on HubStore (local Hub emulator).

Run from the repo root::

    python benchmarks/round/store_commit.py [--n 30] [--size-mb 10]
    python benchmarks/round/store_commit.py --quick   # the script checked: 3 commits of 0.1 MiB

Each iteration commits a fresh file of random bytes (so every commit changes something) from a local path, as a
worker does after ``save_pretrained``, then reads it back at the returned revision. Writes
``results/store_commit.{md,json}``. The Hub part is skipped with a message when the emulator or
``HubStore`` is not available.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # for tests.support.hub_emulator

from benchmarks.common import local_hub, options, results_dir, start, write  # noqa: E402

TOKEN = "hf_test_alice_token"  # the Hub emulator's user alice

local_hub()


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def measure(store, n: int, size: int, work: Path) -> dict:
    """n commits of a fresh ``size``-byte file, each followed by a read-back at the new revision (ms)."""
    commit_ms, read_ms = [], []
    src = work / "adapter_model.safetensors"
    for i in range(n):
        src.write_bytes(os.urandom(size))
        t0 = time.perf_counter()
        sha = store.commit({"adapter_model.safetensors": src}, message=f"bench {i}")
        t1 = time.perf_counter()
        data = store.read("adapter_model.safetensors", revision=sha)
        t2 = time.perf_counter()
        assert len(data) == size
        commit_ms.append((t1 - t0) * 1e3)
        read_ms.append((t2 - t1) * 1e3)
    return {"n": n, "size_mb": size / 2**20,
            "commit_p50_ms": percentile(commit_ms, 50), "commit_p95_ms": percentile(commit_ms, 95),
            "read_p50_ms": percentile(read_ms, 50), "read_p95_ms": percentile(read_ms, 95),
            "commit_mean_ms": sum(commit_ms) / n, "read_mean_ms": sum(read_ms) / n}


def bench_local(n: int, size: int, work: Path, **options) -> dict:
    from hubgrpo.store.local import LocalStore

    store = LocalStore(work / f"local-{len(options)}-{options.get('fsync', True)}", **options)
    store.create(exist_ok=False)
    return measure(store, n, size, work)


def bench_hub(n: int, size: int, work: Path) -> dict | str:
    """The HubStore numbers, or the reason they could not be measured."""
    os.environ["HF_HUB_CACHE"] = str(work / "hf-cache")
    try:
        from hubgrpo.store.hub import HubStore
        from tests.support.hub_emulator import HubEmulator
    except ImportError as e:
        return f"skipped: {e}"
    emu = HubEmulator(users={TOKEN: "alice"}).start()
    try:
        store = HubStore("alice/bench", token=TOKEN, endpoint=emu.url)
        store.create(exist_ok=True)
        return measure(store, n, size, work)
    finally:
        emu.stop()


def render(report: dict) -> str:
    """The Markdown table of a report."""
    lines = [f"# Store commit latency ({report['params']['size_mb']:g} MB file, n={report['params']['n']})", "",
             "| backend | commit p50 ms | commit p95 ms | read p50 ms | read p95 ms |",
             "|---|---:|---:|---:|---:|"]
    for name, r in report["results"].items():
        if isinstance(r, str):
            lines.append(f"| {name} | {r} | | | |")
        else:
            lines.append(f"| {name} | {r['commit_p50_ms']:.1f} | {r['commit_p95_ms']:.1f} | "
                         f"{r['read_p50_ms']:.1f} | {r['read_p95_ms']:.1f} |")
    lines += ["", "Commit: a fresh file of random bytes from a local path; read: `store.read` at the returned sha.",
              "The Hub numbers are the local emulator (no network latency, files inline as base64), so they",
              "measure the client and protocol overhead, not the real Hub.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=30, help="commits per backend")
    parser.add_argument("--size-mb", type=float, default=10.0, help="file size in MiB")
    options(parser, __file__)
    args = parser.parse_args(argv)
    if args.quick:
        args.n, args.size_mb = 3, 0.1
    meta = start(args.quick)
    size = int(args.size_mb * 2**20)
    runs: dict[str, Callable[[Path], dict | str]] = {
        "local (fsync, checkout)": lambda w: bench_local(args.n, size, w),
        "local (no fsync, no checkout)": lambda w: bench_local(args.n, size, w, fsync=False, checkout=False),
        "hub (emulator)": lambda w: bench_hub(args.n, size, w),
    }
    results = {}
    for name, run in runs.items():
        with tempfile.TemporaryDirectory(prefix="hubgrpo-bench-") as work:
            results[name] = run(Path(work))
        print(f"{name}: {results[name] if isinstance(results[name], str) else 'done'}", flush=True)
    report = {"params": {"n": args.n, "size_mb": args.size_mb}, "results": results}
    said = ", ".join(f"{name} {r['commit_p50_ms']:.0f} ms" for name, r in results.items() if not isinstance(r, str))
    write(results_dir(args, __file__), "store_commit", report, render(report), meta,
          f"commit p50 of a {args.size_mb:g} MiB file: {said}")
    print(render(report))
    return report


if __name__ == "__main__":
    main()
