"""Real wall-clock speed-up on this machine: ``hubgrpo train`` on one core vs ``hubgrpo run --workers 2`` (one
thread each, the two cores), same config, same task; time to a target reward.

    python benchmarks/speedup/speedup_real.py [--config configs/demo.yaml] [--seeds 0] [--train-steps 48]
        [--versions 16] [--target 0.9] [--eval 16] [--set KEY=VALUE …] [--run-set KEY=VALUE …]
        [--train-from RESULT.json] [--name speedup-real]
    python benchmarks/speedup/speedup_real.py --quick   # the script checked: tiny model, 6 steps, 12 versions

Both runs are the real CLI in subprocesses, one after the other (never at the same time). ``--hub-quota 128`` puts
the run's repo on the Hub emulator (its own process) with the Hub's commit quota on, as a run on the Hub has it;
without it the repo is a local folder, where commits are free (the report names which). For each seed:

- **train**: ``hubgrpo train CONFIG --steps T --set worker.threads=1``. Its clock is the sum of TRL's
  per-step ``step_time`` from the first step (model load excluded), plus, separately, the process wall time.
  Training reward: the mean of the last 5 steps' sampled reward (one 5-step round's worth).
- **run**: ``hubgrpo run CONFIG --workers 2 --no-eval --set rounds.versions=V`` (no evaluator process beside the
  two workers: the held-out scores are computed afterwards, as for train). Its clock starts at the first lease
  (workers loaded their models before; the same exclusion as train's) and is also given from the process start.
  Training reward per version: the samples-weighted mean reward of the rounds merged into it and the versions just
  before it, over as many samples as train's 5-step window (5 × ``per_device_train_batch_size`` completions): with
  5-step rounds and quorum 1, exactly the version's own round (as ``hubgrpo status`` shows it); with shorter rounds
  the same amount of evidence as train's.
- **held-out**: after both, every checkpoint is scored here in one process: train's adapter every
  ``--train-save-every`` steps and its final one, and every version of the run (tags), greedily on the first
  ``--eval`` held-out prompts.

``--run-set`` changes the run only (e.g. its merge), so train stays the config's single process. ``--train-from``
takes train's curve and held-out scores for each seed from an earlier result of this script (same config and
steps) instead of training again; the report says so.

Targets: the first time the training reward reaches ``--target``, and the first time the run's held-out reward
reaches train's final held-out reward (train's time to it: its first checkpoint that scores it). speed-up =
train's time / run's time. Writes
results/<name>.{md,json}; the per-round log of the run (rounds.jsonl) is kept in the JSON for the simulator's
validation (``benchmarks/simulator/validate.py``) and the phase walk (``benchmarks/simulator/phase_walk.py``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.common import TINY, hubgrpo, options, results_dir, sets, start, write  # noqa: E402
from benchmarks.speedup.early_stop import reached, run_cli  # noqa: E402


def first_at(curve: list[dict], key: str, target: float) -> dict | None:
    return next((c for c in curve if c.get(key) is not None and c[key] >= target), None)


def windowed(curve: list[dict], window: int) -> None:
    """Set each version's ``reward_w``: the samples-weighted mean reward of it and the versions before it over the
    last ``window`` samples at least (None until that many)."""
    for i, c in enumerate(curve):
        total = n = 0.0
        for prev in reversed(curve[:i + 1]):
            if prev["reward"] is not None and prev["samples"]:
                total, n = total + prev["reward"] * prev["samples"], n + prev["samples"]
            if n >= window:
                break
        c["reward_w"] = total / n if n >= window else None


def train_window(args) -> int:
    """Completions in train's 5-step reward window."""
    from hubgrpo.config import load_config

    return 5 * load_config(ROOT / args.config, overrides=args.set).params.per_device_train_batch_size


def run_train(args, tmp: Path, seed: int) -> dict:
    out = tmp / f"train-s{seed}"
    every = ["--save-every", str(args.train_save_every)] if args.train_save_every else []
    since = time.time()
    wall = hubgrpo("train", args.config, "--steps", str(args.train_steps), "--output", str(out), "--eval-samples",
                   "0", *every, *sets([*args.set, "worker.threads=1", f"params.seed={seed}"]))
    m = json.loads((out / "metrics.json").read_text())
    t, curve, rewards = 0.0, [], []
    ended = m.get("step_ended_at") or [None] * len(m["step_metrics"])
    for s, end in zip(m["step_metrics"], ended):
        t += s.get("step_time") or 0.0
        rewards.append(s["reward"])
        window = rewards[-5:]
        curve.append({"step": s["step"], "t": t, "t_process": None if end is None else end - since,
                      "reward": s["reward"], "reward5": sum(window) / len(window) if len(window) == 5 else None})
    return {"seed": seed, "adapter": str(out), "wall_s": wall, "setup_s": m["timings"].get("setup"),
            "steps": len(curve), "curve": curve}


HUB_TOKEN = "hf_test_alice_token"  # the emulator's default user (alice)


class HubQuota:
    """``--hub-quota N``: the run repo on the Hub emulator (``tests/support/hub_emulator.py``, its own process) with N commits
    per repo per rolling hour, as the Hub allows; ``hubgrpo run`` talks to it through ``HF_ENDPOINT``."""

    def __init__(self, quota: int):
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.support.hub_emulator", "--commit-quota", str(quota)],
                                     cwd=ROOT, stdout=subprocess.PIPE, text=True)
        self.url = self.proc.stdout.readline().strip()
        if not self.url.startswith("http://"):
            raise RuntimeError(f"the Hub emulator did not start: {self.url!r}")

    def env(self) -> dict:
        return {"HF_ENDPOINT": self.url, "HF_TOKEN": HUB_TOKEN, "HF_HUB_DISABLE_XET": "1"}

    def store(self, repo_id: str):
        from hubgrpo.store.hub import HubStore

        return HubStore(repo_id, token=HUB_TOKEN, endpoint=self.url)

    def commits(self, store) -> list[float]:
        return sorted(c.created_at for c in store.history())

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def run_workers(args, tmp: Path, seed: int, hub: HubQuota | None = None) -> dict:
    from hubgrpo import runrepo
    from hubgrpo.config import load_config
    from hubgrpo.store.local import LocalStore

    repo = f"alice/speedup-s{seed}-{int(time.time())}" if hub else str(tmp / f"run-s{seed}")
    since = time.time()
    piped = [] if args.pipeline is None else ["--pipeline" if args.pipeline else "--no-pipeline"]
    window = -(-5 // load_config(ROOT / args.config, overrides=[*args.set, *args.run_set]).rounds.steps)
    stop = None if args.stop_after is None else (lambda: reached(since, window, args.target, args.stop_after))
    wall, stopped = run_cli(["run", args.config, "--workers", "2", "--repo", repo, "--no-eval", *piped, *sets(
        [*args.set, *args.run_set, f"rounds.versions={args.versions}", f"params.seed={seed}",
         f"project_name=speedup-s{seed}"])], ROOT, hub.env() if hub else None, stop)
    store = hub.store(repo) if hub else LocalStore(repo)
    state = runrepo.read_state(store)
    rounds = [r for f in sorted((runrepo.cache_root() / "worker").glob("*/rounds.jsonl"))
              for r in map(json.loads, f.read_text().splitlines()) if r["at"] >= since]
    first_lease = min((r.get("started_at", r["at"] - r.get("round_s", 0)) - r.get("lease_s", 0) for r in rounds),
                      default=since)
    curve = [{"version": v.version, "t": v.created_at - first_lease, "t_process": v.created_at - since,
              "reward": v.reward_mean, "samples": v.samples, "staleness": [m.staleness for m in v.merged]}
             for v in state.versions[1:]]
    out = {"seed": seed, "repo": str(repo), "wall_s": wall, "stopped": stopped, "startup_s": first_lease - since, "curve": curve,
           "rounds": rounds, "shas": runrepo.version_shas(store), "store": store}
    if hub:
        times = hub.commits(store)
        out["hub_commits"] = len(times)
        out["hub_peak_commits_per_hour"] = max(sum(1 for u in times if t <= u < t + 3600) for t in times)
    return out


def evaluate_all(args, train: dict, run: dict, tmp: Path) -> None:
    """Greedy held-out reward of train's final adapter and of every version of the run, in this process
    (``--eval 0``: none of the run's versions; train's scores as they came)."""
    if not args.eval:
        run["eval"] = {}
        for c in run["curve"]:
            c["eval"] = None
        return
    from hubgrpo import runrepo
    from hubgrpo.config import load_config
    from hubgrpo.store.local import LocalStore
    from hubgrpo.worker.engine import RoundEngine

    cfg = load_config(ROOT / args.config, overrides=[*args.set, f"params.seed={train['seed']}", "worker.device=cpu"])
    engine = RoundEngine(cfg, worker="eval")

    def score(folder) -> float:
        if not args.eval_sampled:
            return engine.evaluate(folder, n=args.eval)
        engine.load_adapter(folder)
        k = args.eval_sampled
        return sum(engine.evaluate(n=args.eval, greedy=False, seed=1000 + i) for i in range(k)) / k

    if "eval_final" not in train:  # (--train-from: scored when that result was made)
        train["eval_final"] = score(train["adapter"])
        times = {c["step"]: c["t"] for c in train["curve"]}
        checkpoints = {int(d.name.split("-")[1]): d for d in Path(train["adapter"]).glob("checkpoints/step-*")}
        train["eval_curve"] = [{"step": step, "t": times.get(step), "eval": score(d)}
                               for step, d in sorted(checkpoints.items())]
    store = run.get("store") or LocalStore(run["repo"])
    run["eval"] = {}
    for version, sha in sorted(run["shas"].items()):
        run["eval"][version] = score(runrepo.adapter_at(store, sha, tmp / "eval-adapters"))
    train.setdefault("eval_initial", run["eval"].get(0))
    for c in run["curve"]:
        c["eval"] = run["eval"].get(c["version"])


def summarise(args, train: dict, run: dict) -> dict:
    t_hit = first_at(train["curve"], "reward5", args.target)
    windowed(run["curve"], train_window(args))
    r_hit = first_at(run["curve"], "reward_w", args.target)
    e_target = train.get("eval_final")  # (None with --eval 0: no held-out target)
    e_hit = first_at(run["curve"], "eval", e_target) if e_target is not None else None
    train_total = train["curve"][-1]["t"] if train["curve"] else None
    # with --train-save-every, train's own first checkpoint at its final score (else: only its end is known)
    train_e_hit = first_at(train.get("eval_curve") or [], "eval", e_target)
    if train_e_hit and train_e_hit["t"] is not None:
        train_total = train_e_hit["t"]
    out = {"seed": run["seed"], "train_s_to_target": t_hit and t_hit["t"], "train_step_at_target": t_hit and t_hit["step"],
           "run_s_to_target": r_hit and r_hit["t"], "run_version_at_target": r_hit and r_hit["version"],
           "run_process_s_to_target": r_hit and r_hit["t_process"],
           "train_process_s_to_target": t_hit and t_hit.get("t_process"),
           "eval_target": e_target, "train_s_to_eval_target": train_total,
           "run_s_to_eval_target": e_hit and e_hit["t"], "run_version_at_eval_target": e_hit and e_hit["version"],
           "run_final_eval": run["curve"][-1]["eval"] if run["curve"] else None,
           "train_eval_initial": train.get("eval_initial"), "run_startup_s": run["startup_s"],
           "train_setup_s": train["setup_s"]}
    out["speedup_train_reward"] = (out["train_s_to_target"] / out["run_s_to_target"]
                                   if out["train_s_to_target"] and out["run_s_to_target"] else None)
    out["speedup_process"] = (out["train_process_s_to_target"] / out["run_process_s_to_target"]
                              if out["train_process_s_to_target"] and out["run_process_s_to_target"] else None)
    out["speedup_eval"] = (train_total / out["run_s_to_eval_target"]
                           if train_total and out["run_s_to_eval_target"] else None)
    stale = [s for c in run["curve"] for s in c["staleness"]]
    out["staleness_histogram"] = {str(k): stale.count(k) for k in sorted(set(stale))}
    out["run_round_train_s_median"] = statistics.median(r["train_s"] for r in run["rounds"] if "train_s" in r) \
        if run["rounds"] else None
    return out


def fmt(x, spec=".1f"):
    return "–" if x is None else format(x, spec)


def quota_words(args, rows: list[dict]) -> str:
    if not args.hub_quota:
        return "a local folder (commits free)"
    peaks = [r.get("hub_peak_commits_per_hour") for r in rows]
    return (f"the Hub emulator with the commit quota on ({args.hub_quota} per rolling hour); commits in the busiest "
            f"hour per seed: {peaks}")


def mean_lines(rows: list[dict]) -> list[str]:
    """Mean ± sd (min–max) over every run of the report, for each speed-up."""
    out = []
    for key, words in (("speedup_train_reward", "to the training target, from the first lease / first step"),
                       ("speedup_process", "to the training target, from process start"),
                       ("speedup_eval", "to train's final held-out score")):
        xs = [r[key] for r in rows if r.get(key)]
        if xs:
            sd = f" ± {statistics.stdev(xs):.2f}" if len(xs) > 1 else ""
            out.append(f"- speed-up {words}: **{statistics.mean(xs):.2f}×**{sd} (min {min(xs):.2f}, max "
                       f"{max(xs):.2f}; {len(xs)} of {len(rows)} runs reached it)")
    if out and len({r["seed"] for r in rows}) < len(rows):
        out.append("- the repeats of one seed share its one `hubgrpo train` run (the runs differ, the reference not)")
    return ["", *out] if out else []


def pipelined_by(args) -> str:
    """What pipelines the run's rounds: the flag, the config's worker.pipeline, or nothing ("")."""
    if getattr(args, "pipeline", None) is not None:
        return "hubgrpo run --pipeline" if args.pipeline else ""
    if not getattr(args, "config", None):
        return ""
    from hubgrpo.config import load_config
    from hubgrpo.config.recipe import allows_pipelining

    sets = [*getattr(args, "set", []), *getattr(args, "run_set", [])]
    cfg = load_config(ROOT / args.config, overrides=sets, warn=False)
    return "the config's worker.pipeline" if cfg.worker.pipeline and allows_pipelining(cfg) else ""


def to_markdown(args, rows: list[dict]) -> str:
    lines = ["# Real speed-up on this machine: train (1 core) vs run --workers 2", "",
             f"Config `{args.config}`{' with ' + ', '.join(args.set) if args.set else ''}"
             f"{'; the run with ' + ', '.join(args.run_set) if args.run_set else ''}"
             f"{'; rounds pipelined (' + pipelined_by(args) + ')' if pipelined_by(args) else ''}"
             f"{'; train taken from ' + ', '.join(map(str, args.train_from)) if args.train_from else ''}; train {args.train_steps} "
             f"steps; run {args.versions} versions"
             f"{'' if getattr(args, 'stop_after', None) is None else f' (each ended {args.stop_after} rounds after its workers logged the target: early_stop.py)'}"
             f"; target training reward {args.target} (train: mean of 5 steps; "
             f"run: the versions' merged rounds over as many samples); held-out: greedy on {args.eval} prompts. "
             f"Run repo: {quota_words(args, rows)}.",
             "", "| seed | train s to target (step) | run s to target (version) | speed-up | from process start: "
             "train s / run s / speed-up | held-out target (train final) "
             "| run s to it (version) | train s to it (first checkpoint at it, else its end) | speed-up held-out | run final held-out | τ histogram |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['seed']}{' r' + str(r['repeat']) if r.get('repeat') else ''} | {fmt(r['train_s_to_target'])} ({r['train_step_at_target']}) | "
                     f"{fmt(r['run_s_to_target'])} ({r['run_version_at_target']}) | {fmt(r['speedup_train_reward'], '.2f')}× | "
                     f"{fmt(r.get('train_process_s_to_target'))} / {fmt(r['run_process_s_to_target'])} / "
                     f"{fmt(r.get('speedup_process'), '.2f')}× | "
                     f"{fmt(r['eval_target'], '.3f')} | {fmt(r['run_s_to_eval_target'])} ({r['run_version_at_eval_target']}) | "
                     f"{fmt(r['train_s_to_eval_target'])} | {fmt(r['speedup_eval'], '.2f')}× | {fmt(r['run_final_eval'], '.3f')} | "
                     f"{r['staleness_histogram']} |")
    lines += mean_lines(rows)
    lines += ["", "Clocks: train from its first step (model load excluded), run from its first lease (the workers' "
              "model load excluded); and both from the moment the command was started (imports, model loads, the "
              "coordinator's start: what a user waits for). Start-ups and train's setup are in the JSON."]
    return "\n".join(lines) + "\n"


def headline(args, rows: list[dict]) -> str:
    task = Path(str(getattr(args, "config", "") or "")).stem or "?"
    task += ", rounds pipelined" if pipelined_by(args) else ""
    xs = [r["speedup_train_reward"] for r in rows if r.get("speedup_train_reward")]
    if not xs:
        return f"{task}: N = 2 did not reach a training reward of {args.target} in {args.versions} versions"
    sd = f" ± {statistics.stdev(xs):.2f}" if len(xs) > 1 else ""
    ps = [r["speedup_process"] for r in rows if r.get("speedup_process")]
    start = f", {statistics.mean(ps):.2f}× from process start" if ps else ""
    return (f"{task}: N = 2 reaches a training reward of {args.target} {statistics.mean(xs):.2f}×{sd} sooner than "
            f"one process from the first lease{start} ({len(xs)} of {len(rows)} runs; run repo: "
            f"{'Hub quota' if getattr(args, 'hub_quota', None) else 'local folder'})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="configs/demo.yaml")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--train-steps", type=int, default=48)
    ap.add_argument("--train-save-every", type=int, default=5,
                    help="score train's adapter every K steps too, so that its time to its final held-out score "
                         "is measured, not taken as its whole run (0: only the final adapter)")
    ap.add_argument("--versions", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=1, help="runs per seed (one train per seed): asynchronous runs "
                    "of one seed differ in the order their rounds arrive")
    ap.add_argument("--target", type=float, default=0.9)
    ap.add_argument("--eval", type=int, default=16)
    ap.add_argument("--eval-sampled", type=int, default=0, help="0: greedy; k: mean of k sampled passes")
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--run-set", action="append", default=[], help="KEY=VALUE for the run only")
    ap.add_argument("--pipeline", action=argparse.BooleanOptionalAction, default=None,
                    help="hubgrpo run --pipeline: each worker delivers a round while it trains the next; "
                         "--no-pipeline: in sequence; default: the config's worker.pipeline")
    ap.add_argument("--train-from", type=Path, action="append", default=[],
                    help="an earlier result JSON: reuse its train runs (repeat for several files)")
    ap.add_argument("--stop-after", type=int, default=None,
                    help="end each run this many rounds after the workers' round log reaches --target (default: "
                         "run all --versions); benchmarks/speedup/early_stop.py")
    ap.add_argument("--name", default="speedup-real")
    ap.add_argument("--hub-quota", type=int, default=None,
                    help="the run repo on the Hub emulator with this many commits per rolling hour (the Hub: 128); "
                         "default: a local folder, where commits are free")
    options(ap, __file__)
    args = ap.parse_args()
    if args.quick:  # a check of the script: the tiny model, a few steps, a target it reaches at once
        args.config, args.train_steps, args.train_save_every, args.versions = TINY, 6, 3, 12
        args.target, args.eval = 0.0, 4
    meta = start(args.quick)  # what is measured: the code at the start
    earlier = {r["train"]["seed"]: r["train"] for f in args.train_from for r in json.loads(f.read_text())["raw"]}
    rows, raw = [], []
    hub = HubQuota(args.hub_quota) if args.hub_quota else None
    with tempfile.TemporaryDirectory(prefix="hubgrpo-speedup-") as tmp:
        try:
            for seed in [int(s) for s in args.seeds.split(",")]:
                train = earlier[seed] if seed in earlier else run_train(args, Path(tmp), seed)
                for repeat in range(args.repeats):
                    (Path(tmp) / f"r{repeat}").mkdir(exist_ok=True)
                    run = run_workers(args, Path(tmp) / f"r{repeat}", seed, hub)
                    evaluate_all(args, train, run, Path(tmp))
                    rows.append({**summarise(args, train, run), "repeat": repeat,
                                 **{k: run[k] for k in run if k.startswith("hub_")}})
                    raw.append({"train": train, "run": {k: v for k, v in run.items() if k not in ("shas", "store")}})
                    print(json.dumps(rows[-1]), flush=True)
                    report(args, rows, raw, meta)  # after every run: a stopped series keeps what it measured
        finally:
            if hub is not None:
                hub.close()
    print(to_markdown(args, rows))


def report(args, rows: list[dict], raw: list[dict], meta: dict) -> None:
    write(results_dir(args, __file__), args.name, {"args": {k: v for k, v in vars(args).items()}, "rows": rows,
                                                   "raw": raw}, to_markdown(args, rows), dict(meta),
          headline(args, rows))


if __name__ == "__main__":
    main()
