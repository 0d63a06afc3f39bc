"""The ``merge`` section: how the coordinator turns submitted rounds into the next global adapter."""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from hubgrpo.config.methods import BY_NAME, MergeMethod
from hubgrpo.config.section_base import _Section

OUTER_LR_MAX = 10.0  # a merge's outer learning rate: above this a version only amplifies its rounds' noise


class MergeSection(_Section):
    """How the coordinator turns submissions into the next global adapter."""

    method: Literal["svd", "stack", "ffa", "naive"] = Field(
        "ffa",
        description="svd: exact mean of the updates, re-factorised to rank r; stack: FLoRA; ffa: FFA-LoRA "
        "(A frozen); naive: factor averaging, a baseline (docs/architecture.md, 'The merge').",
    )
    outer_lr: float = Field(
        1.0, gt=0, le=OUTER_LR_MAX, description="Outer learning rate applied to the mean update (DiLoCo: 0.7)."
    )
    fleet_outer_lr: float | None = Field(
        1.5,
        gt=0,
        le=OUTER_LR_MAX,
        description="The outer learning rate while two or more workers are live (distinct workers that leased or "
        "renewed a lease within lease_timeout_s); one machine alone keeps outer_lr. 1.5: a fleet's rounds reach the "
        "target sooner, with fewer samples (benchmarks/scaleout/results/scaleout-mixed-outer15, "
        "benchmarks/speedup/results/speedup-real-addition-mixed-fleet15); it follows the learning-rate schedule "
        "(fleet_outer_lr_decays); too far at high learning rates "
        "(configs/demo.yaml). None = outer_lr for any fleet.",
    )
    fleet_outer_lr_decays: bool = Field(
        True,
        description="True: the fleet's step above outer_lr is scaled by the learning-rate schedule (rounds.lr_scale "
        "of the version being merged): under wsd, fleet_outer_lr until the decay, then down towards outer_lr "
        "(outer_lr + (fleet_outer_lr - outer_lr) × lr_final at the last version), where a fixed step lowers the "
        "score of a run of equal samples (benchmarks/learning/results/learning-mixed-fleetdecay-pooled against "
        "learning-mixed-fleet15-pooled); it rises with the rate over an lr_warmup and falls over the whole run "
        "under cosine; constant: no change. False: fleet_outer_lr from the first version to the last.",
    )
    outer_momentum: float = Field(0.0, ge=0, lt=1, description="Outer momentum (DiLoCo: 0.9); 0 = none.")
    nesterov: bool = Field(False, description="Nesterov form of the outer momentum.")
    momentum_every: int = Field(
        1,
        ge=1,
        le=1024,
        description="Delayed Nesterov (Liu et al. 2024): the outer momentum is updated every k-th "
        "merge, with the mean of the k outer gradients; the merges in between step by their own gradient only. "
        "1 = every merge.",
    )
    max_staleness: int = Field(
        4,
        ge=0,
        description="Submissions more than this many versions old are refused "
        "(raised with the fleet by staleness_per_worker, unless that is 0).",
    )
    staleness_per_worker: float = Field(
        2.0,
        ge=0,
        le=64,
        description="Raise max_staleness to this many versions per live worker (distinct workers "
        "that leased or renewed a lease within lease_timeout_s), at most max_lease_age: with N machines a round is "
        "about N − 1 versions old when it arrives, so a fixed limit refuses the rounds of every machine once the "
        "fleet outgrows it. 0 = off.",
    )
    staleness_decay: float = Field(0.5, ge=0, description="Weight ∝ samples · (1+τ)^(−decay).")
    staleness_scaling: Literal["relative", "absolute"] = Field(
        "relative",
        description="relative: (1+τ)^(−decay) only weighs the submissions of one merge against each other "
        "(with quorum 1 it does nothing); absolute: it also scales the step (FedAsync: a stale round moves the "
        "global less).",
    )
    quorum: int = Field(1, gt=0, description="Merge as soon as this many admitted submissions are in.")
    extra_rounds: Literal["average", "add"] = Field(
        "average",
        description="A merge takes every admitted submission pending, so n > quorum when some arrived "
        "while the last merge ran. average: the version moves by their weighted mean (one quorum's worth); add: by "
        "n / quorum times it, as if they had been merged a quorum at a time (FedBuff with a buffer of quorum), n "
        "counting at most one round per distinct worker.",
    )
    clip_factor: float | None = Field(
        None, gt=0, description="Clip each update norm to clip_factor × median; None = off."
    )
    max_norm_factor: float | None = Field(
        5.0,
        gt=0,
        description="Refuse an update whose norm per step exceeds this × the typical recent round (the "
        "median over participants of their own medians; a bound from history, not from the current quorum); "
        "None = off.",
    )
    min_norm_factor: float | None = Field(
        0.05,
        ge=0,
        lt=1,
        description="A round whose update norm per step is below this × the typical recent round "
        "(scaled by its lease's learning rate ÷ params.learning_rate), or exactly zero, is merged "
        "with weight 0 and earns no leaderboard credit: it moved the model by less than a twentieth of a typical "
        "step (no training, or GRPO groups that all got the same reward). None or 0: only exactly-zero updates.",
    )
    trim_fraction: float = Field(
        0.0, ge=0, lt=0.5, description="Drop this share of largest-norm updates before the mean."
    )
    max_rank: int | None = Field(None, gt=0, description="stack: rank cap before falling back to svd.")
    svd_algorithm: Literal["auto", "exact", "randomized"] = Field("auto", description="Re-factorisation algorithm.")
    factor_split: Literal["balanced", "keep_a"] = Field(
        "balanced",
        description="svd: split the re-factorised update evenly between B and A (balanced), or keep A's "
        "row norms at the global's so the next round's B learns at its usual speed (keep_a).",
    )
    rebase: bool = Field(
        True,
        description="ffa only: a worker moves its round onto each newer version between steps (B += B_new − "
        "B_base, exact because A is frozen), so its later steps train on the newer model; its update and staleness "
        "count from the version it moved onto. Unset: on with ffa, off with the other methods.",
    )
    rebase_after_generation: bool = Field(
        False,
        description="rebase only: also move onto a newer version between a step's generation and its "
        "backward, so the gradient is taken at the newer model (on completions sampled from the older one); a "
        "round of one step can then move too.",
    )
    max_lease_age: int = Field(
        32,
        ge=0,
        le=10**6,
        description="rebase: a round whose lease is more than this many versions old is refused "
        "whatever version it says it moved onto (that version is the worker's word; its lease is the coordinator's); "
        "about the versions one round of the slowest worker spans: raise it for fleets of more than ~16 machines. "
        "Also the most staleness_per_worker may raise max_staleness to (worker names are free: this bounds it).",
    )
    max_submission_mb: float = Field(
        512,
        gt=0,
        description="Submissions larger than this are refused (also "
        "anything larger than the global adapter's own size allows).",
    )
    eval_gate: float | None = Field(
        None,
        ge=0,
        description="When the newest held-out score (hubgrpo evaluate) is more than this margin below "
        "the best so far, the next merge starts from the best version instead; None = off.",
    )

    @model_validator(mode="before")
    @classmethod
    def _rebase_follows_method(cls, data: Any) -> Any:
        """An unset ``rebase`` is on with a frozen lora_A (ffa) and off otherwise: ``merge: {method: svd}`` alone is
        a valid merge."""
        if not isinstance(data, dict) or data.get("rebase") is not None:
            return data
        data = {k: v for k, v in data.items() if k != "rebase"}
        method = data.get("method", "ffa")
        frozen_a = isinstance(method, str) and method in BY_NAME and BY_NAME[method].frozen_a
        return data if frozen_a else {**data, "rebase": False}

    @field_validator("method")
    @classmethod
    def _no_stack_in_runs(cls, v: str) -> str:
        if not BY_NAME[v].in_runs:
            raise ValueError(
                "'stack' grows the adapter's rank after version 1, so workers could not load the "
                "global adapter and every submission would be refused; use svd or ffa in a run "
                "(stack remains available in `hubgrpo merge`)"
            )
        return v

    @property
    def merge_method(self) -> MergeMethod:
        """The ``MergeMethod`` that ``method`` names (``hubgrpo.config.methods``)."""
        return BY_NAME[self.method]

    def fleet_lr(self, live_workers: int, lr_scale: float = 1.0) -> float:
        """The outer learning rate while ``live_workers`` distinct workers hold leases: fleet_outer_lr from two on
        (when set), else outer_lr; with fleet_outer_lr_decays, its excess over outer_lr times ``lr_scale`` (the
        schedule's learning rate at the version being merged, as a fraction of the peak)."""
        if self.fleet_outer_lr is None or live_workers < 2:
            return self.outer_lr
        if not self.fleet_outer_lr_decays:
            return self.fleet_outer_lr
        return self.outer_lr + (self.fleet_outer_lr - self.outer_lr) * min(1.0, max(0.0, lr_scale))

    def staleness_limit(self, live_workers: int) -> int:
        """The staleness admitted while ``live_workers`` distinct workers hold leases: max_staleness, raised to
        ⌈staleness_per_worker × live_workers⌉ but not above max_lease_age."""
        scaled = math.ceil(self.staleness_per_worker * max(0, live_workers) - 1e-9)  # 0.7 × 10 is 7, not 8
        return max(self.max_staleness, min(scaled, self.max_lease_age))

    def lease_age_limit(self) -> int:
        """How many versions old a round's lease may be when it is submitted: the largest staleness limit, or with
        rebase (where the staleness counts from the version the worker says it moved onto) max_lease_age."""
        return max(self.max_lease_age, self.max_staleness) if self.rebase else self.staleness_limit(10**6)

    @model_validator(mode="after")
    def _rebase_needs_ffa(self):
        if self.rebase and not self.merge_method.frozen_a:
            raise ValueError(
                f"merge.rebase moves a round onto a newer version exactly only when lora_A is frozen; "
                f"set merge.method: ffa, or merge.rebase: false (method is {self.method!r})"
            )
        return self
