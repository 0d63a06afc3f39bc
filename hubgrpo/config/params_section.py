"""The ``params`` section: GRPO's hyper-parameters (TRL's fields), the rounds, and the run's learning-rate
schedule."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, model_validator

from hubgrpo.config.section_base import _Section


class ParamsConfig(_Section):
    """GRPO hyper-parameters (passed to TRL's GRPOConfig) and the round schedule."""

    learning_rate: float = Field(1e-5, gt=0, description="Inner (worker) AdamW learning rate.")
    lr_scheduler_type: str = Field("constant", description="transformers scheduler name for each round.")
    warmup_steps: int = Field(0, ge=0, description="Warm-up steps at the start of each round.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient clipping norm.")
    per_device_train_batch_size: int = Field(
        8, gt=0, description="Completions per optimizer step (prompts × generations)."
    )
    gradient_accumulation_steps: int = Field(1, gt=0, description="Micro-batches per optimizer step.")
    num_generations: int = Field(4, ge=2, description="Completions sampled per prompt (the GRPO group size).")
    max_prompt_length: int | None = Field(256, gt=0, description="Prompts are truncated (left) to this many tokens.")
    max_completion_length: int = Field(64, gt=0, description="Maximum generated tokens per completion.")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling.")
    beta: float = Field(0.0, ge=0, description="KL coefficient; 0 = no reference model.")
    epsilon: float = Field(0.2, gt=0, description="Lower PPO clip range.")
    epsilon_high: float | None = Field(
        None, gt=0, description="Upper clip range (DAPO clip-higher: 0.28); None = epsilon."
    )
    loss_type: Literal["grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo"] = Field("dapo", description="TRL loss type.")
    scale_rewards: Literal["group", "batch", "none"] = Field("group", description="Advantage normalisation.")
    num_iterations: int = Field(1, gt=0, description="Optimisation passes per generation batch (μ).")
    mask_truncated_completions: bool = Field(False, description="Exclude truncated completions from the loss.")
    steps_per_round: int = Field(
        1,
        gt=0,
        description="GRPO optimizer steps a worker runs per lease (1: a round "
        "per step, so with merge.rebase every step trains on a model seconds old).",
    )
    fleet_batch: Literal["per_worker", "split"] = Field(
        "per_worker",
        description="per_worker: every worker's step takes per_device_train_batch_size completions "
        "(N machines sample N × the batch of one per round of steps). split: per_device_train_batch_size is the "
        "fleet's batch (the data-parallel convention), shared by the live workers the coordinator counts: a lease's "
        "steps take ⌈batch ÷ num_generations ÷ live workers⌉ prompt groups of num_generations completions, at "
        "least one (the lease carries that batch). `hubgrpo train` is one worker: unchanged.",
    )
    balance_rounds: bool = Field(
        False,
        description="Give faster workers more steps per lease (and slower ones "
        "fewer, at least 1, at most 4× steps_per_round) so that rounds take about as long "
        "everywhere; speeds are measured by the coordinator (lease to submit), not reported.",
    )
    stagger_rounds: bool = Field(
        False,
        description="A worker's first lease, granted while k other leases are "
        "live, gets a fraction (1/2, 1/4, 3/4, 1/8, ...) of steps_per_round, so that "
        "machines started together deliver evenly spread instead of all at once.",
    )
    versions: int = Field(10, gt=0, description="Stop the run after this many merged global versions.")
    run_lr_schedule: Literal["constant", "cosine", "wsd"] = Field(
        "wsd",
        description="The learning rate over the whole run: cosine falls from learning_rate to "
        "run_lr_final × learning_rate over the run's versions; wsd (warmup-stable-decay) rises linearly from "
        "run_lr_final × learning_rate over the first run_lr_warmup of them, stays at learning_rate, and falls "
        "(cosine) back over the last run_lr_decay. The coordinator writes the rate of a lease's base version into "
        "the lease (a round keeps it for all its steps); `hubgrpo train` applies the same curve over its steps. "
        "constant = learning_rate throughout.",
    )
    run_lr_final: float = Field(
        0.1,
        gt=0,
        le=1,
        description="run_lr_schedule: the last version's learning rate as "
        "a fraction of learning_rate (wsd: also the first).",
    )
    run_lr_warmup: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="run_lr_schedule wsd: the fraction of the run's "
        "versions (of train's steps) over which the rate rises.",
    )
    run_lr_decay: float = Field(
        0.3,
        ge=0,
        le=1,
        description="run_lr_schedule wsd: the fraction of the run's "
        "versions (of train's steps) over which the rate falls at the end.",
    )
    reset_optimizer: bool = Field(
        False, description="Fresh AdamW moments at every round (False: each worker keeps its moments across rounds)."
    )
    seed: int = Field(0, description="Seed for prompts, shards and sampling.")
    device: str = Field("auto", description="auto (cuda if available), cpu, cuda, cuda:1, mps.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="auto: bf16 on CUDA, fp32 on CPU."
    )
    num_threads: int | None = Field(None, gt=0, description="torch threads per worker; None = cores // local workers.")
    share_prompts: bool = Field(
        True,
        description="Compute each prompt once for its num_generations completions, when generating and in the "
        "loss's forward and backward (the same numbers up to float rounding); false: TRL's own path, which repeats "
        "the prompt for every completion.",
    )
    keyed_sampling: bool = Field(
        True,
        description="Sample every token as the argmax of its warped scores plus Gumbel noise keyed by the lease's "
        "seed, the completion's index in the round and its position (hubgrpo.proof): the same distribution as "
        "sampling, and a verifier holding the model can replay each choice; false: TRL's own random sampling.",
    )

    @model_validator(mode="after")
    def _batch_holds_groups(self):
        batch = self.per_device_train_batch_size * self.gradient_accumulation_steps
        if batch % self.num_generations:
            fits = sorted(
                {
                    batch - batch % self.num_generations or self.num_generations,
                    batch + self.num_generations - batch % self.num_generations,
                }
            )
            raise ValueError(
                f"per_device_train_batch_size × gradient_accumulation_steps ({batch}) is not a multiple "
                f"of num_generations ({self.num_generations}): a step must hold whole groups of "
                f"completions of one prompt; make the batch {' or '.join(map(str, fits))}"
            )
        return self

    @model_validator(mode="after")
    def _split_fits(self):
        if self.fleet_batch == "split" and self.per_device_train_batch_size % self.num_generations:
            raise ValueError(
                f"params.fleet_batch split shares per_device_train_batch_size "
                f"({self.per_device_train_batch_size}) out in prompt groups of num_generations "
                f"({self.num_generations}): make the batch a multiple of num_generations"
            )
        return self

    def worker_batch(self, live_workers: int) -> int:
        """Completions per step of one worker's round while ``live_workers`` workers are live
        (``fleet_batch``)."""
        if self.fleet_batch != "split" or live_workers <= 1:
            return self.per_device_train_batch_size
        groups = self.per_device_train_batch_size // self.num_generations
        return max(1, -(-groups // live_workers)) * self.num_generations

    @model_validator(mode="after")
    def _wsd_fits(self):
        if self.run_lr_warmup + self.run_lr_decay > 1:
            raise ValueError(
                f"params.run_lr_warmup ({self.run_lr_warmup:g}) + params.run_lr_decay "
                f"({self.run_lr_decay:g}) exceed 1: the warmup and the decay must fit in the run"
            )
        return self

    def wsd_steps(self, total: int) -> tuple[int, int]:
        """wsd over ``total`` steps (or versions): the warmup's and the decay's number of them."""
        warmup = math.ceil(self.run_lr_warmup * total)
        return warmup, min(total - warmup, math.ceil(self.run_lr_decay * total))

    def run_lr(self, version: int) -> float:
        """The learning rate of a round leased on ``version`` (``run_lr_schedule``; transformers' curves —
        cosine_with_min_lr, warmup_stable_decay —, version v of ``versions`` standing for step v of ``versions``)."""
        if self.run_lr_schedule == "constant":
            return self.learning_rate
        final = self.run_lr_final
        if self.run_lr_schedule == "wsd":
            warmup, decay = self.wsd_steps(self.versions)
            if version < warmup:
                return self.learning_rate * (final + (1 - final) * version / warmup)
            into_decay = version - (self.versions - decay)
            if into_decay < 0:
                return self.learning_rate
            progress = min(1.0, into_decay / max(1, decay))
        else:
            progress = min(1.0, max(0.0, version / self.versions))
        cosine = 0.5 * (1 + math.cos(math.pi * progress))
        return self.learning_rate * (final + (1 - final) * cosine)
