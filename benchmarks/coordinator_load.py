"""Coordinator under an honest load: the server in one process, a cheap open-loop load generator (one asyncio
process, raw HTTP) in another, and the server's own CPU per call read from /proc.

    .venv/bin/python benchmarks/coordinator_load.py [--workers 100,250,500,1000] [--round-s 60] [--beat-s 30]
                                                    [--measure-s 90] [--modes s3,repo]

Each simulated worker leases at a fixed phase in its round (``--round-s``), heartbeats every ``--beat-s`` and
submits at the end of the round, on a schedule that does not wait for the server (open loop: a slow answer does
not slow the arrivals, so latency grows without bound past saturation instead of hiding it). A round's adapter is a
pre-built synthetic LoRA (r=16 on q_proj/v_proj of 8 layers of width 896, 1.75 MB fp32, like a 0.5B model's), so
the coordinator does its real work on every submit: it reads the folder, checks it (safetensors, shapes, norms) and
merges at the quorum. Modes:

- ``s3``: ``hub.submissions`` is a bucket on a moto S3 server (a third process on the same cores); the generator
  PUTs each round through the lease's presigned URLs; the run repo gets merge commits only.
- ``repo``: rounds are commits of the run repo (a LocalStore, committed by the generator in a thread), so leases
  are bound by ``coordinator.commit_budget_per_hour`` (``--budget``, Hub-like).

Measured per (mode, workers): p50/p99/max of lease, heartbeat and submit over the last ``--measure-s`` seconds (a
warm-up of one round first), the server process's CPU seconds per call and its utilisation, outcomes (refusals
by code, errors), and at the end lost submissions (delivered, neither merged, refused nor pending: must be 0) and
duplicates merged (must be 0). Writes ``benchmarks/results/coordinator_load.{md,json}``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "benchmarks" / "results"
SECRET = b"load-secret"
LAYERS, WIDTH, RANK, MODULES = 8, 896, 16, ("q_proj", "v_proj")
ENDPOINTS = ("lease", "heartbeat", "submit")
TICKS = os.sysconf("SC_CLK_TCK")


def make_adapter(folder: Path, seed: int, scale: float) -> Path:
    """A PEFT adapter folder of realistic size; scale=0 gives B=0 (version 0)."""
    import torch
    from peft import LoraConfig
    from safetensors.torch import save_file

    from hubgrpo import layout

    g = torch.Generator().manual_seed(seed)
    sd = {}
    for i in range(LAYERS):
        for m in MODULES:
            p = f"base_model.model.model.layers.{i}.self_attn.{m}"
            sd[f"{p}.lora_A.weight"] = torch.randn(RANK, WIDTH, generator=torch.Generator().manual_seed(i)) * 0.02
            sd[f"{p}.lora_B.weight"] = scale * torch.randn(WIDTH, RANK, generator=g)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(sd, str(folder / layout.ADAPTER_WEIGHTS))
    cfg = LoraConfig(r=RANK, lora_alpha=2 * RANK, target_modules=list(MODULES), task_type="CAUSAL_LM",
                     base_model_name_or_path="builtin:tiny").to_dict()
    (folder / layout.ADAPTER_CONFIG).write_text(json.dumps(cfg, default=lambda o: sorted(o) if isinstance(o, set)
                                                           else str(o)))
    return folder


def init_run(repo: Path, tmp: Path, args, submissions: str | None) -> None:
    """A run repo whose config matches the synthetic adapters."""
    from hubgrpo.config import loads
    from hubgrpo.coordinator.repo_init import init_repo
    from hubgrpo.store.local import LocalStore

    box = f"hub: {{submissions: {submissions}}}\n" if submissions else ""
    cfg = loads("base_model: builtin:tiny\nproject_name: load\n"
                "params: {steps_per_round: 2, per_device_train_batch_size: 4, num_generations: 2, versions: 100000,"
                " learning_rate: 0.1}\n"
                f"lora: {{r: {RANK}, alpha: {2 * RANK}, target_modules: [q_proj, v_proj]}}\n"
                f"merge: {{method: ffa, quorum: {args.quorum}, max_staleness: 8, max_norm_factor: null}}\n"
                f"coordinator: {{commit_budget_per_hour: {args.budget}, lease_timeout_s: {3 * args.round_s},"
                f" heartbeat_interval_s: {args.beat_s}, round_timeout_s: {args.round_s},"
                f" max_leases_per_user: 100000, lease_waits_for_merge_s: 0}}\n" + box)
    init_repo(LocalStore(repo), cfg, make_adapter(tmp / "v0", 0, 0.0))


def serve_forever(repo: str, port: int, workdir: str) -> None:
    """``--serve``: the coordinator app in this process, until killed."""
    import torch

    from hubgrpo.coordinator.core import Coordinator
    from hubgrpo.space.api import serve
    from hubgrpo.store.local import LocalStore

    torch.set_num_threads(1)
    serve(Coordinator(LocalStore(repo, fsync=False), SECRET, workdir=Path(workdir)), port=port, tick_interval=1.0)
    print("up", flush=True)
    time.sleep(24 * 3600)


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (and its finished children), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(fields[i]) for i in (11, 12, 13, 14)) / TICKS


class Recorder:
    """Latency samples (within the measurement window) and outcome counters."""

    def __init__(self):
        self.lat: dict[str, list[float]] = collections.defaultdict(list)
        self.outcomes: collections.Counter = collections.Counter()
        self.window: tuple[float, float] = (0.0, 0.0)
        self.delivered: set[str] = set()
        self.refused: set[str] = set()

    def sample(self, endpoint: str, started: float, seconds: float) -> None:
        if self.window[0] <= started < self.window[1]:
            self.lat[endpoint].append(seconds)


class Generator:
    """The simulated fleet: one coroutine per worker, every request on its own schedule (open loop)."""

    def __init__(self, args, mode: str, url: str, repo: Path, variant: Path, rec: Recorder):
        import httpx

        from hubgrpo import layout

        self.args, self.mode, self.rec, self.layout = args, mode, rec, layout
        limits = httpx.Limits(max_connections=512, max_keepalive_connections=512)
        self.api = httpx.AsyncClient(base_url=url + "/gradio_api/run", timeout=120, limits=limits)
        self.s3 = httpx.AsyncClient(timeout=120, limits=limits)
        self.files = {n: (variant / n).read_bytes() for n in layout.ADAPTER_FILES}
        self.variant = variant
        self.store = None
        if mode == "repo":
            from hubgrpo.store.local import LocalStore

            self.store = LocalStore(repo, fsync=False)
        self.tasks: set[asyncio.Task] = set()

    def spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def call(self, name: str, data: list) -> tuple[bool, object]:
        started = time.time()
        t = time.perf_counter()
        try:
            resp = await self.api.post(f"/{name}", json={"data": data})
            envelope = resp.json()["data"][0]
        except Exception as e:  # deliberate: a benchmark counts every failure, whatever it is
            self.rec.outcomes[f"{name}_transport_{type(e).__name__}"] += 1
            return False, None
        finally:
            self.rec.sample(name, started, time.perf_counter() - t)
        if envelope.get("ok"):
            return True, envelope["result"]
        err = envelope.get("error") or {}
        self.rec.outcomes[f"{name}_refused_{err.get('code')}"] += 1
        return False, err

    async def worker(self, i: int, t0: float, stop_leasing: float) -> None:
        rng = random.Random(i)
        start = t0 + rng.uniform(0, self.args.round_s)
        while start < stop_leasing:
            await asyncio.sleep(max(0.0, start - time.time()))
            self.spawn(self.round(f"sim{i:04d}", start))
            start += self.args.round_s

    async def round(self, name: str, start: float) -> None:
        from hubgrpo.layout import PROTOCOL_VERSION

        ok, lease = await self.call("lease", [name, None, None, PROTOCOL_VERSION])
        if not ok:
            return
        self.rec.outcomes["lease_ok"] += 1
        held = {"lease": lease}
        end = start + self.args.round_s - 1.5  # upload, then submit 0.5 s before the next round's lease
        beat = start + self.args.beat_s
        while beat < end:
            self.spawn(self.heartbeat(held, beat))
            beat += self.args.beat_s
        await asyncio.sleep(max(0.0, end - time.time()))
        token = await self.deliver(held["lease"])
        if token is None:
            return
        sub_id = self.layout.submission_id(lease["worker"], lease["lease_id"])
        self.rec.delivered.add(sub_id)
        await asyncio.sleep(max(0.0, end + 1.0 - time.time()))
        ok, answer = await self.call("submit", [held["lease"], token, None])
        if ok:
            self.rec.outcomes[f"submit_{answer['status']}"] += 1
        elif answer and answer.get("error") in ("InvalidSubmission", "LeaseError"):
            self.rec.refused.add(sub_id)

    async def heartbeat(self, held: dict, at: float) -> None:
        await asyncio.sleep(max(0.0, at - time.time()))
        ok, renewed = await self.call("heartbeat", [held["lease"], None])
        if ok:
            held["lease"] = renewed
            self.rec.outcomes["heartbeat_ok"] += 1

    async def deliver(self, lease: dict) -> str | None:
        """Upload the round (S3: presigned PUTs; repo: a commit in a thread); the token or commit to submit."""
        from hubgrpo.layout import Lease
        from tests.coord_helpers import submission_record

        layout = self.layout
        record = submission_record(Lease.model_validate({**lease, "uploads": {}}), reward=random.random()).to_json()
        try:
            if self.mode == "s3":
                for name in layout.SUBMISSION_FILES:
                    body = record if name == layout.SUBMISSION_FILE else self.files[name]
                    r = await self.s3.put(lease["uploads"][name], content=body, headers={"If-None-Match": "*"})
                    if r.status_code not in (200, 412):
                        raise RuntimeError(f"PUT {name}: HTTP {r.status_code}")
                return layout.box_token(record)
            sub_id = layout.submission_id(lease["worker"], lease["lease_id"])
            adds = {layout.submission_path(lease["base_version"], sub_id, n): self.variant / n
                    for n in layout.ADAPTER_FILES}
            adds[layout.submission_path(lease["base_version"], sub_id, layout.SUBMISSION_FILE)] = record
            return await asyncio.to_thread(self.store.commit, adds, message=f"hubgrpo: submission {sub_id}")
        except Exception as e:  # deliberate: counted, the round is then not submitted
            self.rec.outcomes[f"deliver_failed_{type(e).__name__}"] += 1
            return None

    async def close(self) -> None:
        await self.api.aclose()
        await self.s3.aclose()


def generate(args, mode: str, url: str, repo: Path, variant: Path, workers: int, out: Path) -> None:
    """``--generate``: run the fleet in this process; write its Recorder as JSON to ``out``."""
    async def main() -> Recorder:
        rec = Recorder()
        gen = Generator(args, mode, url, repo, variant, rec)
        t0 = time.time() + 1.0
        warm = t0 + args.round_s
        rec.window = (warm, warm + args.measure_s)
        stop = warm + args.measure_s
        fleet = [asyncio.get_running_loop().create_task(gen.worker(i, t0, stop)) for i in range(workers)]
        await asyncio.gather(*fleet)
        deadline = time.time() + args.round_s + 60
        while gen.tasks and time.time() < deadline:  # rounds leased before the stop finish
            await asyncio.sleep(0.5)
        rec.outcomes["rounds_unfinished_at_end"] = len(gen.tasks)
        await gen.close()
        return rec

    t_cpu = time.process_time()
    rec = asyncio.run(main())
    out.write_text(json.dumps({"lat": rec.lat, "outcomes": rec.outcomes, "window": rec.window,
                               "delivered": sorted(rec.delivered), "refused": sorted(rec.refused),
                               "generator_cpu_s": time.process_time() - t_cpu}))


def pct(samples: list[float]) -> dict:
    s = sorted(samples)
    if not s:
        return {"n": 0}
    return {"n": len(s), "p50_ms": round(s[len(s) // 2] * 1e3, 1),
            "p99_ms": round(s[int(0.99 * (len(s) - 1))] * 1e3, 1), "max_ms": round(s[-1] * 1e3, 1)}


def start(cmd: list[str], log: Path, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdout=open(log, "wb"), stderr=subprocess.STDOUT, start_new_session=True,
                            env=env)


def wait_up(check, what: str, timeout: float = 120.0) -> None:
    end = time.time() + timeout
    while time.time() < end:
        try:
            if check():
                return
        except Exception:  # deliberate: not up yet
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{what} did not start within {timeout:.0f} s")


def calibrate(url: str, pid: int, n: int = 200) -> dict:
    """Server CPU per call in isolation: sequential calls from one client, CPU read from /proc around them."""
    import httpx

    from hubgrpo.layout import PROTOCOL_VERSION

    out = {}
    with httpx.Client(base_url=url + "/gradio_api/run", timeout=60) as http:
        def run(name, data):
            return http.post(f"/{name}", json={"data": data}).json()["data"][0]

        lease = run("lease", ["calib", None, None, PROTOCOL_VERSION])["result"]
        for name, make in (("status", lambda: [None]), ("heartbeat", lambda: [lease, None])):
            c0, t0 = cpu_seconds(pid), time.perf_counter()
            for _ in range(n):
                run(name, make())
            out[name] = {"cpu_ms": round((cpu_seconds(pid) - c0) / n * 1e3, 2),
                         "wall_ms": round((time.perf_counter() - t0) / n * 1e3, 2)}
        run("release", [lease, None])
        c0, t0 = cpu_seconds(pid), time.perf_counter()
        for i in range(n // 2):
            got = run("lease", [f"calib{i}", None, None, PROTOCOL_VERSION])["result"]
            run("release", [got, None])
        out["lease+release"] = {"cpu_ms": round((cpu_seconds(pid) - c0) / (n // 2) * 1e3, 2),
                                "wall_ms": round((time.perf_counter() - t0) / (n // 2) * 1e3, 2)}
    return out


def start_stack(args, mode: str, workers: int, tmp: Path, procs: list) -> tuple[str, int, int | None, Path, Path]:
    """The S3 server (mode s3), a fresh run repo and the coordinator process; (url, server pid, moto pid, repo,
    the round adapter). Started processes are appended to ``procs``."""
    import socket

    import httpx

    from hubgrpo.space.api import free_port

    env, box, moto = dict(os.environ, OMP_NUM_THREADS="1"), None, None
    if mode == "s3":
        port = free_port()
        env.update(AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}", AWS_ACCESS_KEY_ID="bench",
                   AWS_SECRET_ACCESS_KEY="bench-secret", AWS_DEFAULT_REGION="us-east-1",
                   AWS_EC2_METADATA_DISABLED="true")
        procs.append(start([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                           tmp / "moto.log", env))
        moto = procs[-1].pid
        wait_up(lambda: socket.create_connection(("127.0.0.1", port), timeout=1).close() or True, "moto")
        box = f"s3://load-{os.getpid()}-{workers}/rounds"
    os.environ.update({k: v for k, v in env.items() if k.startswith("AWS_")})
    repo = tmp / "repo"
    init_run(repo, tmp, args, box)
    variant = make_adapter(tmp / "variant", 7, 0.01)
    port = free_port()
    procs.append(start([sys.executable, __file__, "--serve", str(repo), str(port), str(tmp / "coord")],
                       tmp / "coordinator.log", env))
    url = f"http://127.0.0.1:{port}"
    wait_up(lambda: httpx.post(f"{url}/gradio_api/run/status", json={"data": [None]}).status_code == 200,
            "the coordinator")
    return url, procs[-1].pid, moto, repo, variant


def drive(args, mode: str, workers: int, tmp: Path, url: str, repo: Path, variant: Path, pids: dict,
          procs: list) -> tuple[dict, dict]:
    """Run the generator process to its end, sampling the CPU of ``pids`` every second; (its record, the CPU
    seconds each pid used inside the measurement window and the window's length)."""
    out = tmp / "generator.json"
    gen_args = json.dumps({**vars(args), "results": str(args.results)})
    procs.append(start([sys.executable, __file__, "--generate", gen_args, mode, url, str(repo), str(variant),
                        str(workers), str(out)], tmp / "generator.log"))
    gen, marks = procs[-1], []
    while gen.poll() is None:
        marks.append((time.time(), {k: cpu_seconds(p) for k, p in pids.items()}))
        time.sleep(1.0)
    if gen.returncode != 0:
        raise RuntimeError(f"the generator failed: {(tmp / 'generator.log').read_text()[-3000:]}")
    g = json.loads(out.read_text())
    inside = [m for m in marks if g["window"][0] <= m[0] <= g["window"][1]]
    span = inside[-1][0] - inside[0][0] if len(inside) > 1 else 0.0
    cpu = {k: inside[-1][1][k] - inside[0][1][k] for k in pids} if span else {}
    return g, {"span_s": span, **cpu}


def settle(url: str, repo: Path, wait_s: float) -> tuple[dict, object, list]:
    """Wait (bounded) until nothing is pending; the final status, state.json and the repo's history."""
    import httpx

    from hubgrpo import runrepo
    from hubgrpo.store.local import LocalStore

    def status() -> dict:
        return httpx.post(f"{url}/gradio_api/run/status", json={"data": [None]}, timeout=60).json()["data"][0]["result"]

    got, end = status(), time.time() + wait_s
    while got["pending"] and time.time() < end:
        time.sleep(2.0)
        got = status()
    store = LocalStore(repo)
    return got, runrepo.read_state(store), store.history()


def one_run(args, mode: str, workers: int, tmp: Path) -> dict:
    """A fresh run repo and server (and S3 server), the fleet for warm-up + measurement, then the accounting."""
    tmp.mkdir(parents=True)
    procs: list = []
    try:
        url, server, moto, repo, variant = start_stack(args, mode, workers, tmp, procs)
        calib = calibrate(url, server)
        pids = {"server": server, **({"moto": moto} if moto else {})}
        g, cpu = drive(args, mode, workers, tmp, url, repo, variant, pids, procs)
        status, state, history = settle(url, repo, 2 * args.round_s)
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.kill()
                p.wait()
    w0, w1 = g["window"]
    calls = sum(len(v) for v in g["lat"].values())
    span = cpu["span_s"]
    merged = set(state.merged_ids)
    refused = {r.submission_id for r in state.refused} | {r["submission_id"] for r in status["refusals"]}
    delivered = set(g["delivered"])
    lost = delivered - merged - refused - set(g["refused"]) - set(status["pending"])
    return {"mode": mode, "workers": workers, "calibration": calib,
            "latency": {k: pct(g["lat"].get(k, [])) for k in ENDPOINTS},
            "calls_measured": calls, "calls_per_s": round(calls / (w1 - w0), 1),
            "server_cpu_cores": round(cpu["server"] / span, 2) if span else None,
            "server_cpu_ms_per_call": round(cpu["server"] / (calls * span / (w1 - w0)) * 1e3, 2) if calls and span
            else None, "moto_cpu_cores": round(cpu["moto"] / span, 2) if span and "moto" in cpu else None,
            "generator_cpu_s": round(g["generator_cpu_s"], 1), "outcomes": dict(sorted(g["outcomes"].items())),
            "delivered": len(delivered), "merged": len(delivered & merged),
            "refused": len(delivered & (refused | set(g["refused"]))), "pending_at_end": len(status["pending"]),
            "lost": len(lost), "duplicates_merged": len(state.merged_ids) - len(merged), "versions": state.version,
            "repo_commits": len(history) - 1,
            "merge_commits": sum(c.message.startswith("hubgrpo: version ") for c in history),
            "submission_commits": sum(c.message.startswith("hubgrpo: submission ") for c in history),
            "load_average": [round(x, 1) for x in os.getloadavg()]}


def machine() -> str:
    return (f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs (shared), Python "
            f"{platform.python_version()}, load average {tuple(round(x, 1) for x in os.getloadavg())}")


def served_within(runs: list[dict], mode: str, limit_ms: float = 100.0) -> int | None:
    """The largest fleet of ``mode`` whose lease, heartbeat and submit p99 were all within ``limit_ms``."""
    ok = [r["workers"] for r in runs if r["mode"] == mode and all(
        r["latency"][k].get("n") and r["latency"][k]["p99_ms"] <= limit_ms for k in ENDPOINTS)]
    return max(ok) if ok else None


def to_markdown(res: dict) -> str:
    a = res["args"]
    lines = [f"# Coordinator under load ({res['date']})", "",
             f"Open-loop fleet (one asyncio process, raw HTTP `/gradio_api/run`), {a['round_s']:.0f}-s rounds, "
             f"{a['beat_s']:.0f}-s heartbeats, quorum {a['quorum']} (merge.method ffa, prefolded), commit budget "
             f"{a['budget']}/hour, 1.75 MB adapters checked on every submit; latencies over {a['measure_s']:.0f} s "
             f"after one round of warm-up. Coordinator, generator and (mode s3) the moto S3 server are separate "
             f"processes on the same machine: {res['machine']}.", "",
             "| mode | workers | calls/s | lease p50 / p99 | heartbeat p50 / p99 | submit p50 / p99 | server CPU "
             "(cores) | server CPU per call | moto CPU (cores) | load avg | lost | merged twice | repo commits "
             "(merges) |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["runs"]:
        lat = r["latency"]
        cells = [f"{lat[k].get('p50_ms', '-')} / {lat[k].get('p99_ms', '-')} ms" for k in ENDPOINTS]
        lines.append(f"| {r['mode']} | {r['workers']} | {r['calls_per_s']} | {' | '.join(cells)} | "
                     f"{r['server_cpu_cores']} | {r['server_cpu_ms_per_call']} ms | {r['moto_cpu_cores'] or '-'} | "
                     f"{r['load_average'][0]} | {r['lost']} | "
                     f"{r['duplicates_merged']} | {r['repo_commits']} ({r['merge_commits']}) |")
    lines += ["", "Largest fleet with every p99 ≤ 100 ms: " + ", ".join(
        f"{m}: {served_within(res['runs'], m) or 'none measured'}" for m in res["args"]["modes"]), "",
        "Server CPU per call in isolation (sequential calls, one client):", ""]
    calib = res["runs"][0]["calibration"] if res["runs"] else {}
    lines += [f"- {k}: {v['cpu_ms']} ms CPU, {v['wall_ms']} ms wall" for k, v in calib.items()]
    lines += ["", "Outcomes per run:", ""]
    for r in res["runs"]:
        lines.append(f"- {r['mode']} × {r['workers']}: delivered {r['delivered']}, merged {r['merged']}, refused "
                     f"{r['refused']}, pending at end {r['pending_at_end']}, versions {r['versions']}; "
                     + ", ".join(f"{k} {v}" for k, v in r["outcomes"].items()))
    return "\n".join(lines) + "\n"


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        return serve_forever(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    if len(sys.argv) > 1 and sys.argv[1] == "--generate":
        args = argparse.Namespace(**json.loads(sys.argv[2]))
        return generate(args, sys.argv[3], sys.argv[4], Path(sys.argv[5]), Path(sys.argv[6]), int(sys.argv[7]),
                        Path(sys.argv[8]))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", default="250,500,1000", help="fleet sizes of mode s3 (comma-separated)")
    ap.add_argument("--repo-workers", default="1000", help="fleet sizes of mode repo")
    ap.add_argument("--modes", default="s3,repo")
    ap.add_argument("--round-s", type=float, default=60.0)
    ap.add_argument("--beat-s", type=float, default=30.0)
    ap.add_argument("--measure-s", type=float, default=60.0)
    ap.add_argument("--quorum", type=int, default=256, help="merge.quorum (1000 workers / 256 ≈ 4 merges a minute)")
    ap.add_argument("--budget", type=int, default=300, help="coordinator.commit_budget_per_hour (Hub-like)")
    ap.add_argument("--results", type=Path, default=RESULTS, help="folder for coordinator_load.{md,json}")
    args = ap.parse_args()
    args.modes = args.modes.split(",")
    tmp = Path(tempfile.mkdtemp(prefix="hubgrpo-load-"))
    runs = []
    for mode in args.modes:
        sizes = args.workers if mode == "s3" else args.repo_workers
        for n in (int(x) for x in sizes.split(",")):
            print(f"{mode} × {n} …", flush=True)
            runs.append(one_run(args, mode, n, tmp / f"{mode}-{n}"))
            print(json.dumps(runs[-1]["latency"]), flush=True)
    res = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": machine(),
           "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}, "runs": runs}
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "coordinator_load.json").write_text(json.dumps(res, indent=1) + "\n")
    (args.results / "coordinator_load.md").write_text(to_markdown(res))
    print(to_markdown(res))


if __name__ == "__main__":
    main()
