"""Per-round progress output for workers: a live bar on a terminal, one line per step otherwise."""

from __future__ import annotations

import sys

from hubgrpo.layout import Lease


def round_progress(name: str, lease: Lease):
    """An ``on_step(step, metrics)`` callback showing step, reward and loss for one leased round."""
    from rich.console import Console

    console = Console(stderr=True)
    tty = sys.stderr.isatty()

    def on_step(step: int, metrics: dict) -> None:
        reward = metrics.get("reward")
        loss = metrics.get("loss")
        bar = ""
        if tty:
            done = int(20 * step / max(1, lease.steps))
            bar = "[" + "#" * done + "." * (20 - done) + "] "
        text = (
            f"{name} v{lease.base_version} {bar}step {step}/{lease.steps}  reward {reward:.3f}"
            if reward is not None
            else f"{name} step {step}/{lease.steps}"
        )
        if loss is not None:
            text += f"  loss {loss:.4f}"
        console.print(text, highlight=False, end="\r" if tty and step < lease.steps else "\n")

    return on_step
