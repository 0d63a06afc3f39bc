"""Soak run: a long run on the Hub emulator with the evaluator on, and what it leaves on disks and in the repo.

    python benchmarks/soak/soak.py [--versions 200] [--workers 4] [--checkpoints 50 200]
    python benchmarks/soak/soak.py --eval-speed --config configs/demo.yaml --repo runs/smollm2-addition
    python benchmarks/soak/soak.py --quick   # the script checked: 3 versions, one worker

The soak: the Hub emulator (in this process, real HTTP) holds the run repo; ``hubgrpo coordinator``, N
``hubgrpo worker`` processes and one ``hubgrpo evaluate`` process each run with their own HF cache (``HF_HOME``)
and hubgrpo cache (``HUBGRPO_CACHE``), so each one's disk use is measured apart. At each checkpoint version it
records the repo's head size, its history size (the emulator's storage model: regular objects any ref reaches +
LFS objects stored) and commits, the coordinator's, each worker's and the evaluator's disk use, and how many
versions have a held-out score. At the end it waits for the evaluator to score every version, checks state.json,
then runs ``hubgrpo gc --keep 5 --yes --force`` and measures the history again. The evaluator's seconds per version come
from its log.

``--eval-speed`` times ``Evaluator.score`` (download + greedy generation + rewards) for every version of an
existing run repo, with nothing else running (e.g. the README demo's repo, SmolLM2 with configs/demo.yaml).

Writes ``results/<name>.{md,json}``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks import common  # noqa: E402

common.local_hub()

TOKEN = "hf_test_alice_token"
_EVAL_LINE = re.compile(r"version (\d+): held-out reward ([-\d.]+) on (\d+) prompts \(([\d.]+) s\)")


def du(path: Path) -> int:
    """Bytes of the regular files under ``path`` (hard links counted once)."""
    seen, total = set(), 0
    for p in path.rglob("*") if path.exists() else []:
        try:
            st = p.lstat()
        except FileNotFoundError:
            continue
        if p.is_file() and not p.is_symlink() and (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            total += st.st_size
    return total


def spawn(args: list[str], home: Path, env: dict, log: Path) -> subprocess.Popen:
    """A ``hubgrpo`` command with its own caches under ``home``."""
    env = dict(env, HF_HOME=str(home / "hf"), HUBGRPO_CACHE=str(home / "cache"), OMP_NUM_THREADS="1",
               MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "hubgrpo.cli", *args], env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)


def snapshot(emu, repo_id: str, homes: dict[str, Path], status: dict) -> dict:
    from tests.support.hub_emulator_storage import usage

    repo = usage(emu.state, emu.state.repos[("model", repo_id)])
    scored = sum(v.get("eval_reward") is not None for v in status["versions"])
    return {"version": status["version"], "at": time.time(), "repo_head_bytes": repo["head"],
            "repo_history_bytes": repo["total"], "repo_lfs_bytes": repo["lfs"], "repo_commits": repo["commits"],
            "disk_bytes": {name: du(home) for name, home in homes.items()}, "versions_scored": scored}


def start(args, work: Path, emu) -> tuple[dict, dict, str, dict]:
    """``hubgrpo init``, then the coordinator, the workers and the evaluator, each with its own caches."""
    from hubgrpo.config import load_config, to_yaml
    from hubgrpo.space.api import free_port

    env = dict(os.environ, HF_ENDPOINT=emu.url, HF_TOKEN=TOKEN, HUBGRPO_SECRET="soak-secret")
    overrides = [f"rounds.versions={args.versions}", "merge.quorum=1", f"rounds.steps={args.steps}",
                 "coordinator.commit_budget_per_hour=128", "coordinator.refusal_flush_s=5",
                 "coordinator.heartbeat_interval_s=5", *args.set]
    (work / "config.yaml").write_text(to_yaml(load_config(ROOT / args.config, overrides=overrides), drop_secrets=True))
    homes = {name: work / name for name in ["coordinator", "evaluator"] + [f"worker{i}" for i in range(args.workers)]}
    models = Path(os.environ.get("HUBGRPO_CACHE") or Path.home() / ".cache" / "hubgrpo") / "models"
    for home in homes.values():
        (home / "cache").mkdir(parents=True, exist_ok=True)
        if not (home / "cache" / "models").exists() and models.exists():
            (home / "cache" / "models").symlink_to(models)  # the built tiny model: shared, not counted
    repo = "alice/soak"
    subprocess.run([sys.executable, "-m", "hubgrpo.cli", "init", str(work / "config.yaml"), "--repo", repo],
                   env=dict(env, HUBGRPO_CACHE=str(homes["coordinator"] / "cache")), check=True, timeout=300,
                   capture_output=True)
    url = f"http://127.0.0.1:{free_port()}"
    procs = {"coordinator": spawn(["coordinator", "--repo", repo, "--port", url.rsplit(":", 1)[1], "--quiet"],
                                  homes["coordinator"], env, work / "coordinator.log")}
    for i in range(args.workers):
        procs[f"worker{i}"] = spawn(["worker", "--repo", repo, "--coordinator", url, "--name", f"w{i}",
                                     "--threads", "1", "--quiet"], homes[f"worker{i}"], env, work / f"worker{i}.log")
    procs["evaluator"] = spawn(["evaluate", "--repo", repo, "--coordinator", url, "--samples", str(args.samples),
                                "--threads", "1"], homes["evaluator"], env, work / "evaluator.log")
    return procs, homes, url, env


def watch(args, emu, procs: dict, homes: dict, client) -> dict:
    """Snapshots at the checkpoint versions, until the run is finished and the evaluator has exited."""
    t0, checkpoints, out = time.time(), sorted(args.checkpoints), {"checkpoints": []}
    status = client.status()
    while not (status["finished"] and procs["evaluator"].poll() is not None):
        time.sleep(2.0)
        status = client.status()
        while checkpoints and status["version"] >= checkpoints[0]:
            checkpoints.pop(0)
            out["checkpoints"].append(snapshot(emu, "alice/soak", homes, status))
            print(json.dumps(out["checkpoints"][-1]), flush=True)
        if time.time() - t0 > args.timeout:
            raise TimeoutError(f"the soak did not finish within {args.timeout} s (version {status['version']})")
    out["wall_s"] = time.time() - t0
    time.sleep(8)  # the coordinator flushes the last held-out scores after refusal_flush_s
    out["final"] = snapshot(emu, "alice/soak", homes, client.status())
    return out


def soak(args) -> dict:
    from hubgrpo import runrepo
    from hubgrpo.store.hub import HubStore
    from hubgrpo.worker.client import CoordinatorClient
    from tests.support.hub_emulator import HubEmulator

    work = Path(args.workdir).absolute()
    work.mkdir(parents=True, exist_ok=True)
    emu = HubEmulator(users={TOKEN: "alice"}).start()
    procs, homes, url, env = start(args, work, emu)
    try:
        client = CoordinatorClient(url, retries=30, backoff=0.5)  # waits until the coordinator answers
        out = watch(args, emu, procs, homes, client)
        status = client.status()
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.terminate()
        for p in procs.values():
            p.wait(timeout=60)
    state = runrepo.read_state(HubStore("alice/soak", token=TOKEN, endpoint=emu.url, cache_dir=work / "check-hf"))
    out.update(state_versions=len(state.versions), refused=[r.code for r in state.refused],
               state_versions_scored=sum(v.eval_reward is not None for v in state.versions),
               held_out={v.version: v.eval_reward for v in state.versions},
               training={v.version: v.reward_mean for v in state.versions})
    # --force: every process of the run was stopped above (gc refuses a repo written to within 2 round timeouts)
    gc = subprocess.run([sys.executable, "-m", "hubgrpo.cli", "gc", "--repo", "alice/soak", "--keep", "5", "--yes",
                         "--force"],
                        env=env, capture_output=True, text=True, timeout=600)
    out["gc"] = {"rc": gc.returncode, "output": gc.stdout.strip()[-500:] + gc.stderr.strip()[-500:],
                 "after": snapshot(emu, "alice/soak", {}, status)}
    out["eval_seconds"] = [float(m.group(4)) for m in _EVAL_LINE.finditer((work / "evaluator.log").read_text())]
    emu.stop()
    return out


def eval_speed(args) -> dict:
    """Seconds per version of ``Evaluator.score`` over every version of an existing run repo."""
    import torch

    from hubgrpo import runrepo
    from hubgrpo.store import open_store
    from hubgrpo.worker.evaluator import Evaluator

    store = open_store(args.repo)
    ev = Evaluator(store, client=None, samples=args.samples, threads=args.threads,
                   workdir=Path(args.workdir) / "eval-speed")
    shas = runrepo.version_shas(store)
    ev.ready()  # the engine is built once, before the clock starts
    t = time.perf_counter()
    ev.score(min(shas), shas[min(shas)])  # the first generate call pays one-time initialisation: timed apart
    warmup = time.perf_counter() - t
    rows = []
    for v in sorted(shas):
        times = []
        for _ in range(args.repeat):
            t = time.perf_counter()
            reward, n = ev.score(v, shas[v])
            times.append(time.perf_counter() - t)
        rows.append({"version": v, "eval_reward": reward, "samples": n, "seconds": statistics.median(times),
                     "seconds_min": min(times)})
        print(json.dumps(rows[-1]), flush=True)
    return {"repo": args.repo, "config": ev.cfg.base_model, "threads": torch.get_num_threads(), "rows": rows,
            "engine_setup_s": getattr(ev.engine, "setup_seconds", None), "first_call_s": warmup}


def report_soak(res: dict, args) -> str:
    gib = 1 << 20
    lines = [f"# Soak: {args.versions} versions, {args.workers} workers, evaluator on",
             "", f"Config `{args.config}` with quorum 1, {args.steps} steps per round; Hub emulator; "
             f"wall {res.get('wall_s', 0):.0f} s.", "",
             f"- versions in state.json: {res['state_versions']}, with a held-out score: {res['state_versions_scored']}",
             f"- refusals: {len(res['refused'])} ({', '.join(sorted(set(res['refused']))) or 'none'})",
             f"- evaluator: {len(res['eval_seconds'])} versions scored, "
             f"{sum(res['eval_seconds']) / max(1, len(res['eval_seconds'])):.2f} s per version (mean, while "
             f"{args.workers} workers trained on the same {os.cpu_count()} cores)", "",
             "| at version | repo head MiB | repo history MiB (LFS MiB) | commits | coordinator MiB | workers MiB (max) "
             "| evaluator MiB | versions scored |", "|---|---|---|---|---|---|---|---|"]
    for c in res["checkpoints"] + [res["final"]]:
        d = c["disk_bytes"]
        workers = [v for k, v in d.items() if k.startswith("worker")]
        lines.append(f"| {c['version']} | {c['repo_head_bytes'] / gib:.2f} | {c['repo_history_bytes'] / gib:.1f} "
                     f"({c['repo_lfs_bytes'] / gib:.1f}) | {c['repo_commits']} | {d['coordinator'] / gib:.2f} | "
                     f"{max(workers) / gib:.2f} | {d['evaluator'] / gib:.2f} | {c['versions_scored']} |")
    a = res["gc"]["after"]
    lines += ["", f"After `hubgrpo gc --keep 5 --yes --force` (rc {res['gc']['rc']}): history {a['repo_history_bytes'] / gib:.2f} "
              f"MiB ({a['repo_lfs_bytes'] / gib:.2f} MiB LFS), {a['repo_commits']} commits, head "
              f"{a['repo_head_bytes'] / gib:.2f} MiB.", "",
              "Disk use excludes the shared built model (`models/`, symlinked). Repo sizes follow the emulator's "
              "storage model (regular objects a ref reaches + LFS objects stored until deleted for good)."]
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default="configs/tiny.yaml")
    p.add_argument("--versions", type=int, default=200)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--samples", type=int, default=16)
    p.add_argument("--checkpoints", type=int, nargs="*", default=[50, 200])
    p.add_argument("--set", action="append", default=[])
    p.add_argument("--timeout", type=float, default=7200)
    p.add_argument("--workdir", default="/tmp/hubgrpo-soak")
    p.add_argument("--eval-speed", action="store_true")
    p.add_argument("--repo", default=None)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3, help="--eval-speed: timings per version (the median is shown)")
    p.add_argument("--name", default=None)
    common.options(p, __file__)
    args = p.parse_args()
    out = common.results_dir(args, __file__)
    if args.quick:  # a check of the script: a short soak (the evaluator, gc and every measurement included)
        args.versions, args.workers, args.checkpoints, args.samples = 3, 1, [2], 4
        args.set = [*args.set, "coordinator.checkpoint_every_s=2"]  # the scores reach the repo without waiting
        args.workdir = str(out / "work")
    meta = common.start(args.quick)
    if args.eval_speed:
        res = eval_speed(args)
        name = args.name or "eval-speed"
        secs = [r["seconds"] for r in res["rows"]]
        head = f"evaluator: {statistics.median(secs):.2f} s per version ({res['config']})"
        md = (f"# Evaluator seconds per version: {res['config']}\n\n"
              f"{res['threads']} torch threads; {args.samples} held-out prompts, greedy; repo "
              f"`{args.repo}`; median (min) of {args.repeat} timings per version.\n\n"
              "| version | held-out reward | seconds | min |\n|---|---|---|---|\n"
              + "".join(f"| {r['version']} | {r['eval_reward']:.3f} | {r['seconds']:.2f} | {r['seconds_min']:.2f} |\n"
                        for r in res["rows"])
              + f"\nmedian {statistics.median(secs):.2f} s per version (download + greedy generation + rewards). Once "
              f"per process: the engine's setup {res['engine_setup_s'] or 0:.1f} s and the first generate call "
              f"{res['first_call_s']:.1f} s (one-time initialisation).\n")
    else:
        res = soak(args)
        name = args.name or "soak"
        md = report_soak(res, args)
        mib = 1 << 20
        head = (f"{res['final']['version']} versions: repo head {res['final']['repo_head_bytes'] / mib:.2f} MiB, "
                f"history {res['final']['repo_history_bytes'] / mib:.1f} MiB, after gc "
                f"{res['gc']['after']['repo_history_bytes'] / mib:.1f} MiB")
    common.write(out, name, res, md, meta, head)
    print(md)


if __name__ == "__main__":
    main()
