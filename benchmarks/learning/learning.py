"""Does asynchronous hubgrpo learn as well as single-process GRPO? Equal samples, same task, model, seeds.

    python benchmarks/learning/learning.py            # builtin:tiny on its toy reward (~15 min, 3 seeds)
    python benchmarks/learning/learning.py --full     # SmolLM2-135M on addition, the demo task (~1 hour, 2 cores)
    python benchmarks/learning/learning.py --mixed --variants baseline,async-4w --seeds 0,1,2,3,4
                                                      # SmolLM2 on configs/addition-mixed.yaml, the default recipe
    python benchmarks/learning/learning.py --variants baseline,async-4w   # a subset
    python benchmarks/learning/learning.py --quick    # the script checked: baseline and async-1w, 8 steps, 1 seed

Variants (every hubgrpo one is an embedded ``hubgrpo run`` over a local directory, svd merge unless named):

    baseline     ``hubgrpo train --steps T``: TRL GRPO in one process, T steps (the synchronous reference)
    sync4-lrMx   ``hubgrpo train --steps T/4`` with 4x the batch and M x the learning rate (M = 1, 2, 4): 4 workers
                 in lock-step with exact gradient averaging at 4x the baseline's batch per step, the best a
                 data-parallel scheme with the baseline's batch per worker can do per sample
    single-b4    ``hubgrpo train`` with 4 completions per step for 4x (tiny) / 2x (SmolLM2) the steps: the
                 single-process reference at demo-4w-b4's per-worker batch
    async-Nw     N workers (1, 2, 4), quorum 1 (every admitted round becomes a version), max_staleness 4
    naive-4w     as async-4w with factor averaging (``merge.method: naive``) instead of the exact ΔW merge
    stale0-4w    as async-4w with ``max_staleness: 0`` (a round trained on an old version is refused)
    quorum4-4w   4 workers, quorum 4: each version averages 4 rounds (DiLoCo-style), outer_lr 1
    ffa-Nw       N workers (1, 4) with FFA-LoRA (``merge.method: ffa``: lora_A frozen at the version-0 draw, B
                 merged exactly — no truncation whatever the staleness); not in the default set
    ffa-rebase-4w  ffa-4w with mid-round rebase (``merge.rebase``)
    keep[-sprK]-4w ffa-rebase-4w, outer lr 1, each worker keeping its AdamW moments across rounds
                 (``rounds.reset_optimizer: false``), rounds of the mode's / K steps; not in the default set
    demo-4w      the merge and rounds of configs/demo.yaml as shipped: keep-spr1-4w with 2 versions of staleness
                 per live worker; not in the default set (demo-gen-4w: also moving between a step's generation and
                 its backward, ``merge.rebase_after_generation``; demo-4w-b4: 4 completions, one prompt's
                 group, per worker step — on the tiny model 4 workers then sample the baseline's batch per round;
                 -add: ``merge.extra_rounds: add``, rounds merged together each move the version by their step;
                 demo-4w-b4-lrMx: demo-4w-b4 at M x the config's learning rate, M = 0.5, 0.7)

Equal samples: every hubgrpo run stops after T·batch / (its batch·rounds.steps) versions (quorum4: a
quarter of that, versions of 4 rounds), and the adapter evaluated is the last version whose merged samples are
within the baseline's T·batch completions (a merge takes every pending round, so with 4 workers the last
versions can hold 2 rounds and overshoot; "samples merged" is the evaluated version's). Rounds trained but
refused, cut off at the end or merged past the budget are counted in "samples generated".

Reward: the held-out reward of the version-0 adapter (identical for all variants of one training seed) and of
each final adapter, evaluated in this process (quick: 8 sampled completions per held-out prompt at the training
temperature, fixed eval seeds; full: greedy). gain = final − initial, averaged over training seeds (quick: 0, 1,
2 — the tiny model's gain varies by 2-3x between seeds, so one seed says little); ratio = mean gain / baseline's
mean gain. Curves: the training reward of merged rounds against samples and wall-clock. Writes
results/learning[-full].{json,md,png} (``benchmarks/common.py``'s result shape).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.common import hubgrpo, options, results_dir, sets, start, write  # noqa: E402

MODES = {  # config, total GRPO steps T, eval prompts, greedy eval
    "quick": {"config": "configs/tiny.yaml", "steps": 48, "eval": 100, "greedy": False, "repeats": 8,
              "set": ["rounds.steps=4"]},
    "full": {"config": "configs/demo.yaml", "steps": 40, "eval": 100, "greedy": True, "repeats": 1,
             "set": ["rounds.steps=5"]},
    # the harder task, with the default recipe (no override: async-Nw is the recipe users get)
    # held-out sampled at the training temperature, as the task's headroom and the simulations score it
    "mixed": {"config": "configs/addition-mixed.yaml", "steps": 100, "eval": 100, "greedy": False, "repeats": 2,
              "set": []},
}
VARIANTS = {  # name: (workers, overrides); quorum is 1 unless set
    "async-1w": (1, []),
    "async-2w": (2, []),
    "async-4w": (4, []),
    "naive-4w": (4, ["merge.method=naive"]),
    "stale0-4w": (4, ["merge.max_staleness=0"]),
    "quorum4-4w": (4, ["merge.quorum=4"]),
    "ffa-1w": (1, ["merge.method=ffa", "merge.rebase=false"]),
    "ffa-4w": (4, ["merge.method=ffa", "merge.rebase=false"]),
    "ffa-rebase-4w": (4, ["merge.method=ffa", "merge.rebase=true"]),  # rounds move onto newer versions mid-round
    # the demo's merge with each worker keeping its AdamW moments across rounds, rounds of 4 / 2 / 1 steps
    "keep-4w": (4, ["merge.method=ffa", "merge.rebase=true", "merge.outer_lr=1", "rounds.reset_optimizer=false"]),
    "keep-spr2-4w": (4, ["merge.method=ffa", "merge.rebase=true", "merge.outer_lr=1", "rounds.reset_optimizer=false",
                         "rounds.steps=2"]),
    "keep-spr1-4w": (4, ["merge.method=ffa", "merge.rebase=true", "merge.outer_lr=1", "rounds.reset_optimizer=false",
                         "rounds.steps=1"]),
}
# configs/demo.yaml's merge and rounds as shipped (the learning-rate schedule is the mode config's, as for the
# baseline: wsd in full mode, constant on the tiny model); demo-gen: each step's gradient at the newest version
# published while it sampled
VARIANTS["demo-4w"] = (4, [*VARIANTS["keep-spr1-4w"][1], "merge.staleness_per_worker=2"])
VARIANTS["demo-gen-4w"] = (4, [*VARIANTS["demo-4w"][1], "merge.rebase_after_generation=true"])
# the same with 4 completions (one prompt's group) per worker step: on the tiny model 4 workers then sample
# the baseline's 16 completions per round of the fleet (the data-parallel convention: per-worker batch = global
# batch / N); on SmolLM2 (batch 8) it halves each worker's batch
VARIANTS["demo-4w-b4"] = (4, [*VARIANTS["demo-4w"][1], "params.per_device_train_batch_size=4"])
# -add: rounds that arrived during a merge each move the next version by their own step (merge.extra_rounds)
VARIANTS["demo-4w-add"] = (4, [*VARIANTS["demo-4w"][1], "merge.extra_rounds=add"])
VARIANTS["demo-4w-b4-add"] = (4, [*VARIANTS["demo-4w-b4"][1], "merge.extra_rounds=add"])
# -lrMx: the same at M x the mode config's learning rate (rounds taken M versions stale step as a momentum
# would: does a lower rate keep more of the gain per sample?)
LR_MULT = {"demo-4w-b4-lr0.5x": 0.5, "demo-4w-b4-lr0.7x": 0.7}
for _name in LR_MULT:
    VARIANTS[_name] = VARIANTS["demo-4w-b4"]
SYNC = {  # name: (batch multiplier k, learning-rate multiplier): `hubgrpo train` with k x the batch for T / k steps,
    # i.e. synchronous data parallelism over k workers of the baseline's batch each with exact gradient averaging —
    # what no asynchronous merge of such workers can beat at equal samples; not in the default set
    "sync4-lr1x": (4, 1.0),
    "sync4-lr2x": (4, 2.0),
    "sync4-lr4x": (4, 4.0),
}
SINGLE = {  # name: batch: `hubgrpo train` with that batch for as many steps as the baseline's samples allow (the
    # single-process reference at a fleet variant's per-worker batch); not in the default set
    "single-b4": 4,
}
ALL = ["baseline", *SYNC, *SINGLE, *VARIANTS]
DEFAULT = [n for n in ALL if not n.startswith(("ffa", "keep", "demo", "sync", "single"))]


def mode_overrides(mode: dict) -> list[str]:
    """The mode's own config overrides, then ``--set``'s (``mode["extra"]``)."""
    return [*mode["set"], *mode.get("extra", [])]


def run_baseline(mode: dict, tmp: Path, seed: int, name: str = "baseline") -> dict:
    """`hubgrpo train` for the mode's steps; a SYNC name: k x the batch for steps / k at a scaled rate; a SINGLE
    name: its batch for as many steps as the baseline's samples allow."""
    from hubgrpo.config import load_config

    k, lr_mult = SYNC.get(name, (1, 1.0))
    base = mode_overrides(mode)
    p = load_config(ROOT / mode["config"], overrides=base).params
    batch = SINGLE.get(name, k * p.per_device_train_batch_size)
    steps = mode["steps"] * p.per_device_train_batch_size // batch
    extra = [] if name == "baseline" else [f"params.per_device_train_batch_size={batch}",
                                           f"params.learning_rate={lr_mult * p.learning_rate!r}"]
    out = tmp / f"{name}-s{seed}"
    wall = hubgrpo("train", mode["config"], "--steps", str(steps), "--output", str(out),
                   "--eval-samples", "0", *sets([*base, *extra, f"params.seed={seed}"]))
    m = json.loads((out / "metrics.json").read_text())
    batch = m["samples"] // max(1, m["steps"])
    t, curve = m["timings"].get("setup", 0.0), []
    for s in m["step_metrics"]:
        t += s.get("step_time") or 0.0
        curve.append({"samples": s["step"] * batch, "reward": s["reward"], "t": t})
    return {"name": name, "seed": seed, "workers": k, "wall_s": wall, "adapter": str(out),
            "samples_merged": m["samples"], "samples_generated": m["samples"], "curve": curve, "rounds_refused": 0}


def variant_config(name: str, mode: dict):
    """A variant's config: the mode's config with the mode's, ``--set``'s and the variant's overrides."""
    from hubgrpo.config import load_config

    return load_config(ROOT / mode["config"], overrides=[*mode_overrides(mode), *variant_overrides(name, mode)])


def variant_overrides(name: str, mode: dict) -> list[str]:
    """A variant's config overrides (with ``LR_MULT``'s learning rate resolved against the mode's config)."""
    from hubgrpo.config import load_config

    extra = list(VARIANTS[name][1])
    if name in LR_MULT:
        lr = load_config(ROOT / mode["config"], overrides=mode_overrides(mode)).params.learning_rate
        extra.append(f"params.learning_rate={LR_MULT[name] * lr!r}")
    return extra


def run_variant(name: str, mode: dict, tmp: Path, seed: int) -> dict:
    from hubgrpo import runrepo
    from hubgrpo.store.local import LocalStore

    workers, extra = VARIANTS[name][0], variant_overrides(name, mode)
    quorum = 4 if "merge.quorum=4" in extra else 1
    cfg = variant_config(name, mode)  # as many rounds as the baseline's samples (mode["samples"]) allow
    versions = mode["samples"] // (cfg.params.per_device_train_batch_size * cfg.rounds.steps * quorum)
    repo = tmp / f"{name}-s{seed}"
    overrides = [*mode["set"], "merge.quorum=1", "merge.max_staleness=4", *mode.get("extra", []), *extra,
                 f"rounds.versions={versions}", f"params.seed={seed}",
                 f"project_name=learning-{name}-s{seed}", "coordinator.round_timeout_s=3600"]
    since = time.time()
    # no evaluator: the final adapters are scored here, and `hubgrpo run` would wait for it to score every version
    wall = hubgrpo("run", mode["config"], "--workers", str(workers), "--no-eval", "--repo", str(repo), *sets(overrides))
    store = LocalStore(repo)
    state = runrepo.read_state(store)
    t0, samples, curve = state.started_at or since, 0, []
    for v in state.versions[1:]:
        samples += v.samples
        curve.append({"samples": samples, "reward": v.reward_mean, "t": v.created_at - t0, "version": v.version})
    rounds = _rounds(since)
    version, samples = final_version(curve, mode["samples"])
    final = runrepo.adapter_at(store, runrepo.version_shas(store)[version], tmp / f"{name}-s{seed}-final")
    return {"name": name, "seed": seed, "workers": workers, "wall_s": wall, "adapter": str(final),
            "versions": state.version, "final_version": version, "samples_merged": samples,
            "samples_merged_run": curve[-1]["samples"] if curve else 0,
            "rounds_submitted": len(rounds), "rounds_refused": sum(r.get("status") == "refused" for r in rounds),
            "refusal_codes": sorted({r.get("code") for r in rounds if r.get("status") == "refused"}),
            "max_staleness_merged": max((m.staleness for v in state.versions for m in v.merged), default=0),
            "curve": curve, "overhead": _overhead(rounds)}


def final_version(curve: list[dict], budget: int) -> tuple[int, int]:
    """(version, samples): the last version whose merged samples are within the baseline's ``budget``. The run
    can overshoot it: a merge takes every pending round, so the last version may hold 2 rounds of 4 workers."""
    within = [c for c in curve if c["samples"] <= budget]
    return (within[-1]["version"], within[-1]["samples"]) if within else (0, 0)


def _rounds(since: float) -> list[dict]:
    from hubgrpo import runrepo

    rows = []
    for f in sorted((runrepo.cache_root() / "worker").glob("*/rounds.jsonl")):
        rows += [r for r in map(json.loads, f.read_text().splitlines()) if r["at"] >= since]
    return rows


def _overhead(rounds: list[dict]) -> float | None:
    from benchmarks.common import path_s

    coord = sum(path_s(r) for r in rounds)
    wall = coord + sum(r.get("train_s", 0.0) for r in rounds)
    return coord / wall if wall else None


def evaluate(results: list[dict], mode: dict, tmp: Path) -> dict[int, float]:
    """Held-out reward of each seed's version-0 adapter and of every final adapter, in this process."""
    from hubgrpo.config import load_config
    from hubgrpo.worker.engine import RoundEngine

    initial = {}
    for seed in sorted({r["seed"] for r in results}):
        # with --set (threads, data): the adapters are scored on the task and machine settings they trained with
        cfg = load_config(ROOT / mode["config"], overrides=[*mode_overrides(mode), f"params.seed={seed}"])
        engine = RoundEngine(cfg, worker="eval")

        def score(path) -> float:
            reps = mode["repeats"]
            return sum(engine.evaluate(path, n=mode["eval"], greedy=mode["greedy"], seed=1234 + i)
                       for i in range(reps)) / reps

        initial[seed] = score(engine.init_adapter(tmp / f"v0-s{seed}"))
        for r in (r for r in results if r["seed"] == seed):
            r["reward_final"] = score(r["adapter"])
            r["gain"] = r["reward_final"] - initial[seed]
        del engine
    return initial


def summarise(results: list[dict]) -> list[dict]:
    """One row per variant: means over seeds, the gain's standard deviation, the ratio of mean gains."""
    import statistics

    rows = []
    for name in dict.fromkeys(r["name"] for r in results):
        runs = [r for r in results if r["name"] == name]
        gains = [r["gain"] for r in runs]
        ov = [r["overhead"] for r in runs if r.get("overhead") is not None]
        rows.append({"name": name, "workers": runs[0]["workers"], "seeds": len(runs),
                     "reward_final": statistics.mean(r["reward_final"] for r in runs),
                     "gain": statistics.mean(gains), "gain_std": statistics.stdev(gains) if len(gains) > 1 else 0.0,
                     "samples_merged": statistics.mean(r["samples_merged"] for r in runs),
                     "samples_generated": statistics.mean(r.get("samples_generated") or 0 for r in runs),
                     "rounds_refused": sum(r.get("rounds_refused", 0) for r in runs),
                     "max_staleness_merged": max(r.get("max_staleness_merged", 0) for r in runs),
                     "wall_s": statistics.mean(r["wall_s"] for r in runs),
                     "overhead": statistics.mean(ov) if ov else None})
    base = next((r["gain"] for r in rows if r["name"] == "baseline"), None)
    for r in rows:
        r["gain_ratio"] = r["gain"] / base if base else None
    return rows


def plot(results: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    colors = {n: f"C{i}" for i, n in enumerate(dict.fromkeys(r["name"] for r in results))}
    for r in results:
        xs = [c["samples"] for c in r["curve"]]
        ys = [c["reward"] for c in r["curve"]]
        first = r["seed"] == min(x["seed"] for x in results if x["name"] == r["name"])
        style = {"linewidth": 2.0 if r["name"] == "baseline" else 1.0, "color": "black" if r["name"] == "baseline"
                 else colors[r["name"]], "label": r["name"] if first else None, "alpha": 0.8}
        a.plot(xs, ys, **style)
        b.plot([c["t"] / 60 for c in r["curve"]], ys, **style)
    a.set_xlabel("completions merged (samples)")
    a.set_ylabel("training reward (baseline: per step; hubgrpo: per version)")
    b.set_xlabel("wall-clock (minutes)")
    a.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def to_markdown(r: dict) -> str:
    lines = [f"# Learning at equal samples — {r['mode']} mode ({r['config']})", "",
             f"{r['steps']} GRPO steps of "
             f"{r['batch']} completions = {r['steps'] * r['batch']} samples per variant; held-out reward on "
             f"{r['eval']} prompts ({'greedy' if r['greedy'] else str(r['repeats']) + ' samples each at the training temperature, fixed seeds'}); "
             f"training seeds {r['seeds']}; overrides {r.get('overrides') or 'none'}; version-0 reward per seed "
             + ", ".join(f"{v:.4f}" for v in r["initial"].values()) + ".", "",
             "| variant | workers | seeds | reward final | gain (mean ± sd over seeds) | gain vs baseline "
             "| samples merged | samples generated | rounds refused | max τ merged | wall s | coord. overhead |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for x in r["summary"]:
        ratio = "-" if x.get("gain_ratio") is None else f"{100 * x['gain_ratio']:.0f} %"
        ov = "-" if x.get("overhead") is None else f"{100 * x['overhead']:.1f} %"
        lines.append(f"| {x['name']} | {x['workers']} | {x['seeds']} | {x['reward_final']:.4f} | {x['gain']:+.4f} ± "
                     f"{x['gain_std']:.4f} | {ratio} | {x['samples_merged']:.0f} | {x['samples_generated']:.0f} | "
                     f"{x['rounds_refused']} | {x['max_staleness_merged']} | {x['wall_s']:.0f} | {ov} |")
    if r.get("note"):
        lines += ["", f"Note: {r['note']}."]
    lines += ["", "Per seed (gain): " + "; ".join(f"{x['name']} s{x['seed']} {x['gain']:+.4f}" for x in r["results"])]
    lines += ["", "Wall time includes process start, model load and (hubgrpo) the coordinator; workers share the "
              "same cores, so more workers on one machine do not mean more compute. Plot: "
              f"`{r['png']}`."]
    return "\n".join(lines) + "\n"


def headline(report: dict) -> str:
    """The fleet's gain as a share of the baseline's, per variant."""
    rows = [x for x in report["summary"] if not x["name"].startswith(("baseline", "single", "sync"))
            and x.get("gain_ratio") is not None]
    model = "tiny" if report["mode"] == "quick" else "SmolLM2"
    return (f"{model}, {len(report['seeds'])} seed(s): " + ", ".join(
        f"{x['name']} {100 * x['gain_ratio']:.0f} %" for x in rows) + " of one process's gain at equal samples")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--full", action="store_true", help="SmolLM2-135M on addition instead of the tiny model")
    ap.add_argument("--mixed", action="store_true", help="SmolLM2-135M on addition-mixed.yaml, 100 steps")
    ap.add_argument("--variants", default=None, help=f"comma-separated subset of {ALL}")
    ap.add_argument("--name", default=None, help="results file stem (default: learning or learning-MODE)")
    ap.add_argument("--steps", type=int, help="total GRPO steps per variant (default: 48 tiny, 40 full, 100 mixed)")
    ap.add_argument("--set", action="append", default=[],
                    help="extra config override for every variant, the baseline included")
    ap.add_argument("--seeds", default=None, help="comma-separated training seeds (default: 0,1,2 tiny, else 0)")
    options(ap, __file__)
    args = ap.parse_args()
    meta = start(args.quick)
    mode_name = "mixed" if args.mixed else "full" if args.full else "quick"
    mode = dict(MODES[mode_name])
    if args.quick:  # a check of the script: two variants, 2 versions of 4-step rounds, 8 held-out prompts
        mode.update(steps=8, eval=8, repeats=1)
    if args.steps:
        mode["steps"] = args.steps
    mode["extra"] = args.set
    names = [n.strip() for n in (args.variants or ("baseline,async-1w" if args.quick else ",".join(DEFAULT)))
             .split(",") if n.strip()]
    unknown = set(names) - set(ALL)
    if unknown:
        ap.error(f"unknown variants {sorted(unknown)}; choose from {ALL}")
    from hubgrpo.config import load_config

    cfg = load_config(ROOT / mode["config"], overrides=[*mode["set"], *args.set])
    batch = cfg.params.per_device_train_batch_size * cfg.params.gradient_accumulation_steps
    mode["samples"] = mode["steps"] * batch  # the baseline's samples: every variant is compared at (at most) these
    tmp = Path(tempfile.mkdtemp(prefix="hubgrpo-learning-"))
    seeds = [int(x) for x in (args.seeds or ("0,1,2" if mode_name == "quick" and not args.quick else "0")).split(",")]
    results = []
    for seed in seeds:
        for name in names:
            print(f"== {name} seed {seed}", flush=True)
            single = name == "baseline" or name in SYNC or name in SINGLE
            results.append(run_baseline(mode, tmp, seed, name) if single else run_variant(name, mode, tmp, seed))
    initial = evaluate(results, mode, tmp)
    for r in results:
        if r.get("rounds_submitted"):
            cfg = variant_config(r["name"], mode)
            r["samples_generated"] = r["rounds_submitted"] * cfg.rounds.steps * cfg.params.per_device_train_batch_size
    out = results_dir(args, __file__)
    out.mkdir(parents=True, exist_ok=True)
    stem = args.name or ("learning" if mode_name == "quick" else f"learning-{mode_name}")
    report = {"mode": mode_name, "config": mode["config"], "steps": mode["steps"], "batch": batch,
              "eval": mode["eval"], "greedy": mode["greedy"], "repeats": mode["repeats"], "seeds": seeds,
              "initial": initial, "png": f"{stem}.png", "overrides": args.set,
              "summary": summarise(results), "results": results}
    plot(results, out / f"{stem}.png", f"hubgrpo vs single-process GRPO at equal samples ({mode['config']})")
    write(out, stem, report, to_markdown(report), meta, headline(report))
    print(to_markdown(report))
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
