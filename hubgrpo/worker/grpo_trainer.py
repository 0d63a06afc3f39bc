"""TRL's GRPOTrainer as a round engine builds it: its arguments, its LoRA, and the counters around its generation.

A lease's ``params`` split in two: ``ROUND_PARAMS`` a running trainer picks up at its next ``train()``, the rest are
fixed when the trainer is built (a change rebuilds it). The worker's own settings (``cfg.worker``) are no params.

``GenerationMeter`` wraps the trainer's ``_generate`` (tokenising, sampling, decoding) to count its seconds, the
completions and their tokens.

Every ``Trainer.train()`` starts with accelerate's ``free_memory()``, a full ``gc.collect()`` that walks every object
of the loaded model and libraries, and Python's own full collections walk them again during training.
``frozen_heap`` leaves what existed before a round out of those collections: what the round allocates is collected as
usual, and the freeze is undone after the round, so nothing that dies later is kept.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from peft import LoraConfig
from trl import GRPOConfig, GRPOTrainer

from hubgrpo.config import LoraSection
from hubgrpo.errors import ConfigError

# params a running trainer picks up at the next train() call; any other change rebuilds the trainer
ROUND_PARAMS = {
    "learning_rate",
    "lr_scheduler_type",
    "warmup_steps",
    "weight_decay",
    "max_grad_norm",
    "seed",
    "max_prompt_length",
}
# ParamsConfig fields passed to GRPOConfig as they are
GRPO_FIELDS = (
    "learning_rate",
    "lr_scheduler_type",
    "warmup_steps",
    "weight_decay",
    "max_grad_norm",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "num_generations",
    "max_completion_length",
    "temperature",
    "top_p",
    "beta",
    "epsilon",
    "epsilon_high",
    "loss_type",
    "scale_rewards",
    "num_iterations",
    "mask_truncated_completions",
)
# the optimizer's params a round sets on a running trainer's arguments
SCHEDULE_ARGS = ("learning_rate", "lr_scheduler_type", "warmup_steps", "weight_decay", "max_grad_norm")


@contextmanager
def frozen_heap():
    """Keep the objects that exist now out of the garbage collector's passes until the block ends
    (``gc.freeze``); a no-op when something else froze the heap already (its freeze is left as it is)."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def grpo_config(
    params: dict, max_steps: int, *, output_dir: str, device: str, dtype: torch.dtype, reward_weights: list[float]
) -> GRPOConfig:
    """TRL's arguments for ``params`` on ``device``; ``ConfigError`` when TRL refuses them."""
    cuda = device.startswith("cuda")
    try:
        return GRPOConfig(
            output_dir=output_dir,
            use_cpu=device == "cpu",
            bf16=cuda and dtype == torch.bfloat16,
            fp16=cuda and dtype == torch.float16,
            activation_checkpointing=False,
            report_to="none",
            save_strategy="no",
            disable_tqdm=True,
            logging_steps=1,
            log_completions=False,
            max_steps=max(1, max_steps),
            seed=params["seed"],
            reward_weights=reward_weights,
            dataloader_num_workers=0,
            **{k: params[k] for k in GRPO_FIELDS},
        )
    except ValueError as e:
        raise ConfigError(
            f"TRL refused the GRPO parameters: {e}",
            hint="per_device_train_batch_size × gradient_accumulation_steps must be a multiple of num_generations",
        ) from None


def lora_config(lc: LoraSection) -> LoraConfig:
    """PEFT's LoRA config for the config's ``lora`` section (a causal language model)."""
    return LoraConfig(
        r=lc.r,
        lora_alpha=lc.alpha,  # type: ignore[arg-type]  # peft annotates int; any number works (alpha / r)
        lora_dropout=lc.dropout,
        target_modules=lc.target_modules,
        use_rslora=lc.use_rslora,
        task_type="CAUSAL_LM",
    )


def freeze_lora_a(model: Any) -> None:
    """FFA-LoRA: A stays the version-0 draw everywhere, only B trains."""
    for name, param in model.named_parameters():
        if "lora_A" in name:
            param.requires_grad_(False)


@dataclass
class GenerationMeter:
    """Seconds in a trainer's generation, the completions it made and their prompt + completion tokens."""

    seconds: float = 0.0
    samples: int = 0
    tokens: int = 0

    def reset(self) -> None:
        self.seconds, self.samples, self.tokens = 0.0, 0, 0

    def wrap(self, trainer: GRPOTrainer, after: Callable[[], None] | None = None) -> None:
        """Count every ``trainer._generate`` call; ``after()`` runs once each has returned."""
        generate = trainer._generate

        def timed_generate(prompts: list) -> Any:
            t = time.perf_counter()
            out = generate(prompts)
            self.seconds += time.perf_counter() - t
            prompt_ids, completion_ids = out[0], out[1]
            self.samples += len(completion_ids)
            self.tokens += sum(map(len, prompt_ids)) + sum(map(len, completion_ids))
            if after is not None:
                after()
            return out

        setattr(trainer, "_generate", timed_generate)  # an instance attribute: TRL calls self._generate(prompts)
