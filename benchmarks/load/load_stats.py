"""Measurements and process placement of ``coordinator_load.py`` that are not the fleet: process CPU from /proc,
latency percentiles, garbage-collector pauses, where the slow calls fell relative to the merges, CPU pinning, the
server's CPU per call in isolation (``calibrate``)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")


def gc_pauses(path: Path, min_s: float = 0.01) -> None:
    """Append every garbage-collector pass of this process longer than ``min_s`` to ``path`` (time, generation,
    seconds): full passes over a large heap hold the GIL and stall every request."""
    import gc

    started = [0.0]

    def note(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        elif time.perf_counter() - started[0] > min_s:
            with path.open("a") as f:
                f.write(f"{time.time():.3f} {info['generation']} {time.perf_counter() - started[0]:.4f}\n")

    gc.callbacks.append(note)


def pauses_in(path: Path, window: tuple[float, float]) -> dict:
    """Count and longest of the server's GC pauses inside the measurement window."""
    rows = [line.split() for line in path.read_text().splitlines()] if path.is_file() else []
    inside = [float(s) for t, _, s in rows if window[0] <= float(t) <= window[1]]
    return {"count": len(inside), "max_ms": round(max(inside) * 1e3, 1) if inside else 0.0}


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (and its finished children), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(fields[i]) for i in (11, 12, 13, 14)) / TICKS


def pct(samples: list[float]) -> dict:
    s = sorted(samples)
    if not s:
        return {"n": 0}
    return {"n": len(s), "p50_ms": round(s[len(s) // 2] * 1e3, 1),
            "p99_ms": round(s[int(0.99 * (len(s) - 1))] * 1e3, 1), "max_ms": round(s[-1] * 1e3, 1)}


def slow_near_merges(g: dict, history: list, near_s: float = 2.0) -> dict:
    """How many of the calls slower than the fleet's SLOW_S started within ``near_s`` before a merge commit (the
    merge computes, then commits: its CPU and lock time lie just before the commit's timestamp)."""
    merges = sorted(c.created_at for c in history if c.message.startswith("hubgrpo: version "))
    near = sum(1 for _, t, _ in g.get("slow", []) if any(0.0 <= m - t <= near_s for m in merges))
    return {"slow": len(g.get("slow", [])), "within_2s_before_a_merge": near,
            "merge_commits_in_window": sum(g["window"][0] <= m <= g["window"][1] for m in merges)}


def pinned(cpus: str | None) -> list[str]:
    """The ``taskset`` prefix that pins a command to ``cpus`` (none when not asked)."""
    return ["taskset", "-c", cpus] if cpus else []


def cpu_set(cpus: str) -> set[int]:
    """``taskset``-style CPU list ("1", "0,2", "2-3") as a set."""
    out: set[int] = set()
    for part in cpus.split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def busiest(n: int = 6) -> list[str]:
    """The processes using the most CPU right now (what else ran), as ps prints them."""
    r = subprocess.run(["ps", "-eo", "pcpu,etime,args", "--sort=-pcpu"], capture_output=True, text=True)
    return [" ".join(line.split()[:2] + [" ".join(line.split()[2:])[:90]]) for line in r.stdout.splitlines()[1:n + 1]]


def calibrate(url: str, pid: int, n: int = 200) -> dict:
    """Server CPU per call in isolation: sequential calls from one client, CPU read from /proc around them, on the
    plain routes and (for comparison) Gradio's ``/gradio_api/run``."""
    import httpx

    from hubgrpo.layout import PROTOCOL_VERSION

    out = {}
    with httpx.Client(base_url=url, timeout=60) as http:
        def run(route, name, data):
            if route == "plain":
                return http.post(f"/hubgrpo/api/{name}", json={"data": data}).json()
            return http.post(f"/gradio_api/run/{name}", json={"data": data}).json()["data"][0]

        def measure(key: str, calls: int, fn) -> None:
            c0, t0 = cpu_seconds(pid), time.perf_counter()
            for i in range(calls):
                fn(i)
            out[key] = {"cpu_ms": round((cpu_seconds(pid) - c0) / calls * 1e3, 2),
                        "wall_ms": round((time.perf_counter() - t0) / calls * 1e3, 2)}

        for route in ("plain", "gradio"):
            lease = run(route, "lease", [f"calib-{route}", None, None, PROTOCOL_VERSION])["result"]
            measure(f"status ({route})", n, lambda i: run(route, "status", [None]))
            measure(f"heartbeat ({route})", n, lambda i: run(route, "heartbeat", [lease, None]))
            run(route, "release", [lease, None])
            measure(f"lease+release ({route})", n // 2, lambda i: run(route, "release", [run(
                route, "lease", [f"calib{route}{i}", None, None, PROTOCOL_VERSION])["result"], None]))
    return out
