"""A round's per-step log: TRL's logs as ``StepMetrics``, and the library versions every submission records."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from transformers import TrainerCallback

from hubgrpo import __version__
from hubgrpo.layout import StepMetrics

StepCallback = Callable[[int, dict], None]  # (optimizer step, StepMetrics fields as a dict)


def _opt(x: Any) -> float | None:
    """A logged number as a finite float, or None (TRL logs NaN for e.g. the std of a single sample)."""
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) and abs(x) <= 1e9 else None


def library_versions() -> dict[str, str]:
    """Versions recorded in every submission."""
    import platform

    import peft
    import transformers
    import trl

    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "trl": trl.__version__,
        "peft": peft.__version__,
        "hubgrpo": __version__,
        "python": platform.python_version(),
    }


class StepRecorder(TrainerCallback):
    """Turns TRL's per-step logs into ``StepMetrics`` and calls the round's ``on_step``."""

    def __init__(self) -> None:
        self.steps: list[StepMetrics] = []
        self.on_step: StepCallback | None = None

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or "reward" not in logs:  # the end-of-train summary has no reward
            return
        m = StepMetrics(
            step=int(state.global_step),
            reward=_opt(logs["reward"]) or 0.0,  # None/NaN: nothing was scorable
            reward_std=_opt(logs.get("reward_std")),
            loss=_opt(logs.get("loss")),
            kl=_opt(logs.get("kl")),
            clip_ratio=_opt(logs.get("clip_ratio/region_mean")),
            entropy=_opt(logs.get("entropy")),
            grad_norm=_opt(logs.get("grad_norm")),
            completion_length=_opt(logs.get("completions/mean_length")),
            step_time=_opt(logs.get("step_time")),
        )
        self.steps.append(m)
        if self.on_step is not None:
            self.on_step(m.step, m.model_dump())
