"""Proof of rollouts on real worker rounds: do honest rounds of a real model pass the verifier, and what does it cost?

    python benchmarks/proof/verify_rounds.py [--config configs/demo.yaml] [--rounds 20] [--budget 0.1]
    python benchmarks/proof/verify_rounds.py --quick   # the tiny model, 3 rounds: checks the script

Each round is what a worker does (``RoundEngine.run_round`` on a lease of a local coordinator, keyed sampling, the
rollouts file with its token ids) on the version-0 adapter; the verifier (``hubgrpo.worker.verifier.Verifier.replay``,
the code ``hubgrpo evaluate --verify`` runs) then checks the round's first generation batch: the prompt ids against
the leased prompts as TRL tokenises them, the texts against their ids, and a replay of the ≤ ``--budget`` sample
(``--budget 1``: every completion) in float32 on this CPU. Worker and verifier are one process here (same threads
and precision): a false alarm here is a bug, not rounding. Reported: rounds failed (false alarms), tokens checked,
tokens per second, and the replay's seconds against the round's own training seconds.

Writes results/<name>.{md,json} (default verify-rounds-<model>).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.common import TINY, options, results_dir, start, write  # noqa: E402


class _Adapters:
    """The verifier's client, for a run nobody serves: the leased version is the version-0 adapter folder."""

    def __init__(self, folder: Path):
        self.folder = folder

    def adapter(self, version, adapter_id, dest, max_bytes):
        import shutil

        out = Path(dest) / f"v{version}"
        shutil.rmtree(out, ignore_errors=True)
        return Path(shutil.copytree(self.folder, out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="configs/demo.yaml")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--budget", type=float, default=0.1, help="fraction of a batch's tokens replayed (1: all)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--name", default=None)
    options(ap, __file__)
    args = ap.parse_args()
    if args.quick:
        args.config, args.rounds = TINY, 3
    meta = start(args.quick)

    from hubgrpo.config import load_config
    from hubgrpo.coordinator.core import Coordinator
    from hubgrpo.coordinator.repo_init import init_repo
    from hubgrpo.layout import ROLLOUTS_FILE
    from hubgrpo.proof.selection import selection_key
    from hubgrpo.store.local import LocalStore
    from hubgrpo.task.rollouts import read, size_limit
    from hubgrpo.worker.engine import RoundEngine
    from hubgrpo.worker.verifier import Verifier

    cfg = load_config(ROOT / args.config, overrides=[f"worker.threads={args.threads}", "coordinator.verify=sample"])
    tmp = Path(tempfile.mkdtemp(prefix="hubgrpo-verify-rounds-"))
    engine = RoundEngine(cfg, worker="w")
    store = LocalStore(tmp / "repo")
    v0 = engine.init_adapter(tmp / "v0")
    init_repo(store, cfg, v0)
    coord = Coordinator(store, os.urandom(32), workdir=tmp / "coord")
    verifier = Verifier(store, _Adapters(v0), engine=engine, workdir=tmp / "verifier", budget=args.budget)
    rows = []
    for i in range(args.rounds):
        lease = coord.lease(f"w{i}")
        out = tmp / "rounds" / lease.lease_id
        t0 = time.perf_counter()
        engine.run_round(v0, lease, out)
        train_s = time.perf_counter() - t0
        raw = (out / ROLLOUTS_FILE).read_bytes()
        data = read(out / ROLLOUTS_FILE, size_limit(cfg, lease))
        t1 = time.perf_counter()
        verdict = verifier.replay(lease, data, selection_key(verifier.secret, hashlib.sha256(raw).digest()))
        verify_s = time.perf_counter() - t1
        rows.append({**verdict, "round_s": train_s, "verify_s": verify_s, "bytes": len(raw)})
        print(f"round {i}: {'passed' if verdict['passed'] else 'FAILED: ' + str(verdict['reason'])}, "
              f"{verdict['checked']}/{verdict['tokens']} tokens checked, {verify_s:.2f} s vs round {train_s:.1f} s",
              flush=True)

    failed = [r for r in rows if not r["passed"]]
    tokens, checked = sum(r["tokens"] for r in rows), sum(r["checked"] for r in rows)
    verify_s, round_s = sum(r["verify_s"] for r in rows), sum(r["round_s"] for r in rows)
    model = cfg.base_model.split(":")[-1].split("/")[-1]
    name = args.name or f"verify-rounds-{model}"
    headline = (f"{cfg.base_model}: {len(failed)} of {len(rows)} honest rounds failed; {checked} of {tokens} replayed "
                f"tokens checked, {tokens / verify_s:.0f} tokens/s; replay {100 * verify_s / round_s:.1f} % of the "
                "rounds' own time")
    md = "\n".join([
        f"# Proof of rollouts on real rounds: {cfg.base_model}", "", headline, "",
        f"`{args.config}`, {args.rounds} rounds, budget {args.budget}, {args.threads} threads, float32 worker and "
        "verifier in one process.", "",
        "| round | passed | tokens | checked | mismatches | verify s | round s | rollouts bytes |",
        "|---|---|---|---|---|---|---|---|",
        *[f"| {i} | {r['passed']} | {r['tokens']} | {r['checked']} | {r['mismatches']} | {r['verify_s']:.2f} | "
          f"{r['round_s']:.1f} | {r['bytes']} |" for i, r in enumerate(rows)],
    ])
    write(results_dir(args, __file__), name, {"rounds": rows, "config": args.config, "budget": args.budget}, md,
          meta, headline)


if __name__ == "__main__":
    main()
