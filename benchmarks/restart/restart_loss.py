"""What a coordinator killed at a random moment loses: the versions merged since its last checkpoint, at most.

    python benchmarks/restart/restart_loss.py [--kills 10] [--interval 3] [--name restart-loss]
    python benchmarks/restart/restart_loss.py --quick   # the script checked: one kill

The chaos harness of ``tests/support/restart_loop.py`` (the Hub emulator with its commit quota on, a served
coordinator in a subprocess, four model-free workers uploading rounds through it, ``hub.submissions:
coordinator``), with ``--kills`` SIGKILLs at random moments and checkpoints every ``--interval`` seconds. For each
restart: the live version before the kill, the last checkpoint it had reported, the checkpoint the repo held at
the kill (where the restarted coordinator resumes) and the versions lost. At the end: rounds merged twice in the
history that stays (must be 0) and whether every tag loads with PEFT. Writes results/<name>.{md,json}.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.common import options, results_dir, start, write  # noqa: E402


def measure(kills: int, interval: float, tmp: Path) -> dict:
    import tests.support.restart_loop as chaos
    from tests.support.space_support import make_run, start_emulator

    emu = start_emulator()
    emu.set_commit_quota(128)
    store = make_run(emu, tmp, chaos.REPO.split("/")[1], **{
        "merge.quorum": 1, "rounds.versions": 100000, "coordinator.checkpoint_every_s": interval,
        "hub.submissions": "coordinator", "coordinator.lease_timeout_s": 30, "merge.max_staleness": 4,
        "coordinator.rate_limit_per_minute": 6000})
    try:
        restarts, answers = chaos.kill_loop(store, emu.url, tmp, kills)
        final = chaos.check_history(store, tmp)
        commits = [c.created_at for c in store.history()]
    finally:
        emu.stop()
    rows = [{"live": live, "reported_checkpoint": cp, "held": held.version, "first_after": first,
             "lost_versions": live - held.version, "bound": live - cp} for live, cp, held, first in restarts]
    return {"restarts": rows, "merged_twice": sum(n > 1 for n in Counter(final.merged_ids).values()),
            "final_version": final.version, "tags": sorted(v.version for v in final.versions if v.tag),
            "commits": len(commits), "answers": Counter(a.get("status") or a.get("code") or "error"
                                                        for a in answers)}


def to_markdown(args, out: dict) -> str:
    lines = ["# What a killed coordinator loses", "",
             f"{args.kills} SIGKILLs at random moments; checkpoints every {args.interval} s; the Hub emulator with "
             "its commit quota on (128/h); 4 model-free workers, rounds through the coordinator.", "",
             "| restart | live version at the kill | its last reported checkpoint | checkpoint the repo held "
             "(resumed from) | versions lost | bound (live − reported checkpoint) |", "|---|---|---|---|---|---|"]
    for i, r in enumerate(out["restarts"], 1):
        lines.append(f"| {i} | {r['live']} | {r['reported_checkpoint']} | {r['held']} | {r['lost_versions']} | "
                     f"{r['bound']} |")
    lines += ["", f"Rounds merged twice in the history that stays: {out['merged_twice']}. Final version "
              f"{out['final_version']}; checkpoint tags (every one loads with PEFT): {len(out['tags'])}; "
              f"commits of the run repo: {out['commits']}. Worker answers: {dict(out['answers'])}."]
    return "\n".join(lines) + "\n"


def headline(out: dict) -> str:
    rows = out["restarts"]
    within = sum(r["lost_versions"] <= r["bound"] for r in rows)
    return (f"{len(rows)} SIGKILLs: versions lost within the bound (since the last checkpoint) {within} of "
            f"{len(rows)} times; {out['merged_twice']} rounds merged twice")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--interval", type=float, default=3.0)
    ap.add_argument("--name", default="restart-loss")
    options(ap, __file__)
    args = ap.parse_args()
    if args.quick:
        args.kills = 1
    meta = start(args.quick)
    with tempfile.TemporaryDirectory(prefix="hubgrpo-restarts-") as tmp:
        out = measure(args.kills, args.interval, Path(tmp))
    write(results_dir(args, __file__), args.name, {"args": {k: str(v) if isinstance(v, Path) else v
                                                            for k, v in vars(args).items()}, **out},
          to_markdown(args, out), meta, headline(out))
    print(to_markdown(args, out))


if __name__ == "__main__":
    main()
