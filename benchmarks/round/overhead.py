"""Coordination overhead per round: where a worker's wall time goes (lease, download, train, upload, submit) and
how many bytes it moves per round, with the run repo as a local directory and on the Hub emulator at 0 and 20 ms
of commit latency. Tiny model, ``hubgrpo run`` with 2 workers (each writes ``rounds.jsonl`` in its workdir).

    python benchmarks/round/overhead.py [--workers 2] [--versions 3] [--latency-ms 0 20]
    python benchmarks/round/overhead.py --config configs/demo.yaml --steps-per-round 5 --versions 2 \
        --name overhead-demo      # SmolLM2-135M rounds (~1 min each on 2 CPU cores): the realistic share
    python benchmarks/round/overhead.py --quick   # the script checked: one version, the local folder only

Overhead = the seconds of a worker's path that are not training / (those + training), summed over all rounds of
all workers (``run_breakdown.path_s``: lease + download, + upload + submit unless the worker delivers a round while
it trains the next, as ``hubgrpo worker`` does by default). Bytes: upload = the submission folder a worker commits;
download = the global adapter, fetched once per new base version (cached by sha), so per round it is
adapter size × distinct base versions / rounds. Writes ``results/overhead.{md,json}``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.common import local_hub, options, results_dir, start, write  # noqa: E402
from benchmarks.round.run_breakdown import breakdown, round_rows  # noqa: E402

local_hub()

TOKEN = "hf_test_alice_token"


def run_once(name: str, repo: str, workdir: Path, args, env_extra: dict) -> tuple[float, Path]:
    """``hubgrpo run`` in a subprocess with its own cache; returns (wall seconds, cache folder)."""
    from hubgrpo.runrepo import cache_root as cache_dir

    cache = workdir / f"cache-{name}"
    cache.mkdir(parents=True, exist_ok=True)
    if not (cache / "models").exists():  # share the built models (SmolLM2 is converted once), not the worker logs
        (cache_dir() / "models").mkdir(parents=True, exist_ok=True)
        (cache / "models").symlink_to(cache_dir() / "models")
    env = dict(os.environ, HUBGRPO_CACHE=str(cache), HF_HOME=str(workdir / f"hf-{name}"), **env_extra)
    cmd = [sys.executable, "-m", "hubgrpo.cli", "run", str(ROOT / args.config), "--workers",
           str(args.workers), "--repo", repo, "--set", f"rounds.steps={args.steps_per_round}", "--set",
           f"rounds.versions={args.versions}", *(["--set", f"merge.quorum={args.quorum}"] if args.quorum else []),
           "--set", "coordinator.heartbeat_interval_s=2", *[x for o in args.set for x in ("--set", o)],
           "--set", f"project_name=overhead-{name}"]
    t0 = time.time()
    with open(workdir / f"{name}.log", "wb") as log:
        subprocess.run(cmd, env=env, cwd=workdir, stdout=log, stderr=subprocess.STDOUT, check=True,
                       timeout=args.timeout)
    return time.time() - t0, cache


def bytes_moved(store, rows: list[dict]) -> dict:
    """Upload and download bytes per round (see the module docstring) and the adapter's size."""
    from hubgrpo import layout, runrepo

    head = store.head()
    adapter = sum(len(store.read(f, head)) for f in layout.ADAPTER_FILES)
    sizes, bases = {}, {}
    for path in store.list_files(layout.SUBMISSIONS, head):
        parsed = layout.parse_submission_path(path)
        if parsed:
            sizes[parsed[1]] = sizes.get(parsed[1], 0) + len(store.read(path, head))
            bases[parsed[1]] = parsed[0]
    mine = [r for r in rows if r.get("submission_id") in sizes]
    downloads = {(r["worker"], bases[r["submission_id"]]) for r in mine}
    n = max(1, len(mine))
    return {"adapter_bytes": adapter, "upload_bytes_per_round": sum(sizes[r["submission_id"]] for r in mine) / n,
            "download_bytes_per_round": adapter * len(downloads) / n, "rounds_counted": len(mine),
            "versions": runrepo.read_state(store).version}


def local_case(workdir: Path, args) -> dict:
    from hubgrpo.store.local import LocalStore

    repo = workdir / "run-local"
    since = time.time()
    wall, cache = run_once("local", str(repo), workdir, args, {})
    rows = round_rows(cache, since)
    return {"store": "local directory", "wall_s": round(wall, 1), **breakdown(rows),
            **bytes_moved(LocalStore(repo), rows)}


def hub_case(workdir: Path, args, latency_ms: float) -> dict:
    from hubgrpo.store.hub import HubStore
    from tests.support.hub_emulator import HubEmulator

    name = f"hub{int(latency_ms)}ms"
    emu = HubEmulator(users={TOKEN: "alice"}, latency_s=latency_ms / 1000).start()
    try:
        since = time.time()
        wall, cache = run_once(name, f"alice/{name}", workdir, args, {"HF_ENDPOINT": emu.url, "HF_TOKEN": TOKEN})
        rows = round_rows(cache, since)
        store = HubStore(f"alice/{name}", token=TOKEN, endpoint=emu.url, cache_dir=workdir / "hf-read")
        moved = bytes_moved(store, rows)
        requests = emu.stats["requests"]
    finally:
        emu.stop()
    return {"store": f"Hub emulator, {latency_ms:g} ms commit latency", "wall_s": round(wall, 1),
            "hub_requests": requests, **breakdown(rows), **moved}


def to_markdown(r: dict) -> str:
    lines = ["# Coordination overhead per round", "",
             f"`{r['config']}`, steps_per_round {r['steps_per_round']}, quorum {r.get('quorum') or 'as configured'}, "
             f"{'; ' + ', '.join(r['overrides']) if r.get('overrides') else ''}; `hubgrpo run` with {r['workers']} "
             f"workers, {r['versions']} versions. On a shared machine train times (and with them the overhead "
             "share) are noisy.", "",
             "| store | rounds | lease | download | train | upload | submit | round wall | overhead | "
             "adapter | up / round | down / round | run wall |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in r["cases"]:
        m = c["per_round_median_s"]
        wall = m.get("lease_s", 0) + sum(m.get(k, 0) for k in ("download_s", "train_s", "upload_s", "submit_s"))
        lines.append(f"| {c['store']} | {c['rounds']} | {m['lease_s']:.3f} | {m['download_s']:.3f} | "
                     f"{m['train_s']:.2f} | {m['upload_s']:.3f} | {m['submit_s']:.3f} | {wall:.2f} | "
                     f"{100 * (c['overhead_fraction'] or 0):.1f} % | {c['adapter_bytes'] / 1024:.0f} KiB | "
                     f"{c['upload_bytes_per_round'] / 1024:.0f} KiB | {c['download_bytes_per_round'] / 1024:.0f} KiB | "
                     f"{c['wall_s']} s |")
    lines += ["", "Per-round columns are medians in seconds; overhead = the seconds on a worker's path that are not "
              "training (lease + download, + upload + submit unless pipelined) / those + training, summed over all "
              "rounds; pipelined rounds: " + ", ".join(str(c.get("pipelined", 0)) for c in r["cases"]) + ". "
              "Download per round counts one fetch of the global adapter per new base version per worker (the "
              "cache is keyed by sha); the coordinator also downloads each submission "
              "once (≈ the upload figure) for admission.", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--versions", type=int, default=3)
    ap.add_argument("--latency-ms", type=float, nargs="*", default=[0.0, 20.0])
    ap.add_argument("--config", default="configs/tiny.yaml", help="run config (relative to the repo root)")
    ap.add_argument("--steps-per-round", type=int, default=2)
    ap.add_argument("--quorum", type=int, default=None, help="merge.quorum (default: the config's)")
    ap.add_argument("--set", action="append", default=[], help="KEY=VALUE for the run (repeatable), e.g. "
                    "coordinator.leases_per_worker=1: rounds in sequence")
    ap.add_argument("--name", default="overhead", help="results file stem")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds allowed per run")
    ap.add_argument("--no-local", action="store_true", help="skip the local-directory case")
    options(ap, __file__)
    args = ap.parse_args()
    if args.quick:
        args.config, args.versions, args.latency_ms, args.no_local = "configs/tiny.yaml", 1, [], False
    meta = start(args.quick)
    workdir = Path(tempfile.mkdtemp(prefix="hubgrpo-overhead-"))
    cases = ([] if args.no_local else [local_case(workdir, args)]) + [hub_case(workdir, args, ms)
                                                                       for ms in args.latency_ms]
    r = {"workers": args.workers, "config": args.config, "steps_per_round": args.steps_per_round,
         "quorum": args.quorum, "overrides": args.set,
         "versions": args.versions, "cases": cases}
    said = ", ".join(f"{100 * (c['overhead_fraction'] or 0):.1f} % ({c['store']})" for c in cases)
    write(results_dir(args, __file__), args.name, r, to_markdown(r), meta,
          f"coordination overhead per round: {said} ({args.config})")
    print(to_markdown(r))


if __name__ == "__main__":
    main()
