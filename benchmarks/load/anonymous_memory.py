"""How much memory an anonymous visitor can make a served Space take (the target: at most +64 MiB, whatever it sends).

Serves ``hubgrpo space`` in a subprocess over a run repo on the Hub emulator (so auth is on: alice owns the run),
samples its RSS (``/proc/<pid>/status``: VmRSS every 10 ms, and VmHWM reset before each attack), and sends what an
anonymous visitor can send (``tests/support/visitor_attacks.py``):

- oversized bodies, one at a time: 600 MiB on the upload route (declared and chunked), 400 MiB on Gradio's
  ``/gradio_api/run/upload``, ``/call/upload``, ``/queue/join`` and ``/upload`` (files), and on other plain routes;
- six 200 MiB bodies at once;
- eight slow anonymous uploads (60,000 bytes at 100 bytes/s) while alice uploads a real round through the Space;
- a flood of 200 requests with distinct bogus tokens (counting the emulator's ``whoami`` calls);
- a header and a request line that never end (300 MiB each);
- 1,500 anonymous 60 KB calls on Gradio's queued routes whose answers are never read.

Reports each attack's answer, the body bytes sent before it came, and the server's peak RSS above its idle
baseline. Writes ``results/anonymous_memory.{md,json}``.

    python benchmarks/load/anonymous_memory.py [--scale 1.0] [--name anonymous_memory]
    python benchmarks/load/anonymous_memory.py --quick   # the script checked: 1 % of the sizes, 2-s slow bodies
"""

from __future__ import annotations

import argparse
import os
import secrets
import socket
import string
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("HF_HUB_DISABLE_XET", "1")

from benchmarks import common  # noqa: E402
from tests.support import visitor_attacks as va  # noqa: E402

SECRET = "anonymous-memory-secret"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mib(kib: int) -> float:
    return round(kib / 1024, 1)


def measured(pid: int, baseline: int, fn) -> tuple[object, dict]:
    """Run ``fn()`` while sampling the server; its result and the peak RSS (MiB above the idle baseline and
    above the RSS just before)."""
    before = va.rss_kib(pid)
    with va.PeakSampler(pid) as sampler:
        result = fn()
        time.sleep(0.3)  # what the server does right after answering counts too
    return result, {"peak_over_baseline_mib": mib(sampler.peak - baseline),
                    "peak_over_start_mib": mib(sampler.peak - before)}


def outcome_row(label: str, o: va.Outcome, mem: dict) -> dict:
    return {"attack": label, "status": o.status, "code": o.code, "body_bytes_taken": o.sent,
            "seconds": round(o.seconds, 2), "error": o.error, **mem}


def bogus_token() -> str:
    return "hf_" + "".join(secrets.choice(string.ascii_letters) for _ in range(34))


SLOW_PATHS = ("/hubgrpo/api/upload", "/gradio_api/run/upload", "/gradio_api/queue/join", "/hubgrpo/api/upload")


def slow_uploads_meanwhile(url: str, pid: int, baseline: int, alice_upload, n: int = 8, slow_s: float = 20.0):
    """``n`` slow anonymous uploads (100 bytes/s, 60,000 bytes declared: under what may come before
    authentication) on the plain and Gradio upload routes and, once they are all connected, one real upload by
    alice; how each ended and how long alice's took."""
    calls = [lambda p=SLOW_PATHS[i % len(SLOW_PATHS)]: va.send(url, p, size=60_000, rate_bps=100, timeout_s=slow_s,
                                                               prefix=va.UPLOAD_PREFIX, suffix=va.UPLOAD_SUFFIX)
             for i in range(n)]
    result: dict = {}

    def run():
        slow: list = []
        t = threading.Thread(target=lambda: slow.extend(va.concurrently(calls)), daemon=True)
        t.start()
        time.sleep(2.0)
        t0 = time.monotonic()
        try:
            answer = alice_upload()
            result["alice"] = {"status": answer.get("status"), "seconds": round(time.monotonic() - t0, 2)}
        except Exception as e:  # deliberate: the benchmark reports it
            result["alice"] = {"error": f"{type(e).__name__}: {str(e)[:200]}",
                               "seconds": round(time.monotonic() - t0, 2)}
        t.join()
        result["slow"] = [{"status": o.status, "code": o.code, "seconds": round(o.seconds, 1), "sent": o.sent}
                          for o in slow]
        return result

    return measured(pid, baseline, run)


def token_flood(url: str, pid: int, baseline: int, emu, n: int = 200) -> tuple[dict, dict]:
    """``n`` lease requests, each with its own bogus (well-formed) token, 20 at a time; the emulator's whoami
    calls counted."""
    from concurrent.futures import ThreadPoolExecutor

    counted = va.count_whoami(emu)
    body = {"size": 40, "prefix": b'{"data": ["w", null, null, 2]}', "suffix": b""}

    def one(_):
        o = va.send(url, "/hubgrpo/api/lease", headers={"Authorization": f"Bearer {bogus_token()}"}, timeout_s=60,
                    **{**body, "size": len(body["prefix"])})
        return o.status, o.code

    def run():
        with ThreadPoolExecutor(20) as pool:
            answers = list(pool.map(one, range(n)))
        return {"requests": n, "whoami_calls": counted[0],
                "answers": {f"{s} {c}": answers.count((s, c)) for s, c in sorted(set(answers), key=str)}}

    return measured(pid, baseline, run)


def run(scale: float, slow_s: float) -> dict:
    from hubgrpo.worker.client import CoordinatorClient
    from tests.support.space_support import ALICE, make_run, start_emulator, submission_folder

    tmp = Path(tempfile.mkdtemp(prefix="hubgrpo-anon-mem-"))
    emu = start_emulator()
    make_run(emu, tmp, "bench")
    env = dict(os.environ, HF_ENDPOINT=emu.url, HF_TOKEN=ALICE, HUBGRPO_SECRET=SECRET, OMP_NUM_THREADS="1",
               HUBGRPO_CACHE=str(tmp / "cache"), HF_HOME=str(tmp / "hf-home"))
    port = free_port()
    proc = va.start_space("alice/bench", port, env, tmp / "space.log", extra=("--quiet",))
    url = f"http://127.0.0.1:{port}"
    alice = CoordinatorClient(url, token=ALICE, transport="http", retries=1, backoff=0.05, timeout=120)
    try:
        alice.status()
        reader = None

        def alice_upload() -> dict:
            lease = alice.lease(f"alice-{time.monotonic_ns()}")
            return alice.upload(lease, submission_folder(lease, tmp / "rounds", seed=lease.seed % 997, reward=0.3,
                                                         reader=reader))

        from hubgrpo.store.hub import HubStore

        reader = HubStore("alice/bench", token=ALICE, endpoint=emu.url, cache_dir=tmp / "alice-cache")
        alice_upload()  # warm: the upload path, the admission checks, a batch commit
        time.sleep(3.0)
        baseline = va.rss_kib(proc.pid)
        rows = []
        for label, kw in va.big_bodies(scale):
            o, mem = measured(proc.pid, baseline, lambda: va.send(url, **kw))
            rows.append(outcome_row(label, o, mem))
            print(rows[-1], flush=True)
        group = va.concurrent_bodies(scale)
        outs, mem = measured(proc.pid, baseline, lambda: va.concurrently([lambda kw=kw: va.send(url, **kw)
                                                                          for _, kw in group]))
        concurrent = {"bodies": len(group), "size_mib": round(group[0][1]["size"] / va.MiB),
                      "statuses": [o.status for o in outs], "body_bytes_taken": [o.sent for o in outs], **mem}
        print(concurrent, flush=True)
        slow, slow_mem = slow_uploads_meanwhile(url, proc.pid, baseline, alice_upload, slow_s=slow_s)
        slow.update(slow_mem)
        print(slow, flush=True)
        flood, flood_mem = token_flood(url, proc.pid, baseline, emu)
        flood.update(flood_mem)
        print(flood, flush=True)
        heads = endless_heads(url, proc.pid, baseline, scale)
        queued = queued_flood(url, proc.pid, baseline, n=max(1, int(1500 * scale)))
        print(queued, flush=True)
        peak = max([r["peak_over_baseline_mib"] for r in rows + heads] + [
            concurrent["peak_over_baseline_mib"], slow["peak_over_baseline_mib"], flood["peak_over_baseline_mib"],
            queued["peak_over_baseline_mib"]])
        return {"scale": scale, "baseline_rss_mib": mib(baseline), "peak_over_baseline_mib": peak,
                "bodies": rows, "concurrent": concurrent, "slow_uploads": slow, "token_flood": flood,
                "heads": heads, "queued": queued}
    finally:
        alice.close()
        va.stop(proc)
        emu.stop()


def endless_heads(url: str, pid: int, baseline: int, scale: float) -> list[dict]:
    """A header and a request line (a query) that never end, 300 MiB × ``scale`` each: cut by the server's
    16 KiB bound on heads (uvicorn's h11, ``hubgrpo.space.guard.bound_heads``)."""
    port = int(url.rsplit(":", 1)[1])
    size, rows = int(300 * va.MiB * scale), []
    for label, start in (("endless header", b"GET /hubgrpo/api/status HTTP/1.1\r\nHost: x\r\nX-Long: "),
                         ("endless request line (query)", b"GET /?q=")):
        (sent, answer), mem = measured(pid, baseline, lambda start=start: va.send_head(port, start, size))
        status = answer.split(b" ", 2)[1].decode() if answer.count(b" ") >= 2 else "closed"
        rows.append({"attack": f"{label}, {size // va.MiB} MiB", "answer": status, "bytes_sent": sent, **mem})
        print(rows[-1], flush=True)
    return rows


def queued_flood(url: str, pid: int, baseline: int, n: int = 1500) -> dict:
    """``n`` anonymous 60 KB calls on Gradio's queued routes (``/gradio_api/call/status``, ``/queue/join``), 8 at
    a time, never read: Gradio keeps each call's event until its answer is read, unless refused before the body."""
    from concurrent.futures import ThreadPoolExecutor

    def run():
        with ThreadPoolExecutor(8) as pool:
            codes = list(pool.map(lambda i: va.queued_call(url, i), range(n)))
        return {"calls": n, "answers": {str(c): codes.count(c) for c in sorted(set(codes))}}

    out, mem = measured(pid, baseline, run)
    return {**out, **mem}


def markdown(r: dict) -> str:
    lines = ["# Anonymous visitor vs a served Space: peak memory", "",
             f"`hubgrpo space` in a subprocess, run repo on the Hub emulator (auth on); scale {r['scale']} of the "
             f"issue's sizes. Idle RSS {r['baseline_rss_mib']} MiB. **Peak RSS above idle: "
             f"{r['peak_over_baseline_mib']} MiB** (target: at most 64 MiB).", "",
             "| attack | answer | body bytes sent before the answer | s | peak above idle (MiB) |",
             "|---|---|---|---|---|"]
    for b in r["bodies"]:
        answer = f"{b['status']} {b['code'] or ''}".strip() if b["status"] else f"none ({b['error']})"
        lines.append(f"| {b['attack']} | {answer} | {b['body_bytes_taken']:,} | {b['seconds']} | "
                     f"{b['peak_over_baseline_mib']} |")
    c = r["concurrent"]
    lines.append(f"| {c['bodies']} × {c['size_mib']} MiB at once | {sorted(set(map(str, c['statuses'])))} | "
                 f"{sum(c['body_bytes_taken']):,} in all | - | {c['peak_over_baseline_mib']} |")
    s = r["slow_uploads"]
    slow = sorted(set(str(x["status"]) for x in s["slow"]))
    lines.append(f"| 8 slow anonymous uploads (60,000 B at 100 B/s) | {slow} after "
                 f"{max(x['seconds'] for x in s['slow'])} s; alice's real upload meanwhile: {s['alice']} | - | - | "
                 f"{s['peak_over_baseline_mib']} |")
    f = r["token_flood"]
    lines.append(f"| {f['requests']} bogus tokens | {f['answers']}; **{f['whoami_calls']} whoami calls** | - | - | "
                 f"{f['peak_over_baseline_mib']} |")
    for h in r.get("heads", []):
        lines.append(f"| {h['attack']} | {h['answer']} | {h['bytes_sent']:,} (head bytes) | - | "
                     f"{h['peak_over_baseline_mib']} |")
    q = r.get("queued")
    if q:
        lines.append(f"| {q['calls']} anonymous 60 KB calls on Gradio's queued routes, never read | {q['answers']} "
                     f"| - | - | {q['peak_over_baseline_mib']} |")
    lines += ["", "Peak: the highest RSS (VmRSS sampled every 10 ms, and VmHWM reset before each attack) minus the "
              "idle RSS after one real upload; the slow-body row includes alice's real upload made meanwhile "
              "(authenticated work). Memory a Python process took is rarely given back, so each row's figure also "
              "holds what the rows above it took."]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scale", type=float, default=1.0, help="fraction of the issue's body sizes")
    ap.add_argument("--slow-s", type=float, default=20.0, help="how long the slow bodies keep sending")
    ap.add_argument("--name", default="anonymous_memory", help="results file name (without suffix)")
    common.options(ap, __file__)
    args = ap.parse_args()
    if args.quick:
        args.scale, args.slow_s = 0.01, 2.0
    meta = common.start(args.quick)
    result = run(args.scale, args.slow_s)
    common.write(common.results_dir(args, __file__), args.name, result, markdown(result), meta,
          f"peak RSS above idle {result['peak_over_baseline_mib']} MiB under every anonymous attack "
          f"(scale {result['scale']}; target ≤ 64 MiB)")
    print(markdown(result))


if __name__ == "__main__":
    main()
