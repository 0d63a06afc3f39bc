"""Latency of the coordinator API: ``lease`` and ``submit`` through each client transport.

Serves ``tests.support.fake_coordinator.FakeCoordinator`` with ``hubgrpo.space.api.serve`` on 127.0.0.1, once with the
endpoints off Gradio's queue (``queue=False``, the default) and once on it, and times N sequential calls per
(transport, endpoint) plus 40 concurrent leases from 8 threads. Writes ``results/api_latency.{md,json}``.

    python benchmarks/load/api_latency.py [--n 100]
    python benchmarks/load/api_latency.py --quick   # the script checked: 4 calls each, one round
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.common import options, results_dir, start, write  # noqa: E402
from hubgrpo.space.api import serve  # noqa: E402
from hubgrpo.worker.client import CoordinatorClient  # noqa: E402
from tests.support.fake_coordinator import FakeCoordinator  # noqa: E402

TRANSPORTS = {"gradio_client": ("gradio", "run"), "http /run": ("http", "run"), "http /call+SSE": ("http", "call")}
SHA = "cd" * 20


def percentiles(samples: list[float]) -> dict:
    """p50 / p95 / min in milliseconds."""
    s = sorted(samples)
    return {"p50_ms": round(statistics.median(s) * 1e3, 2), "p95_ms": round(s[int(0.95 * (len(s) - 1))] * 1e3, 2),
            "min_ms": round(s[0] * 1e3, 2)}


def timed(fn, n: int) -> list[float]:
    """Wall time of ``n`` sequential calls of ``fn(i)``."""
    out = []
    for i in range(n):
        t = time.perf_counter()
        fn(i)
        out.append(time.perf_counter() - t)
    return out


def bench_round(c: CoordinatorClient, n: int, acc: dict) -> None:
    """One round on one client: n leases, n submits, 40 concurrent leases; samples appended to ``acc``."""
    acc["lease"] += timed(lambda i: c.lease(f"w{i}"), n)
    leases = [c.lease(f"s{i}") for i in range(n)]
    acc["submit"] += timed(lambda i: c.submit(leases[i], SHA), n)
    t = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda i: c.lease(f"c{i}"), range(40)))
    acc["concurrent"].append(time.perf_counter() - t)
    assert len({g.lease_id for g in got}) == 40


def run(n: int, rounds: int) -> dict:
    """Both apps up at once; configurations interleaved round by round so load drift hits all alike."""
    import gradio
    import gradio_client

    apps, clients, acc = [], {}, {}
    try:
        for queue in (False, True):
            app, url = serve(FakeCoordinator(quorum=10**9, race_window=0.0), queue=queue, tick_interval=1.0)
            apps.append(app)
            for name, (transport, route) in TRANSPORTS.items():
                c = CoordinatorClient(url, transport=transport, http_route=route, timeout=30)
                for i in range(5):  # warm up: connect, fetch config, open the stream
                    c.lease(f"warm{i}")
                clients[(queue, name)] = c
                acc[(queue, name)] = {"lease": [], "submit": [], "concurrent": []}
        for _ in range(rounds):
            for key, c in clients.items():
                bench_round(c, max(1, n // rounds), acc[key])
    finally:
        for c in clients.values():
            c.close()
        for app in apps:
            app.close(verbose=False)
    rows = [{"queue": q, "transport": name, "lease": percentiles(a["lease"]), "submit": percentiles(a["submit"]),
             "concurrent_40x8_s": round(statistics.median(a["concurrent"]), 3)} for (q, name), a in acc.items()]
    return {"n": n, "rounds": rounds, "gradio": gradio.__version__, "gradio_client": gradio_client.__version__,
            "rows": rows}


def to_markdown(rec: dict) -> str:
    """A table per configuration."""
    lines = [f"# Coordinator API latency (n={rec['n']} sequential calls each in {rec['rounds']} interleaved rounds, "
             "127.0.0.1)", "",
             f"gradio {rec['gradio']}, gradio_client {rec['gradio_client']} (a shared machine: absolute figures are "
             "noisy, compare rows).", "",
             "| endpoints | transport | lease p50 | lease p95 | submit p50 | submit p95 | 40 leases / 8 threads (median) |",
             "|---|---|---|---|---|---|---|"]
    for r in rec["rows"]:
        q = "queue=True" if r["queue"] else "queue=False"
        lines.append(f"| {q} | {r['transport']} | {r['lease']['p50_ms']} ms | {r['lease']['p95_ms']} ms | "
                     f"{r['submit']['p50_ms']} ms | {r['submit']['p95_ms']} ms | {r['concurrent_40x8_s']} s |")
    lines += ["", "`http /run` is one POST to `/gradio_api/run/<name>`; `http /call+SSE` is the queued POST then "
              "the SSE GET; gradio_client always goes through the queue (`/queue/join` + `/queue/data`) and polls "
              "every 0.05 s. With queue=True, `/run` still bypasses the queue locally, but on a Space "
              "(`api_open` off) it answers 404 and the client falls back to `/call`.", ""]
    return "\n".join(lines)


def headline(rec: dict) -> str:
    best = min((r for r in rec["rows"] if not r["queue"]), key=lambda r: r["lease"]["p50_ms"])
    return (f"lease p50 {best['lease']['p50_ms']} ms, submit p50 {best['submit']['p50_ms']} ms over "
            f"{best['transport']} (queue off); the slowest transport "
            + max(rec["rows"], key=lambda r: r["lease"]["p50_ms"])["transport"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100, help="sequential calls per endpoint and transport")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds the n calls are split into")
    options(parser, __file__)
    args = parser.parse_args()
    if args.quick:
        args.n, args.rounds = 4, 1
    meta = start(args.quick)
    rec = run(args.n, args.rounds)
    write(results_dir(args, __file__), "api_latency", rec, to_markdown(rec), meta, headline(rec))
    print(to_markdown(rec))


if __name__ == "__main__":
    main()
