"""The ``params`` section: GRPO's hyper-parameters, passed to TRL's GRPOConfig (the round's schedule is
``rounds``, the worker's machine ``worker``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from hubgrpo.config.section_base import _Section


class ParamsConfig(_Section):
    """GRPO's hyper-parameters (passed to TRL's GRPOConfig); a lease may set the learning rate and the batch."""

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
    seed: int = Field(0, description="Seed for prompts, shards and sampling.")

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
