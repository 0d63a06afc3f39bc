"""Embedded-run figures: wall time, reward at version 0 and at the last version, per-round time breakdown of the
workers, coordination overhead as a share of worker wall time, and commits per version.

    python benchmarks/round/run_breakdown.py                       # tiny model, 2 workers (about a minute)
    python benchmarks/round/run_breakdown.py --config configs/demo.yaml --eval 32   # the demo (minutes)
    python benchmarks/round/run_breakdown.py --quick   # the script checked: tiny, one version, 4 prompts

Writes results/run_breakdown-<config>.{md,json}. Overhead = the seconds of a worker's path that are not training
(``path_s``: lease + download, + upload + submit unless the worker delivers while it trains) / (those + train),
summed over all rounds of all workers; "train" includes model generation and optimisation.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.common import options, path_s, results_dir, start, write  # noqa: E402


def run_cli(config: Path, repo: Path, workers: int, overrides: list[str]) -> float:
    cmd = [sys.executable, "-m", "hubgrpo.cli", "run", str(config), "--workers", str(workers), "--repo", str(repo)]
    for o in overrides:
        cmd += ["--set", o]
    t0 = time.time()
    subprocess.run(cmd, check=True, cwd=ROOT)
    return time.time() - t0


def round_rows(cache: Path, since: float) -> list[dict]:
    rows = []
    for f in sorted((cache / "worker").glob("*/rounds.jsonl")):
        for line in f.read_text().splitlines():
            r = json.loads(line)
            if r["at"] >= since:
                rows.append(r)
    return rows


def breakdown(rows: list[dict]) -> dict:
    keys = ("lease_s", "download_s", "train_s", "upload_s", "submit_s")
    total = {k: sum(r.get(k, 0.0) for r in rows) for k in keys}
    coord = sum(path_s(r) for r in rows)
    wall = coord + total["train_s"]
    return {"rounds": len(rows), "pipelined": sum(1 for r in rows if r.get("pipelined")),
            "per_round_median_s": {k: statistics.median([r.get(k, 0.0) for r in rows]) for k in keys} if rows else {},
            "totals_s": total, "worker_wall_s": wall, "overhead_fraction": coord / wall if wall else None}


def evaluate(repo: Path, n: int) -> dict:
    from hubgrpo import runrepo
    from hubgrpo.worker.engine import RoundEngine
    from hubgrpo.store.local import LocalStore

    store = LocalStore(repo)
    cfg = runrepo.read_config(store)
    shas = runrepo.version_shas(store)
    engine = RoundEngine(cfg, worker="eval")
    last = max(shas)
    out = {}
    for v in (0, last):
        out[v] = engine.evaluate(runrepo.adapter_at(store, shas[v], repo.parent / "eval-cache"), n=n)
    return out


def commits_per_version(repo: Path) -> float:
    from hubgrpo import runrepo
    from hubgrpo.store.local import LocalStore

    store = LocalStore(repo)
    return len(store.history()) / max(1, runrepo.read_state(store).version)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=str(ROOT / "configs" / "tiny.yaml"))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--eval", type=int, default=32, help="held-out prompts for the greedy eval at v0 and last")
    ap.add_argument("--set", action="append", default=[], help="config overrides")
    options(ap, __file__)
    args = ap.parse_args()
    if args.quick:
        args.config, args.eval, args.set = str(ROOT / "configs" / "tiny.yaml"), 4, [*args.set, "rounds.versions=1"]
    meta = start(args.quick)
    out = results_dir(args, __file__)
    tmp = Path(tempfile.mkdtemp(prefix="hubgrpo-bench-"))
    cache = tmp / "cache"
    os.environ["HUBGRPO_CACHE"] = str(cache)
    shared_models = Path.home() / ".cache" / "hubgrpo" / "models"
    if shared_models.exists():  # reuse converted models (SmolLM2) instead of converting again
        (cache).mkdir(parents=True, exist_ok=True)
        os.symlink(shared_models, cache / "models")
    repo = tmp / "run"
    since = time.time()
    wall = run_cli(Path(args.config), repo, args.workers, args.set)
    from hubgrpo import runrepo
    from hubgrpo.store.local import LocalStore

    state = runrepo.read_state(LocalStore(repo))
    result = {
        "config": str(Path(args.config).resolve().relative_to(ROOT)) if Path(args.config).resolve().is_relative_to(
            ROOT) else args.config, "workers": args.workers, "overrides": args.set, "wall_s": wall,
        "versions": state.version, "reward_per_version": [v.reward_mean for v in state.versions],
        "eval_reward": evaluate(repo, args.eval) if args.eval else None,
        "commits_per_version": commits_per_version(repo), "breakdown": breakdown(round_rows(cache, since)),
    }
    b = result["breakdown"]
    write(out, f"run_breakdown-{Path(args.config).stem}", result, to_markdown(result), meta,
          f"{result['versions']} versions in {wall:.0f} s; coordination overhead "
          f"{100 * (b['overhead_fraction'] or 0):.2f} % of worker wall time ({result['config']})")
    shutil.rmtree(tmp, ignore_errors=True)


def to_markdown(r: dict) -> str:
    b = r["breakdown"]
    med = b["per_round_median_s"]
    lines = [f"# Embedded run: {r['config']} ({r['workers']} workers)", "",
             f"- wall time {r['wall_s']:.0f} s for {r['versions']} versions; commits per version "
             f"{r['commits_per_version']:.2f}",
             f"- greedy eval reward (held-out): {r['eval_reward']}",
             "- training reward of merged rounds per version: "
             + ", ".join("-" if x is None else f"{x:.3f}" for x in r["reward_per_version"]),
             f"- rounds {b['rounds']}; coordination overhead {100 * (b['overhead_fraction'] or 0):.2f} % of "
             "worker wall time", "", "| per round (median) | seconds |", "|---|---:|"]
    lines += [f"| {k[:-2]} | {v:.3f} |" for k, v in med.items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
