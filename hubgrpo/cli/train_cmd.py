"""``hubgrpo train CONFIG``: single-process GRPO (the synchronous baseline) into a PEFT adapter folder."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

SET_HELP = "Override a field, e.g. --set params.learning_rate=1e-4 (repeatable; value parsed as YAML)."


def train(
    config: Path = typer.Argument(..., help="YAML config file."),
    steps: int | None = typer.Option(
        None, "--steps", min=0, help="GRPO steps (default: rounds.steps × rounds.versions)."
    ),
    output: Path | None = typer.Option(
        None, "--output", "-o", help="Adapter folder (default: runs/<project_name>/train)."
    ),
    set_: list[str] = typer.Option([], "--set", help=SET_HELP),
    eval_samples: int = typer.Option(
        16, "--eval-samples", min=0, help="Held-out prompts scored greedily before and after (0 = skip)."
    ),
    save_every: int = typer.Option(
        0,
        "--save-every",
        min=0,
        help="Also write the adapter every K steps to OUTPUT/checkpoints/step-NNNNNN (0 = only the final one).",
    ),
) -> None:
    """Train with plain single-process GRPO + LoRA and write an adapter, model card and metrics.json."""
    from hubgrpo.cli.config_cmd import load_checked
    from hubgrpo.worker.train import train as run_train

    cfg = load_checked(config, set_)
    outcome = run_train(
        cfg,
        steps=steps,
        output=output,
        eval_samples=eval_samples,
        progress=True,
        log=lambda msg: typer.echo(msg, err=True),
        save_every=save_every,
    )
    rewards = [m.reward for m in outcome.step_metrics]
    k = max(1, min(10, len(rewards) // 3))
    if rewards:
        typer.echo(
            f"train reward: first {k} steps {sum(rewards[:k]) / k:.3f} → last {k} steps {sum(rewards[-k:]) / k:.3f}"
        )
    if outcome.eval_before is not None:
        typer.echo(
            f"eval reward (greedy, {eval_samples} held-out prompts): {outcome.eval_before:.3f} → "
            f"{outcome.eval_after:.3f}"
        )
    typer.echo(f"adapter written to {outcome.output} in {outcome.timings['total']:.1f}s")
    if cfg.hub.push_to_hub:
        typer.echo("note: hub.push_to_hub is set, but `hubgrpo train` only writes the local folder", err=True)
    sys.stdout.flush()


def register(app: typer.Typer) -> None:
    app.command("train")(train)
