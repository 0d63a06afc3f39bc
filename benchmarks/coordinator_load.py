"""Coordinator under load: N simulated workers (threads, raw HTTP) lease, heartbeat, commit and submit against
one coordinator app on 127.0.0.1, with a commit budget that binds. No model: every submission is a pre-built
synthetic LoRA adapter (r=16 on q_proj/v_proj of 8 layers of width 896, 1.8 MB fp32, like a 0.5B model's)
committed to a LocalStore by the simulated worker, then reported with ``submit``.

    .venv/bin/python benchmarks/coordinator_load.py [--workers 1000] [--duration 120] [--budget 300]

The coordinator runs in a subprocess (its own GIL; ``--serve`` mode of this file). Measured: calls per second,
p50/p99 latency per endpoint, outcomes (leases refused with ``budget``, stale refusals), commits made during the
run vs the hourly budget, and lost submissions (committed by a worker, neither merged nor refused at the end:
must be 0). Writes ``benchmarks/results/coordinator_load.{md,json}``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "benchmarks" / "results"
SECRET = b"load-secret"
LAYERS, WIDTH, RANK, MODULES = 8, 896, 16, ("q_proj", "v_proj")


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


def init_run(repo: Path, tmp: Path, budget: int, quorum: int) -> None:
    """A run repo whose config matches the synthetic adapters."""
    from hubgrpo.coordinator.repo_init import init_repo
    from hubgrpo.config import loads
    from hubgrpo.store.local import LocalStore

    cfg = loads("base_model: builtin:tiny\nproject_name: load\n"
                "params: {steps_per_round: 2, per_device_train_batch_size: 4, num_generations: 2, versions: 100000,"
                " learning_rate: 0.1}\n"
                f"lora: {{r: {RANK}, alpha: {2 * RANK}, target_modules: [q_proj, v_proj]}}\n"
                f"merge: {{quorum: {quorum}, max_staleness: 4}}\n"
                f"coordinator: {{commit_budget_per_hour: {budget}, lease_timeout_s: 600, heartbeat_interval_s: 30,"
                " round_timeout_s: 10}\n")
    init_repo(LocalStore(repo), cfg, make_adapter(tmp / "v0", 0, 0.0))


def serve_forever(repo: str, port: int, workdir: str) -> None:
    """``--serve``: the coordinator app in this process, until killed."""
    from hubgrpo.coordinator.core import Coordinator
    from hubgrpo.space.api import serve
    from hubgrpo.store.local import LocalStore

    serve(Coordinator(LocalStore(repo), SECRET, workdir=Path(workdir)), port=port, tick_interval=1.0)
    print("up", flush=True)
    time.sleep(24 * 3600)


class Recorder:
    """Thread-safe latency samples and outcome counters."""

    def __init__(self):
        self.lock = threading.Lock()
        self.lat: dict[str, list[float]] = collections.defaultdict(list)
        self.outcomes: collections.Counter = collections.Counter()
        self.committed: list[str] = []
        self.refused: list[str] = []  # submissions the coordinator answered with a refusal

    def timed(self, endpoint: str, fn):
        t = time.perf_counter()
        try:
            return fn()
        finally:
            with self.lock:
                self.lat[endpoint].append(time.perf_counter() - t)

    def count(self, what: str) -> None:
        with self.lock:
            self.outcomes[what] += 1


def submission_adds(lease, variant: Path) -> tuple[dict, str]:
    """(adds, message) of a simulated worker's submission commit: a pre-built adapter + its submission.json."""
    from hubgrpo import layout
    from tests.coord_helpers import submission_record

    sub_id = layout.submission_id(lease.worker, lease.lease_id)
    adds = {layout.submission_path(lease.base_version, sub_id, f): variant / f for f in layout.ADAPTER_FILES}
    adds[layout.submission_path(lease.base_version, sub_id, layout.SUBMISSION_FILE)] = \
        submission_record(lease, reward=random.random(), samples=8).to_json()
    return adds, f"hubgrpo: submission {sub_id} (base v{lease.base_version})"


def train(client, lease, rec: Recorder, seconds: float, beat: float):
    """Pretend to train for ``seconds``, heartbeating every ``beat`` seconds; returns the latest lease."""
    from hubgrpo.errors import HubGrpoError

    end = time.time() + seconds
    while time.time() < end:
        time.sleep(min(beat, max(0.0, end - time.time())))
        try:
            lease = rec.timed("heartbeat", lambda: client.heartbeat(lease))
            rec.count("heartbeat_ok")
        except HubGrpoError as e:  # lease expired or coordinator unreachable: the submit will tell
            rec.count(f"heartbeat_{e.code}")
    return lease


def sim_worker(i: int, url: str, store, variants: list[Path], rec: Recorder, stop_at: float, args) -> None:
    """One simulated worker: lease → train (sleep + heartbeats) → commit → submit, until ``stop_at``."""
    from hubgrpo import layout
    from hubgrpo.worker.client import CoordinatorClient
    from hubgrpo.errors import CoordinatorError, InvalidSubmission, LeaseError, Refused

    rng = random.Random(i)
    client = CoordinatorClient(url, transport="http", retries=3, timeout=120, backoff=0.5)
    time.sleep(rng.uniform(0, args.ramp))
    while time.time() < stop_at:
        try:
            lease = rec.timed("lease", lambda: client.lease(f"sim{i:04d}"))
        except Refused as e:
            rec.count(f"lease_refused_{e.code}")
            if e.code == "finished":
                break
            time.sleep(min(float(getattr(e, "wait_s", 0) or 5.0), args.max_wait) * rng.uniform(0.5, 1.0))
            continue
        except CoordinatorError as e:
            rec.count(f"lease_{e.code}")
            time.sleep(1.0)
            continue
        rec.count("lease_ok")
        lease = train(client, lease, rec, rng.uniform(args.train_min, args.train_max), args.beat)
        adds, msg = submission_adds(lease, variants[i % len(variants)])
        commit = rec.timed("commit (LocalStore)", lambda: store.commit(adds, message=msg))
        with rec.lock:
            rec.committed.append(layout.submission_id(lease.worker, lease.lease_id))
        try:
            answer = rec.timed("submit", lambda: client.submit(lease, commit))
            rec.count(f"submit_{answer['status']}")
        except (InvalidSubmission, LeaseError) as e:
            rec.count(f"submit_refused_{e.code}")
            with rec.lock:
                rec.refused.append(layout.submission_id(lease.worker, lease.lease_id))
        except CoordinatorError as e:
            rec.count(f"submit_{e.code}")
    client.close()


def pct(samples: list[float]) -> dict:
    s = sorted(samples)
    if not s:
        return {"n": 0}
    return {"n": len(s), "p50_ms": round(s[len(s) // 2] * 1e3, 1), "p99_ms": round(s[int(0.99 * (len(s) - 1))] * 1e3, 1),
            "max_ms": round(s[-1] * 1e3, 1)}


def start_server(repo: Path, tmp: Path):
    from hubgrpo.worker.client import CoordinatorClient
    from hubgrpo.space.api import free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, __file__, "--serve", str(repo), str(port), str(tmp / "coord")],
                            stdout=open(tmp / "coordinator.log", "wb"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    probe = CoordinatorClient(url, transport="http", retries=0, timeout=5)
    for _ in range(240):  # bounded: 120 s
        try:
            probe.status()
            return proc, url, probe
        except Exception:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"coordinator did not start; see {tmp / 'coordinator.log'}")


def drain(probe, timeout: float) -> dict:
    """Wait (bounded) until no submission is pending (the round deadline merges the rest); the final status."""
    end = time.time() + timeout
    status = probe.status()
    while status["pending"] and time.time() < end:
        time.sleep(1.0)
        status = probe.status()
    return status


def account(store, rec: Recorder, status: dict, t0: float, budget: int) -> dict:
    """Lost submissions and commits vs budget, from the repo (state.json + history) and the live status."""
    from hubgrpo import runrepo

    state = runrepo.read_state(store)
    merged = set(state.merged_ids)
    # refusals are persisted in state.json only at the next merge (and the live status shows the last 50):
    # count the refusals the workers were answered with too
    refused = {r.submission_id for r in state.refused} | {r["submission_id"] for r in status["refusals"]}
    refused |= set(rec.refused)
    committed = set(rec.committed)
    commits = [c for c in store.history() if c.created_at >= t0]
    merges = sum(c.message.startswith("hubgrpo: version ") for c in commits)
    return {"committed": len(committed), "merged": len(committed & merged), "refused": len(committed & refused),
            "pending_at_end": len(status["pending"]), "lost": sorted(committed - merged - refused),
            "duplicates_merged": len(state.merged_ids) - len(merged), "versions": state.version,
            "commits_in_run": len(commits), "merge_commits": merges, "budget_per_hour": budget,
            "budget_honoured": len(commits) <= budget, "refused_by_coordinator_record": len(committed & (
                {r.submission_id for r in state.refused} | {r["submission_id"] for r in status["refusals"]}))}


def run(args) -> dict:
    import tempfile

    from hubgrpo.store.local import LocalStore

    tmp = Path(tempfile.mkdtemp(prefix="hubgrpo-load-"))
    repo = tmp / "repo"
    init_run(repo, tmp, args.budget, args.quorum)
    variants = [make_adapter(tmp / f"variant{k}", 100 + k, 0.01) for k in range(8)]
    proc, url, probe = start_server(repo, tmp)
    rec, store = Recorder(), LocalStore(repo)
    try:
        t0 = time.time()
        stop_at = t0 + args.duration
        threads = [threading.Thread(target=sim_worker, args=(i, url, store, variants, rec, stop_at, args),
                                    daemon=True) for i in range(args.workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=max(1.0, stop_at + args.train_max + 120 - time.time()))
        wall = time.time() - t0
        status = drain(probe, 60)
        acc = account(store, rec, status, t0, args.budget)
    finally:
        proc.kill()
        proc.wait()
    calls = sum(len(v) for k, v in rec.lat.items() if k != "commit (LocalStore)")
    return {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": machine(),
            "workers": args.workers, "duration_s": args.duration, "wall_s": round(wall, 1), "quorum": args.quorum,
            "adapter_mb": round((variants[0] / "adapter_model.safetensors").stat().st_size / 2**20, 2),
            "threads_alive_at_end": sum(t.is_alive() for t in threads), "calls": calls,
            "calls_per_s": round(calls / wall, 1), "latency": {k: pct(v) for k, v in sorted(rec.lat.items())},
            "outcomes": dict(sorted(rec.outcomes.items())), **acc}


def machine() -> str:
    return (f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs (shared), Python "
            f"{platform.python_version()}, load average {tuple(round(x, 1) for x in os.getloadavg())}")


def to_markdown(r: dict) -> str:
    lines = [f"# Coordinator under load ({r['date']})", "",
             f"{r['workers']} simulated workers (threads, raw HTTP `/gradio_api/run`), {r['duration_s']} s of leasing "
             f"(wall {r['wall_s']} s), quorum {r['quorum']}, adapters {r['adapter_mb']} MB, one coordinator "
             f"subprocess on 127.0.0.1, LocalStore. Machine: {r['machine']}. Other jobs shared the 2 cores: "
             "absolute latencies are noisy.", "",
             f"Throughput: {r['calls']} API calls, **{r['calls_per_s']} calls/s**. Versions merged: {r['versions']}.",
             "", "| endpoint | calls | p50 | p99 | max |", "|---|---|---|---|---|"]
    for k, v in r["latency"].items():
        if v.get("n"):
            lines.append(f"| {k} | {v['n']} | {v['p50_ms']} ms | {v['p99_ms']} ms | {v['max_ms']} ms |")
    lines += ["", "| submissions | count |", "|---|---|"]
    for k in ("committed", "merged", "refused", "pending_at_end", "duplicates_merged"):
        lines.append(f"| {k} | {r[k]} |")
    lines.append(f"| **lost** | **{len(r['lost'])}** |")
    lines += ["", f"Commits during the run: {r['commits_in_run']} ({r['merge_commits']} merges) against a budget of "
              f"{r['budget_per_hour']}/hour: **{'honoured' if r['budget_honoured'] else 'EXCEEDED'}**.", "",
              "Outcomes: " + ", ".join(f"{k} {v}" for k, v in r["outcomes"].items()), ""]
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        return serve_forever(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=1000)
    ap.add_argument("--duration", type=float, default=100.0, help="seconds during which workers lease")
    ap.add_argument("--budget", type=int, default=300, help="coordinator.commit_budget_per_hour")
    ap.add_argument("--quorum", type=int, default=8)
    ap.add_argument("--ramp", type=float, default=20.0, help="workers start spread over this many seconds")
    ap.add_argument("--train-min", type=float, default=40.0)
    ap.add_argument("--train-max", type=float, default=90.0)
    ap.add_argument("--beat", type=float, default=30.0, help="heartbeat interval of the simulated workers")
    ap.add_argument("--max-wait", type=float, default=30.0, help="cap on the wait honoured after a budget refusal")
    ap.add_argument("--results", type=Path, default=RESULTS, help="folder for coordinator_load.{md,json}")
    args = ap.parse_args()
    r = run(args)
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "coordinator_load.json").write_text(json.dumps(r, indent=1) + "\n")
    (args.results / "coordinator_load.md").write_text(to_markdown(r))
    print(to_markdown(r))


if __name__ == "__main__":
    main()
