"""Do rounds trained from one base add up? The agreement of K workers' round updates, against rounds in sequence.

    python benchmarks/merge/round_agreement.py --config configs/tiny.yaml [--rounds 4] [--bases 0,3]
    python benchmarks/merge/round_agreement.py --config configs/demo.yaml --rounds 3 --name round-agreement-demo
    python benchmarks/merge/round_agreement.py --quick   # the script checked: tiny, 2 one-step rounds from v0

For each base (the version-0 adapter, then the adapter after m rounds trained one after another from it), K
rounds are trained from that same base on K different prompt shards and seeds, as K workers would; a round's
update is ΔW = scale·(B·A − B_base·A_base) over every LoRA module (inner products computed on the factors, never
on the dense matrices). Reported per base: the mean pairwise cosine of the K updates, and ‖mean ΔW‖ ÷ mean ‖ΔW‖ (1 when they
agree, 1/√K when they are orthogonal: averaging K of them then moves the model √K× less than one round);
and, for K rounds in sequence from version 0, the cosine between consecutive rounds' updates. Every round starts
with a fresh AdamW, so the two settings differ only in the base each round starts from. The real round engine
trains the rounds (``RoundEngine.train_steps``: TRL GRPO + PEFT), one model in memory.

Writes results/<name>.{md,json}.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.common import options, results_dir, start, write  # noqa: E402


def factors(state: dict) -> dict:
    """{module prefix: (B, A)} of a PEFT state dict, in float64."""
    out = {}
    for k, a in state.items():
        if "lora_A" in k:
            out[k.replace("lora_A", "")] = (state[k.replace("lora_A", "lora_B")].double(), a.double())
    return out


def inner(x: list, y: list) -> float:
    """⟨Σ c·B·A, Σ d·C·D⟩ of two updates given as [(coef, {module: (B, A)})]: tr((BᵀC)(DAᵀ)) per module."""
    total = 0.0
    for (c, fx), (d, fy) in itertools.product(x, y):
        for m, (b, a) in fx.items():
            cm, dm = fy[m]
            total += c * d * float(((b.T @ cm) * (a @ dm.T)).sum())
    return total


def cos(x: list, y: list) -> float:
    return inner(x, y) / max(1e-30, (inner(x, x) * inner(y, y)) ** 0.5)


class Trainer:
    """The round engine with fresh AdamW per round and disjoint prompt shards."""

    def __init__(self, cfg, work: Path):
        from hubgrpo.worker.engine import RoundEngine

        self.cfg, self.work = cfg, work
        self.engine = RoundEngine(cfg, worker="agreement")
        self.scale = cfg.lora.alpha / (cfg.lora.r ** 0.5 if cfg.lora.use_rslora else cfg.lora.r)
        p = cfg.params
        self.per_round = cfg.rounds.steps * p.per_device_train_batch_size // p.num_generations  # prompts
        self.shard = 0

    def state(self) -> dict:
        return factors({k: v.detach().clone() for k, v in self.engine._adapter_state().items()})

    def round_from(self, base: Path | None, seed: int) -> dict:
        """Train one round (from ``base`` when given, else from the model's current adapter); the new factors."""
        if base is not None:
            self.engine.load_adapter(base)
        rows = self.engine.prompt_rows(range(self.shard * self.per_round, (self.shard + 1) * self.per_round))
        self.shard += 1
        self.engine._fresh_optimizer = True  # every round: a fresh AdamW
        self.engine.train_steps(rows, self.cfg.rounds.steps, seed=seed)
        return self.state()

    def save(self, name: str) -> Path:
        return self.engine.save_adapter(self.work / name)


def update(new: dict, base: dict, scale: float) -> list:
    return [(scale, new), (-scale, base)]


def agreement(updates: list[list]) -> dict:
    pairs = [cos(a, b) for a, b in itertools.combinations(updates, 2)]
    mean = [(c / len(updates), f) for u in updates for c, f in u]
    norms = [inner(u, u) ** 0.5 for u in updates]
    return {"pairwise_cos_mean": statistics.mean(pairs), "pairwise_cos_min": min(pairs),
            "pairwise_cos_max": max(pairs), "mean_norm_ratio": inner(mean, mean) ** 0.5 / statistics.mean(norms),
            "orthogonal_ratio": 1 / len(updates) ** 0.5, "update_norm_mean": statistics.mean(norms)}


def measure(cfg, k: int, bases: list[int], work: Path) -> dict:
    t = Trainer(cfg, work)
    v0 = t.engine.init_adapter(work / "v0")
    chain, seq = [t.state()], []  # init_adapter left the model at version 0
    for j in range(max([k, *bases])):  # rounds one after another from v0
        chain.append(t.round_from(None, seed=1000 + j))
        t.save(f"seq{j + 1}")
        seq.append(update(chain[-1], chain[-2], t.scale))
    out = {"sequential_consecutive_cos": [cos(a, b) for a, b in zip(seq[:k], seq[1:k])],
           "sequential": agreement(seq[:k]), "bases": {}}
    for m in bases:
        base = v0 if m == 0 else work / f"seq{m}"
        ups = [update(t.round_from(base, seed=2000 + 100 * m + i), chain[m], t.scale) for i in range(k)]
        out["bases"][str(m)] = agreement(ups)
    return out


def markdown(res: dict) -> str:
    a = res["args"]
    lines = ["# Do rounds from one base add up?", "",
             f"Config `{a['config']}`{' with ' + ', '.join(a['set']) if a['set'] else ''}; K = {a['rounds']} rounds "
             f"of {res['steps_per_round']} GRPO steps, fresh AdamW each; {res['wall_s']:.0f} s.", "",
             "| rounds | pairwise cosine mean (min – max) | ‖mean ΔW‖ ÷ mean ‖ΔW‖ (1 = aligned, 1/√K = orthogonal) |",
             "|---|---|---|"]
    rows = [(f"{a['rounds']} in parallel from the base after {m} sequential rounds", r)
            for m, r in res["result"]["bases"].items()]
    rows.append((f"{a['rounds']} in sequence from version 0", res["result"]["sequential"]))
    for label, r in rows:
        lines.append(f"| {label} | {r['pairwise_cos_mean']:.3f} ({r['pairwise_cos_min']:.3f} – "
                     f"{r['pairwise_cos_max']:.3f}) | {r['mean_norm_ratio']:.3f} (1/√K = {r['orthogonal_ratio']:.3f}) |")
    consecutive = ", ".join(f"{c:.3f}" for c in res["result"]["sequential_consecutive_cos"])
    lines += ["", f"Cosine between consecutive sequential rounds' updates: {consecutive}."]
    return "\n".join(lines) + "\n"


def headline(res: dict) -> str:
    k = res["args"]["rounds"]
    return f"{k} rounds from one base: pairwise cosine of their updates " + ", ".join(
        f"{r['pairwise_cos_mean']:.3f} after {m} sequential rounds" for m, r in res["result"]["bases"].items())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/tiny.yaml")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--bases", default="0,3", help="comma-separated numbers of sequential rounds before the base")
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--name", default="round-agreement")
    options(ap, __file__)
    args = ap.parse_args()
    if args.quick:  # a check of the script: two one-step rounds of the tiny model, from version 0
        args.config, args.rounds, args.bases, args.set = "configs/tiny.yaml", 2, "0", ["rounds.steps=1"]
    if args.rounds < 2:
        ap.error("--rounds must be at least 2")
    meta = start(args.quick)
    from hubgrpo.config import load_config

    cfg = load_config(ROOT / args.config, overrides=args.set)
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="hubgrpo-agreement-") as tmp:
        result = measure(cfg, args.rounds, [int(b) for b in args.bases.split(",")], Path(tmp))
    res = {"args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}, "result": result,
           "steps_per_round": cfg.rounds.steps, "wall_s": time.time() - t0}
    write(results_dir(args, __file__), args.name, res, markdown(res), meta, headline(res))
    print(markdown(res))


if __name__ == "__main__":
    main()
