"""Coordinator under an honest load: the server in one process, a cheap open-loop load generator (one asyncio
process, raw HTTP; ``load_fleet.py``) in another, and the server's own CPU per call read from /proc.

    python benchmarks/load/coordinator_load.py [--workers 250,500,1000] [--repo-workers 1000] [--round-s 60]
        [--beat-s 30] [--measure-s 60] [--modes s3,repo] [--route plain|gradio] [--server-cpus 0 --load-cpus 1]
    python benchmarks/load/coordinator_load.py --quick [--modes hub]   # the script checked: a few workers, 4-s rounds

The fleet is described in ``load_fleet.py``. A round's adapter is a pre-built synthetic LoRA (r=16 on q_proj/v_proj
of 8 layers of width 896, 1.75 MB fp32, like a 0.5B model's) with honest rollouts, so the coordinator does its real
work on every submit: it reads the round, checks it (safetensors, shapes, finiteness, step bound, norms), recomputes
its rewards and folds it into the merge at the quorum. Modes:

- ``s3``: ``hub.submissions`` is a bucket on a moto S3 server (a third process); the fleet PUTs each round through
  the lease's presigned URLs; the run repo gets merge commits only.
- ``repo``: rounds are commits of the run repo (a LocalStore, committed by the fleet in a thread), so leases are
  bound by ``coordinator.commit_budget_per_hour`` (``--budget``, Hub-like).
- ``hub`` (alone: ``--modes hub``): a Hub-only run under the Hub's commit quota — the run repo on the Hub emulator
  (its own process, ``--commit-quota`` 128 an hour), ``hub.submissions: coordinator`` (rounds through the
  ``upload`` route), versions from the adapter route, checkpoints to the repo; see ``load_hub.py``. Writes
  ``coordinator_load-hub.{md,json}``, with the Hub commits an hour, the load average every minute and where the
  next limit is (``load_hub_report.py``).

``--server-cpus`` / ``--load-cpus`` pin the coordinator, and the fleet with moto, to CPU lists (``taskset -c``), so
the coordinator's share of the machine is one known core. Measured per (mode, workers): p50/p99/max of lease,
heartbeat and submit over ``--measure-s`` seconds (after a warm-up of one round), the time from submit to the
round's verdict, the server process's CPU seconds per call and its utilisation, the load average and the busiest
other processes on the machine, outcomes (refusals by code, errors), and at the end lost submissions (delivered,
neither merged, refused nor pending: must be 0) and duplicates merged (must be 0). Writes
``results/coordinator_load.{md,json}`` (``--results DIR`` elsewhere).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.load.load_fleet import CALLS, ENDPOINTS, generate  # noqa: E402
from benchmarks import common  # noqa: E402
from benchmarks.load.load_stats import (busiest, calibrate, cpu_seconds, cpu_set, gc_pauses, pauses_in,  # noqa: E402
                                        pct, pinned, slow_near_merges)
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


def init_run(repo: Path, tmp: Path, args, submissions: str | None) -> None:
    """A run repo whose config matches the synthetic adapters."""
    from hubgrpo.config import loads
    from hubgrpo.coordinator.repo_init import init_repo
    from hubgrpo.store.local import LocalStore

    box = f"hub: {{submissions: {submissions}}}\n" if submissions else ""
    cfg = loads("base_model: builtin:tiny\nproject_name: load\n"
                "params: {per_device_train_batch_size: 4, num_generations: 2, learning_rate: 0.1}\n"
                "rounds: {steps: 2, versions: 100000, lr_schedule: constant, reset_optimizer: true}\n"
                f"lora: {{r: {RANK}, alpha: {2 * RANK}, target_modules: [q_proj, v_proj]}}\n"
                f"merge: {{method: ffa, quorum: {args.quorum}, max_staleness: 8, max_norm_factor: null,"
                " rebase: false, staleness_per_worker: 0}\n"
                f"coordinator: {{commit_budget_per_hour: {args.budget}, lease_timeout_s: {3 * args.round_s},"
                f" heartbeat_interval_s: {args.beat_s}, round_timeout_s: {args.round_s},"
                f" max_leases_per_user: 100000, lease_waits_for_merge_s: 0}}\n" + box)
    init_repo(LocalStore(repo), cfg, make_adapter(tmp / "v0", 0, 0.0))


def serve_forever(repo: str, port: int, workdir: str) -> None:
    """``--serve``: the coordinator app in this process, until killed."""
    import torch

    from benchmarks.load.load_fleet import open_store

    from hubgrpo.coordinator.core import Coordinator
    from hubgrpo.space.api import serve

    torch.set_num_threads(1)
    gc_pauses(Path(workdir).parent / "gc_pauses.txt")
    serve(Coordinator(open_store(repo), SECRET, workdir=Path(workdir)), port=port, tick_interval=1.0)
    print("up", flush=True)
    time.sleep(24 * 3600)


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


def start_stack(args, mode: str, workers: int, tmp: Path, procs: list) -> tuple:
    """The S3 server (mode s3), a fresh run repo and the coordinator process; (url, server pid, moto pid, repo,
    the round adapter, the box URL or None). Started processes are appended to ``procs``."""
    import socket

    import httpx

    from hubgrpo.space.api import free_port

    env, box, moto = dict(os.environ, OMP_NUM_THREADS="1"), None, None
    if mode == "s3":
        port = free_port()
        env.update(AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}", AWS_ACCESS_KEY_ID="bench",
                   AWS_SECRET_ACCESS_KEY="bench-secret", AWS_DEFAULT_REGION="us-east-1",
                   AWS_EC2_METADATA_DISABLED="true")
        procs.append(start([*pinned(args.load_cpus), sys.executable, "-m", "moto.server", "-H", "127.0.0.1",
                            "-p", str(port)], tmp / "moto.log", env))
        moto = procs[-1].pid
        wait_up(lambda: socket.create_connection(("127.0.0.1", port), timeout=1).close() or True, "moto")
        box = f"s3://load-{os.getpid()}-{workers}/rounds"
    os.environ.update({k: v for k, v in env.items() if k.startswith("AWS_")})
    repo = tmp / "repo"
    init_run(repo, tmp, args, box)
    variant = make_adapter(tmp / "variant", 7, 0.01)
    port = free_port()
    procs.append(start([*pinned(args.server_cpus), sys.executable, __file__, "--serve", str(repo), str(port),
                        str(tmp / "coord")], tmp / "coordinator.log", env))
    url = f"http://127.0.0.1:{port}"
    wait_up(lambda: httpx.post(f"{url}/gradio_api/run/status", json={"data": [None]}).status_code == 200,
            "the coordinator")
    return url, procs[-1].pid, moto, repo, variant, box


def box_rounds(box: str | None) -> int:
    """Rounds in the S3 box: its ``submission.json`` objects (boto3 against the moto server of this run)."""
    if box is None:
        return 0
    import boto3

    bucket, _, prefix = box.removeprefix("s3://").partition("/")
    pages = boto3.client("s3").get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return sum(1 for page in pages for o in page.get("Contents", []) if o["Key"].endswith("/submission.json"))


def drive(args, mode: str, workers: int, tmp: Path, url: str, repo: Path | str, variant: Path, pids: dict,
          procs: list, probe=None) -> tuple[dict, dict]:
    """Run the generator process to its end, sampling the CPU of ``pids`` every second (and calling ``probe``, if
    any, every minute); (its record, the CPU seconds each pid used inside the measurement window and the window's
    length, the probe's answers)."""
    out = tmp / "generator.json"
    gen_args = json.dumps({k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()})
    procs.append(start([*pinned(args.load_cpus), sys.executable, __file__, "--generate", gen_args, mode, url,
                        str(repo), str(variant), str(workers), str(out)], tmp / "generator.log"))
    gen, marks, others, minutes = procs[-1], [], [], []
    pids = {**pids, "generator": gen.pid}
    while gen.poll() is None:
        marks.append((time.time(), {k: cpu_seconds(p) for k, p in pids.items()}, os.getloadavg()[0]))
        if probe and (not minutes or marks[-1][0] - minutes[-1]["t"] >= 60):
            minutes.append(probe())
        if not others and len(marks) > args.round_s + args.measure_s / 2:  # mid-window: what else runs
            others = busiest()
        time.sleep(1.0)
    if gen.returncode != 0:
        raise RuntimeError(f"the generator failed: {(tmp / 'generator.log').read_text()[-3000:]}")
    g = json.loads(out.read_text())
    inside = [m for m in marks if g["window"][0] <= m[0] <= g["window"][1]]
    span = inside[-1][0] - inside[0][0] if len(inside) > 1 else 0.0
    cpu = {k: inside[-1][1][k] - inside[0][1][k] for k in pids} if span else {}
    load = [m[2] for m in inside] or [os.getloadavg()[0]]
    return g, {"span_s": span, **cpu, "load": (round(min(load), 1), round(max(load), 1)), "others": others,
               "minutes": minutes}


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
        url, server, moto, repo, variant, box = start_stack(args, mode, workers, tmp, procs)
        calib = calibrate(url, server)
        pids = {"server": server, **({"moto": moto} if moto else {})}
        g, cpu = drive(args, mode, workers, tmp, url, repo, variant, pids, procs)
        status, state, history = settle(url, repo, 2 * args.round_s)
        on_s3 = box_rounds(box)
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.kill()
                p.wait()
    return {"mode": mode, "workers": workers, "calibration": calib, **account(g, cpu),
            "server_gc_pauses": pauses_in(tmp / "gc_pauses.txt", tuple(g["window"])),
            "fleet_gc_pauses": pauses_in(tmp / "fleet_gc_pauses.txt", tuple(g["window"])),
            **audit(g, status, state, history), "rounds_on_s3": on_s3}


def account(g: dict, cpu: dict) -> dict:
    """Latencies, calls and the server's CPU inside the measurement window."""
    w0, w1 = g["window"]
    calls = sum(len(g["lat"].get(k, [])) for k in CALLS)
    span = cpu["span_s"]
    per_call = cpu["server"] / (calls * span / (w1 - w0)) * 1e3 if calls and span else None
    return {"latency": {k: pct(g["lat"].get(k, [])) for k in (*CALLS, "submit_to_verdict", "loop_lag")},
            "calls_measured": calls, "calls_per_s": round(calls / (w1 - w0), 1),
            "server_cpu_cores": round(cpu["server"] / span, 2) if span else None,
            "server_cpu_ms_per_call": round(per_call, 2) if per_call else None,
            "moto_cpu_cores": round(cpu["moto"] / span, 2) if span and "moto" in cpu else None,
            "generator_cpu_cores": round(cpu["generator"] / span, 2) if span and "generator" in cpu else None,
            "generator_cpu_s": round(g["generator_cpu_s"], 1), "load_range": cpu["load"],
            "busiest_processes": cpu["others"]}


def audit(g: dict, status: dict, state, history: list) -> dict:
    """What became of every delivered round (lost must be 0, merged twice must be 0) and the repo's commits."""
    merged = set(state.merged_ids)
    refused = {r.submission_id for r in state.refused} | {r["submission_id"] for r in status["refusals"]}
    delivered = set(g["delivered"])
    lost = delivered - merged - refused - set(g["refused"]) - set(status["pending"])
    return {"outcomes": dict(sorted(g["outcomes"].items())), "delivered": len(delivered),
            "merged": len(delivered & merged), "refused": len(delivered & (refused | set(g["refused"]))),
            "pending_at_end": len(status["pending"]), "lost": len(lost),
            "duplicates_merged": len(state.merged_ids) - len(merged), "versions": state.version,
            "repo_commits": len(history) - 1,
            "merge_commits": sum(c.message.startswith("hubgrpo: version ") for c in history),
            "submission_commits": sum(c.message.startswith("hubgrpo: submission ") for c in history),
            "slow_calls": slow_near_merges(g, history)}


def served_within(runs: list[dict], mode: str, limit_ms: float = 100.0) -> int | None:
    """The largest fleet of ``mode`` whose lease, heartbeat and submit p99 were all within ``limit_ms``."""
    ok = [r["workers"] for r in runs if r["mode"] == mode and all(
        r["latency"][k].get("n") and r["latency"][k]["p99_ms"] <= limit_ms for k in ENDPOINTS)]
    return max(ok) if ok else None


def _cell(lat: dict) -> str:
    return f"{lat.get('p50_ms', '-')} / {lat.get('p99_ms', '-')} ms"


def _gc(r: dict) -> str:
    p, f = r.get("server_gc_pauses") or {}, r.get("fleet_gc_pauses") or {}
    return (f"{p['count']} ({p['max_ms']} ms)" if p else "-") + (f"; fleet {f['count']} ({f['max_ms']} ms)" if f else "")


def to_markdown(res: dict) -> str:
    a = res["args"]
    pins = (f"coordinator pinned to CPU {a['server_cpus']}, fleet and moto to CPU {a['load_cpus']}"
            if a.get("server_cpus") else "no CPU pinning")
    lines = ["# Coordinator under load", "",
             f"Open-loop fleet (one asyncio process, raw HTTP, route `{a['route']}`), {a['round_s']:.0f}-s rounds, "
             f"{a['beat_s']:.0f}-s heartbeats, quorum {a['quorum']} (merge.method ffa, prefolded), commit budget "
             f"{a['budget']}/hour, 1.75 MB adapters and honest rollouts checked on every submit; latencies over "
             f"{a['measure_s']:.0f} s after one round of warm-up; {pins}.", "",
             "| mode | workers | calls/s | lease p50 / p99 | heartbeat p50 / p99 | submit p50 / p99 | submit → "
             "verdict p50 / p99 | fleet loop lag p50 / p99 | server CPU (cores) | server CPU per call | fleet + moto CPU "
             "(cores) | GC pauses ≥ 10 ms (longest): server; fleet | load avg (min–max) | lost | merged twice | rounds on S3 | "
             "repo commits (merges; rounds) |", "|" + "---|" * 17]
    for r in res["runs"]:
        lat = r["latency"]
        cells = " | ".join(_cell(lat.get(k, {})) for k in (*ENDPOINTS, "submit_to_verdict", "loop_lag"))
        lo, hi = r["load_range"]
        fleet = f"{r.get('generator_cpu_cores', '-')} + {r['moto_cpu_cores'] or '-'}"
        lines.append(f"| {r['mode']} | {r['workers']} | {r['calls_per_s']} | {cells} | {r['server_cpu_cores']} | "
                     f"{r['server_cpu_ms_per_call']} ms | {fleet} | {_gc(r)} | {lo}–{hi} | {r['lost']} | "
                     f"{r['duplicates_merged']} | {r['rounds_on_s3']} | {r['repo_commits']} ({r['merge_commits']}; "
                     f"{r['submission_commits']}) |")
    lines += ["", "Largest fleet with every p99 ≤ 100 ms: " + ", ".join(
        f"{m}: {served_within(res['runs'], m) or 'none measured'}" for m in res["args"]["modes"]), "",
        "Server CPU per call in isolation (sequential calls, one client; before the first run):", ""]
    calib = res["runs"][0]["calibration"] if res["runs"] else {}
    lines += [f"- {k}: {v['cpu_ms']} ms CPU, {v['wall_ms']} ms wall" for k, v in calib.items()]
    lines += ["", "Outcomes per run, and the busiest processes on the machine mid-window (%CPU, elapsed, command):",
              ""]
    for r in res["runs"]:
        lines.append(f"- {r['mode']} × {r['workers']}: delivered {r['delivered']}, merged {r['merged']}, refused "
                     f"{r['refused']}, pending at end {r['pending_at_end']}, versions {r['versions']}; "
                     + ", ".join(f"{k} {v}" for k, v in r["outcomes"].items()))
        lines += [f"  - `{p}`" for p in r["busiest_processes"]]
    return "\n".join(lines) + "\n"


def headline(res: dict) -> str:
    """The largest fleet of each mode with every p99 within 100 ms."""
    return "largest fleet with lease, heartbeat and submit p99 ≤ 100 ms: " + ", ".join(
        f"{m} {served_within(res['runs'], m) or 'none measured'} workers" for m in res["args"]["modes"])


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", default="250,500,1000", help="fleet sizes of mode s3 (comma-separated)")
    ap.add_argument("--repo-workers", default="1000", help="fleet sizes of mode repo")
    ap.add_argument("--hub-workers", default="64", help="fleet sizes of mode hub")
    ap.add_argument("--modes", default="s3,repo", help="s3, repo (comma-separated), or hub alone")
    ap.add_argument("--round-s", type=float, default=60.0)
    ap.add_argument("--beat-s", type=float, default=30.0)
    ap.add_argument("--measure-s", type=float, default=60.0)
    ap.add_argument("--quorum", type=int, default=256, help="merge.quorum (1000 workers / 256 ≈ 4 merges a minute)")
    ap.add_argument("--budget", type=int, default=300, help="coordinator.commit_budget_per_hour (Hub-like)")
    ap.add_argument("--hub-quorum", type=int, default=16, help="mode hub: merge.quorum (64 / 16 = 4 merges a minute)")
    ap.add_argument("--hub-budget", type=int, default=60, help="mode hub: coordinator.commit_budget_per_hour")
    ap.add_argument("--commit-quota", type=int, default=128, help="mode hub: the emulator's commits per repo per "
                    "rolling hour (the Hub's)")
    common.options(ap, __file__)
    ap.add_argument("--name", default=None, help="file name of the results (NAME.md, NAME.json; default "
                    "coordinator_load, with --modes hub coordinator_load-hub)")
    ap.add_argument("--route", choices=("plain", "gradio"), default="plain",
                    help="the fleet calls /hubgrpo/api/<name> (plain) or Gradio's /gradio_api/run/<name>")
    ap.add_argument("--server-cpus", default=None, help="taskset CPU list for the coordinator (e.g. 0)")
    ap.add_argument("--load-cpus", default=None, help="taskset CPU list for the fleet and moto (e.g. 1)")
    args = ap.parse_args()
    if args.quick:  # a check of the script: a small fleet (on S3 unless --modes hub), short rounds and window
        args.modes = "s3" if args.modes == "s3,repo" else args.modes
        args.workers, args.hub_workers, args.round_s, args.beat_s, args.measure_s = "8", "4", 4.0, 2.0, 4.0
        args.quorum, args.hub_quorum = 4, 2
    args.modes = args.modes.split(",")
    if "hub" in args.modes and args.modes != ["hub"]:
        ap.error("--modes hub runs alone (its report is its own): run s3,repo and hub separately")
    args.name = args.name or ("coordinator_load-hub" if args.modes == ["hub"] else "coordinator_load")
    return args


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        return serve_forever(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    if len(sys.argv) > 1 and sys.argv[1] == "--generate":
        args = argparse.Namespace(**json.loads(sys.argv[2]))
        return generate(args, sys.argv[3], sys.argv[4], Path(sys.argv[5]), Path(sys.argv[6]), int(sys.argv[7]),
                        Path(sys.argv[8]))
    args = parse_args()
    if args.load_cpus:  # this driver (its /proc sampling, `ps` mid-window) stays off the coordinator's core too
        os.sched_setaffinity(0, cpu_set(args.load_cpus))
    tmp = Path(tempfile.mkdtemp(prefix="hubgrpo-load-"))
    meta = common.start(args.quick)
    args.results = common.results_dir(args, __file__)
    res = {"tree": str(ROOT), "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
           "runs": []}
    report, head = to_markdown, headline
    for mode in args.modes:
        sizes = {"s3": args.workers, "repo": args.repo_workers, "hub": args.hub_workers}[mode]
        for n in (int(x) for x in sizes.split(",")):
            print(f"{mode} × {n} …", flush=True)
            if mode == "hub":
                from benchmarks.load.load_hub import hub_run
                from benchmarks.load.load_hub_report import headline as head
                from benchmarks.load.load_hub_report import to_markdown as report
                res["runs"].append(hub_run(args, n, tmp / f"{mode}-{n}"))
            else:
                res["runs"].append(one_run(args, mode, n, tmp / f"{mode}-{n}"))
            print(json.dumps(res["runs"][-1]["latency"]), flush=True)
            common.write(args.results, args.name, res, report(res), meta, head(res))  # after every run
    print(report(res))


if __name__ == "__main__":
    main()
