"""``hubgrpo train``: plain single-process GRPO with the same config — the synchronous baseline.

No bucket, no coordinator: one ``RoundEngine`` runs one long "round" from the version-0 adapter (the same start
as a distributed run) on prompts ``0 … steps × prompts_per_step − 1`` (the coordinator's counter, in the same
order), then writes a PEFT adapter folder::

    adapter_model.safetensors, adapter_config.json   loadable with PeftModel.from_pretrained
    README.md                                        model card (reward table)
    metrics.json                                     per-step metrics, greedy eval before/after, timings
    hubgrpo.yaml                                     the resolved config (secrets left out)
    checkpoints/step-NNNNNN/                         with ``save_every=K``: the adapter after every K steps
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from hubgrpo.card import render_model_card
from hubgrpo.config import Config, to_yaml
from hubgrpo.layout import CONFIG_FILE, MODEL_CARD, StepMetrics

METRICS_FILE = "metrics.json"
CHECKPOINTS = "checkpoints"


@dataclass
class TrainOutcome:
    """Where ``train`` wrote its adapter, and what it measured."""

    output: Path
    step_metrics: list[StepMetrics]
    eval_before: float | None
    eval_after: float | None
    timings: dict[str, float]
    # wall clock (Unix time) at the end of each step, less the time spent writing --save-every checkpoints before it
    step_ended_at: list[float] = field(default_factory=list)


def prompts_per_step(cfg: Config) -> int:
    """Distinct prompts one optimizer step consumes: batch × accumulation / group size."""
    p = cfg.params
    return max(1, p.per_device_train_batch_size * p.gradient_accumulation_steps // p.num_generations)


def reward_windows(steps: list[StepMetrics], n_windows: int = 6) -> list[dict]:
    """Mean reward over up to ``n_windows`` equal runs of consecutive steps (the card's reward table)."""
    if not steps:
        return []
    size = max(1, -(-len(steps) // n_windows))
    rows = []
    for i in range(0, len(steps), size):
        chunk = steps[i : i + size]
        rows.append(
            {
                "steps": f"{chunk[0].step}–{chunk[-1].step}",
                "reward (train, sampled)": sum(m.reward for m in chunk) / len(chunk),
            }
        )
    return rows


@contextmanager
def progress_bar(total: int, enabled: bool = True) -> Iterator[Callable[[int, dict], None]]:
    """Progress of a ``total``-step training, as an ``on_step`` callback: a rich bar (step, last reward) on a
    terminal; elsewhere (a file, a CI log) one plain line per step, at most one every ``LINE_EVERY_S`` seconds."""
    if not enabled:
        yield lambda step, metrics: None
        return
    if not sys.stderr.isatty():
        yield _line_progress(total)
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = [
        TextColumn("GRPO"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("reward {task.fields[reward]}"),
        TimeElapsedColumn(),
    ]
    with Progress(*columns, transient=False) as bar:
        task = bar.add_task("train", total=total, reward="–")

        def on_step(step: int, metrics: dict) -> None:
            bar.update(task, completed=step, reward=f"{metrics['reward']:.3f}")

        yield on_step


LINE_EVERY_S = 2.0


def _line_progress(total: int) -> Callable[[int, dict], None]:
    start = last = time.perf_counter()

    def on_step(step: int, metrics: dict) -> None:
        nonlocal last
        now = time.perf_counter()
        if step in (1, total) or now - last >= LINE_EVERY_S:
            last = now
            print(
                f"GRPO step {step}/{total}  reward {metrics['reward']:.3f}  {now - start:.0f} s",
                file=sys.stderr,
                flush=True,
            )

    return on_step


def checkpoint_path(output: Path, step: int) -> Path:
    return Path(output) / CHECKPOINTS / f"step-{step:06d}"


def run_params(engine, steps: int) -> dict | None:
    """The engine's params with ``rounds.lr_schedule`` as the scheduler of ``steps`` steps: cosine →
    transformers' cosine_with_min_lr down to ``rounds.lr_final``, wsd → its warmup_stable_decay (the curves a run
    follows over its versions); None: as they are."""
    r = engine.cfg.rounds
    if r.lr_schedule == "constant":
        return None
    if r.lr_schedule == "wsd":
        warmup, decay = r.wsd_steps(steps)
        engine.trainer.args.lr_scheduler_kwargs = {
            "num_decay_steps": decay,
            "min_lr_ratio": r.lr_final,
            "warmup_type": "linear",
            "decay_type": "cosine",
        }
        return {**engine.params, "lr_scheduler_type": "warmup_stable_decay", "warmup_steps": warmup}
    engine.trainer.args.lr_scheduler_kwargs = {"min_lr_rate": r.lr_final}
    return {**engine.params, "lr_scheduler_type": "cosine_with_min_lr"}


def train(
    cfg: Config,
    *,
    steps: int | None = None,
    output: str | Path | None = None,
    eval_samples: int = 16,
    progress: bool = True,
    log: Callable[[str], None] | None = None,
    save_every: int = 0,
) -> TrainOutcome:
    """Train ``steps`` GRPO steps (default: rounds.steps × rounds.versions) and write the adapter folder (and, with
    ``save_every=K``, the adapter after every K steps under ``checkpoints/``)."""
    from hubgrpo.worker.engine import RoundEngine

    steps = steps if steps is not None else cfg.rounds.steps * cfg.rounds.versions
    out = Path(output) if output else Path("runs") / cfg.project_name / "train"
    t0 = time.perf_counter()
    engine = RoundEngine(cfg, worker="train", log=log)  # holds the version-0 adapter after construction
    before = engine.evaluate(n=eval_samples) if eval_samples else None
    rows = engine.prompt_rows(range(steps * prompts_per_step(cfg)))
    with progress_bar(steps, enabled=progress) as show:
        ended, saving = [], [0.0]  # saving: seconds spent writing --save-every checkpoints so far

        def on_step(step: int, metrics: dict) -> None:
            ended.append(time.time() - saving[0])
            show(step, metrics)
            if save_every and step % save_every == 0:
                t = time.perf_counter()
                engine.save_adapter(checkpoint_path(out, step))
                saving[0] += time.perf_counter() - t

        result = engine.train_steps(
            rows, steps, seed=cfg.params.seed, on_step=on_step, params=run_params(engine, steps)
        )
    after = engine.evaluate(n=eval_samples) if eval_samples else None
    engine.save_adapter(out)
    timings = {"setup": engine.setup_seconds, **result.timings, "total": time.perf_counter() - t0}
    outcome = TrainOutcome(out, result.step_metrics, before, after, timings, ended)
    _write_outputs(cfg, outcome, result.samples, result.tokens, engine.device_name)
    return outcome


def _write_outputs(cfg: Config, o: TrainOutcome, samples: int, tokens: int, device: str) -> None:
    metrics = {
        "project_name": cfg.project_name,
        "base_model": cfg.base_model,
        "steps": len(o.step_metrics),
        "samples": samples,
        "tokens": tokens,
        "device": device,
        "eval": {
            "samples": None if o.eval_before is None else "greedy, held-out",
            "before": o.eval_before,
            "after": o.eval_after,
        },
        "timings": o.timings,
        "step_metrics": [m.model_dump() for m in o.step_metrics],
        "step_ended_at": o.step_ended_at,
    }
    (o.output / METRICS_FILE).write_text(json.dumps(metrics, indent=1))
    (o.output / CONFIG_FILE).write_text(to_yaml(cfg, drop_secrets=True))
    rows = reward_windows(o.step_metrics)
    if o.eval_before is not None:
        rows += [
            {"steps": "before training", "reward (eval, greedy)": o.eval_before},
            {"steps": "after training", "reward (eval, greedy)": o.eval_after},
        ]
    body = (
        f"Single-process GRPO baseline (`hubgrpo train`): {len(o.step_metrics)} steps, {samples} completions "
        f"on {device}, {o.timings['total']:.0f} s."
    )
    card = render_model_card(cfg, title=f"{cfg.project_name} (hubgrpo train)", reward_rows=rows, body=body)
    (o.output / MODEL_CARD).write_text(card)
