"""Mode ``hub`` of ``coordinator_load.py``: a Hub-only run (no S3) under the Hub's commit quota.

Three processes besides the driver: the Hub emulator (``tests/support/hub_emulator.py``) with its per-repo commit quota on
(``--commit-quota``, 128 commits per rolling hour: the Hub's), the coordinator app on a run repo there
(``hub.submissions: coordinator``: rounds go through its upload route into a folder on its disk; versions are served
by its adapter route; the repo gets checkpoints), and the open-loop fleet (``load_fleet.py``, mode ``hub``). The
run's config is what ``hubgrpo init`` makes of it on the Hub (``config.quota.fit_hub_quota``: the budget
``--hub-budget``, 60 by default, and a checkpoint at most every 7200/budget s).

Counted at the emulator (its own counters, sampled every 5 s into a file by its process): commits applied and
429s of the quota; from the repo's history: commits by kind (checkpoints, anything else) inside the measurement
window, as commits an hour. Every minute the driver records the machine's load average and the coordinator's
``status`` (version, checkpoint, pending).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

REPO_ID = "load/run"
TOKEN = "hf_test_load_token"  # the emulator's test user (travels only in HF_TOKEN, to loopback)


def emulate(port: int, quota: int, stats: Path) -> None:
    """``--emulate``: the Hub emulator in this process with the commit quota on; its counters appended to ``stats``
    (one JSON line every 5 s and at the end) until SIGTERM."""
    from tests.support.hub_emulator import HubEmulator

    emu = HubEmulator({os.environ["HF_TOKEN"]: "load"}, port=port)
    emu.set_commit_quota(quota)
    emu.start()
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    while not done.wait(5.0):
        with stats.open("a") as f:
            f.write(json.dumps({"t": time.time(), **emu.stats}) + "\n")
    emu.stop()


def hub_config(args):
    """The run's config as ``hubgrpo init`` fits it to the quota; (config, the changes init would make)."""
    from benchmarks.load.coordinator_load import RANK

    from hubgrpo.config import loads
    from hubgrpo.config.quota import fit_hub_quota

    cfg = loads("base_model: builtin:tiny\nproject_name: load\n"
                "params: {per_device_train_batch_size: 4, num_generations: 2, learning_rate: 0.1}\n"
                "rounds: {steps: 2, versions: 100000, lr_schedule: constant, reset_optimizer: true}\n"
                f"lora: {{r: {RANK}, alpha: {2 * RANK}, target_modules: [q_proj, v_proj]}}\n"
                f"merge: {{method: ffa, quorum: {args.hub_quorum}, max_staleness: 8, max_norm_factor: null,"
                " rebase: false, staleness_per_worker: 0}\n"
                f"coordinator: {{commit_budget_per_hour: {args.hub_budget}, lease_timeout_s: {3 * args.round_s},"
                f" heartbeat_interval_s: {args.beat_s}, round_timeout_s: {args.round_s},"
                f" max_leases_per_user: 100000, lease_waits_for_merge_s: 0}}\n"
                "hub: {submissions: coordinator}\n")
    fit = fit_hub_quota(cfg, args.commit_quota)
    return fit.config, fit.changes


def start_hub_stack(args, tmp: Path, procs: list) -> tuple:
    """The emulator, the run repo on it and the coordinator process; (url, server pid, emulator pid, store spec,
    the round adapter, the config's changes at init)."""
    import socket

    import httpx

    from benchmarks.load.coordinator_load import make_adapter, pinned, start, wait_up
    from hubgrpo.coordinator.repo_init import init_repo
    from hubgrpo.space.api import free_port
    from hubgrpo.store.hub import HubStore

    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_ENDPOINT=f"http://127.0.0.1:{port}", HF_TOKEN=TOKEN,
               HUBGRPO_CACHE=str(tmp / "cache"), HF_HUB_DISABLE_TELEMETRY="1", HF_HOME=str(tmp / "hf"))
    os.environ.update({k: env[k] for k in ("HF_ENDPOINT", "HF_TOKEN", "HF_HUB_DISABLE_TELEMETRY", "HF_HOME")})
    procs.append(start([*pinned(args.load_cpus), sys.executable, __file__, "--emulate", str(port),
                        str(args.commit_quota), str(tmp / "hub_stats.jsonl")], tmp / "hub.log", env))
    emu = procs[-1].pid
    wait_up(lambda: socket.create_connection(("127.0.0.1", port), timeout=1).close() or True, "the Hub emulator")
    cfg, changes = hub_config(args)
    init_repo(HubStore(REPO_ID), cfg, make_adapter(tmp / "v0", 0, 0.0))
    variant = make_adapter(tmp / "variant", 7, 0.01)
    cport = free_port()
    procs.append(start([*pinned(args.server_cpus), sys.executable, str(Path(__file__).resolve().parent / "coordinator_load.py"),
                        "--serve", f"hub:{REPO_ID}", str(cport), str(tmp / "coord")], tmp / "coordinator.log", env))
    url = f"http://127.0.0.1:{cport}"
    wait_up(lambda: httpx.post(f"{url}/hubgrpo/api/status", json={"data": [None]}).status_code == 200,
            "the coordinator", timeout=300)
    return url, procs[-1].pid, emu, f"hub:{REPO_ID}", variant, changes


def status(url: str) -> dict:
    import httpx

    return httpx.post(f"{url}/hubgrpo/api/status", json={"data": [None]}, timeout=60).json()["result"]


def minute_probe(url: str, stats: Path):
    """What the driver records every minute: the machine's load average, the coordinator's version, checkpoint
    and pending rounds, the emulator's counters."""
    def probe() -> dict:
        out = {"t": round(time.time(), 1), "loadavg": [round(x, 2) for x in os.getloadavg()]}
        try:
            st = status(url)
            out.update(version=st["version"], checkpoint=(st.get("checkpoint") or {}).get("version"),
                       pending=len(st["pending"]))
        except Exception as e:  # deliberate: a probe that failed is recorded, the run goes on
            out["status_error"] = f"{type(e).__name__}: {e}"[:200]
        out["hub"] = last_stats(stats)
        return out
    return probe


def last_stats(stats: Path) -> dict:
    lines = stats.read_text().splitlines() if stats.is_file() else []
    return json.loads(lines[-1]) if lines else {}


def stats_at(stats: Path, t: float) -> dict:
    """The emulator's counters at the last sample not after ``t`` (the first one if none)."""
    rows = [json.loads(line) for line in stats.read_text().splitlines()] if stats.is_file() else []
    before = [r for r in rows if r["t"] <= t]
    return (before or rows or [{}])[-1] if before else (rows[0] if rows else {})


def settle_hub(url: str, interval_s: float, wait_s: float) -> tuple[dict, object, list]:
    """Wait (bounded) until nothing is pending and the last checkpoint holds the live version; the final status,
    the repo's state.json and history."""
    from hubgrpo import runrepo
    from hubgrpo.store.hub import HubStore

    got, end = status(url), time.time() + wait_s
    while got["pending"] and time.time() < end:
        time.sleep(2.0)
        got = status(url)
    end = time.time() + interval_s + 60
    while (got.get("checkpoint") or {}).get("version") != got["version"] and time.time() < end:
        time.sleep(5.0)
        got = status(url)
    store = HubStore(REPO_ID)
    return got, runrepo.read_state(store), store.history()


def commits(history: list, window: tuple[float, float], stats: Path) -> dict:
    """The run repo's commits by kind, in all and inside the window (and as commits an hour); the emulator's
    counters at the window's ends and at the end."""
    w0, w1 = window
    hours = (w1 - w0) / 3600

    def kind(message: str) -> str:
        return "checkpoint" if message.startswith("hubgrpo: version ") else "other"

    inside = [c for c in history if w0 <= c.created_at <= w1]
    by_kind = {k: sum(kind(c.message) == k for c in inside) for k in ("checkpoint", "other")}
    a, b, last = stats_at(stats, w0), stats_at(stats, w1), last_stats(stats)
    return {"all": len(history), "in_window": len(inside), "in_window_by_kind": by_kind,
            "per_hour": round(len(inside) / hours, 1) if hours else None,
            "per_hour_by_kind": {k: round(v / hours, 1) for k, v in by_kind.items()} if hours else {},
            "other_messages": sorted({c.message[:80] for c in history if kind(c.message) == "other"})[:10],
            "emulator_applied_in_window": b.get("commits_applied", 0) - a.get("commits_applied", 0),
            "emulator_at_end": last}


def hub_run(args, workers: int, tmp: Path) -> dict:
    """A fresh emulator, run repo and coordinator, the fleet for warm-up + measurement, then the accounting."""
    from benchmarks.load.coordinator_load import account, audit, drive
    from benchmarks.load.load_stats import calibrate

    tmp.mkdir(parents=True)
    procs: list = []
    stats = tmp / "hub_stats.jsonl"
    try:
        url, server, emu, spec, variant, changes = start_hub_stack(args, tmp, procs)
        calib = calibrate(url, server)
        g, cpu = drive(args, "hub", workers, tmp, url, spec, variant, {"server": server, "hub": emu}, procs,
                       probe=minute_probe(url, stats))
        interval = hub_config(args)[0].coordinator.checkpoint_interval_s
        st, state, history = settle_hub(url, interval, 2 * args.round_s)
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.kill()
                p.wait(30)
    from benchmarks.load.load_stats import pauses_in

    span = cpu["span_s"]
    out = {"mode": "hub", "workers": workers, "calibration": calib, "init_changes": changes,
           "checkpoint_interval_s": interval, **account(g, cpu),
           "hub_cpu_cores": round(cpu["hub"] / span, 2) if span else None,
           "server_gc_pauses": pauses_in(tmp / "gc_pauses.txt", tuple(g["window"])),
           "fleet_gc_pauses": pauses_in(tmp / "fleet_gc_pauses.txt", tuple(g["window"])),
           **audit(g, st, state, history), "commits": commits(history, tuple(g["window"]), stats),
           "per_minute": cpu["minutes"], "bytes": g.get("bytes", {}), "window": g["window"],
           "refusals_at_coordinator": _refusal_codes(st, state), "final_status_version": st["version"],
           "final_checkpoint": st.get("checkpoint")}
    out["rounds"] = derived(out)
    return out


def _refusal_codes(st: dict, state) -> dict:
    import collections

    seen = {r.submission_id: r.code for r in state.refused}
    seen.update({r["submission_id"]: r.get("code") for r in st["refusals"]})
    return dict(collections.Counter(str(v)[:40] for v in seen.values()))


def derived(r: dict) -> dict:
    """Rounds, bytes and the coordinator's CPU per round in the window."""
    w0, w1 = r["window"]
    uploads = r["latency"].get("upload", {}).get("n", 0)
    per_s = uploads / (w1 - w0) if w1 > w0 else 0
    cores = r["server_cpu_cores"] or 0
    return {"uploads_in_window": uploads, "uploads_per_s": round(per_s, 3),
            "server_cpu_s_per_round": round(cores / per_s, 3) if per_s else None,
            "mb_up_per_s": round(r["bytes"].get("up", 0) / 1e6 / (w1 - w0), 2),
            "mb_down_per_s": round(r["bytes"].get("down", 0) / 1e6 / (w1 - w0), 2)}


def main() -> None:
    if sys.argv[1] == "--emulate":
        emulate(int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]))


if __name__ == "__main__":
    main()
