"""The ``rounds`` section: the run's schedule, set by the run's owner and carried by the coordinator in its leases
(a round's steps, the fleet's batch, the run's length and its learning rate over the versions)."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, model_validator

from hubgrpo.config.section_base import _Section


class RoundsSection(_Section):
    """The run's schedule, set by its owner and carried in leases: rounds, run length, learning rate over the run."""

    steps: int = Field(
        1,
        gt=0,
        description="GRPO optimizer steps a worker runs per lease (1: a round "
        "per step, so with merge.rebase every step trains on a model seconds old).",
    )
    fleet_batch: Literal["per_worker", "split"] = Field(
        "per_worker",
        description="per_worker: every worker's step takes params.per_device_train_batch_size completions "
        "(N machines sample N × the batch of one per round of steps). split: that batch is the "
        "fleet's (the data-parallel convention), shared by the live workers the coordinator counts: a lease's "
        "steps take ⌈batch ÷ num_generations ÷ live workers⌉ prompt groups of num_generations completions, at "
        "least one (the lease carries that batch). `hubgrpo train` is one worker: unchanged.",
    )
    balance: bool = Field(
        False,
        description="Give faster workers more steps per lease (and slower ones "
        "fewer, at least 1, at most 4× rounds.steps) so that rounds take about as long "
        "everywhere; speeds are measured by the coordinator (lease to submit), not reported.",
    )
    stagger: bool = Field(
        False,
        description="A worker's first lease, granted while k other leases are "
        "live, gets a fraction (1/2, 1/4, 3/4, 1/8, ...) of rounds.steps, so that "
        "machines started together deliver evenly spread instead of all at once.",
    )
    versions: int = Field(10, gt=0, description="Stop the run after this many merged global versions.")
    schedule_versions: int | None = Field(
        None,
        gt=0,
        description="The count of versions the learning-rate schedule (lr_schedule) spans; None = rounds.versions. "
        "`hubgrpo simulate` sets it to the config's versions, as its own stop conditions replace them.",
    )
    lr_schedule: Literal["constant", "cosine", "wsd"] = Field(
        "wsd",
        description="The learning rate over the whole run: cosine falls from params.learning_rate to "
        "lr_final × learning_rate over the run's versions; wsd (warmup-stable-decay) rises linearly from "
        "lr_final × learning_rate over the first lr_warmup of them, stays at learning_rate, and falls "
        "(cosine) back over the last lr_decay. The coordinator writes the rate of a lease's base version into "
        "the lease (a round keeps it for all its steps); `hubgrpo train` applies the same curve over its steps. "
        "constant = learning_rate throughout.",
    )
    lr_final: float = Field(
        0.1,
        gt=0,
        le=1,
        description="lr_schedule: the last version's learning rate as a fraction of params.learning_rate (wsd: "
        "also the first).",
    )
    lr_warmup: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="lr_schedule wsd: the fraction of the run's versions (of train's steps) over which the rate rises.",
    )
    lr_decay: float = Field(
        0.3,
        ge=0,
        le=1,
        description="lr_schedule wsd: the fraction of the run's versions (of train's steps) over which the rate "
        "falls at the end.",
    )
    reset_optimizer: bool = Field(
        False, description="Fresh AdamW moments at every round (False: each worker keeps its moments across rounds)."
    )

    @model_validator(mode="after")
    def _wsd_fits(self):
        if self.lr_warmup + self.lr_decay > 1:
            raise ValueError(
                f"rounds.lr_warmup ({self.lr_warmup:g}) + rounds.lr_decay "
                f"({self.lr_decay:g}) exceed 1: the warmup and the decay must fit in the run"
            )
        return self

    def wsd_steps(self, total: int) -> tuple[int, int]:
        """wsd over ``total`` steps (or versions): the warmup's and the decay's number of them."""
        warmup = math.ceil(self.lr_warmup * total)
        return warmup, min(total - warmup, math.ceil(self.lr_decay * total))

    def schedule_span(self) -> int:
        """The count of versions the learning-rate schedule spans: schedule_versions, else versions."""
        return self.schedule_versions or self.versions

    def lr_scale(self, version: int) -> float:
        """The learning rate of a round leased on ``version`` as a fraction of params.learning_rate
        (``lr_schedule``; transformers' curves — cosine_with_min_lr, warmup_stable_decay —, version v of
        ``schedule_span()`` standing for step v of as many steps)."""
        if self.lr_schedule == "constant":
            return 1.0
        final, span = self.lr_final, self.schedule_span()
        if self.lr_schedule == "wsd":
            warmup, decay = self.wsd_steps(span)
            if version < warmup:
                return final + (1 - final) * version / warmup
            into_decay = version - (span - decay)
            if into_decay < 0:
                return 1.0
            progress = min(1.0, into_decay / max(1, decay))
        else:
            progress = min(1.0, max(0.0, version / span))
        cosine = 0.5 * (1 + math.cos(math.pi * progress))
        return final + (1 - final) * cosine
