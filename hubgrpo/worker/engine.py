"""One worker's round: GRPO steps with TRL's GRPOTrainer on a PeftModel, from a given adapter to a submission.

``RoundEngine`` keeps ONE GRPOTrainer across rounds (one trainer, many rounds): each
round loads the round's adapter into the trainer's PeftModel (``adapter_io.LiveAdapter``, after a strict
key/shape check), swaps in the round's prompts and step count, resets AdamW unless ``rounds.reset_optimizer`` is
false, trains, and saves only the "default" adapter. A lease whose ``params`` change something fixed at trainer
construction (batch shape, sampling, loss, KL…) rebuilds the trainer on a freshly loaded base model.

The KL reference (``beta > 0``) is the base model (the adapter disabled), as TRL does when it gets a peft_config.

TRL calls the reward functions through ``hubgrpo.worker.rollouts.RolloutRecorder`` (training rows carry their
prompt index): each round's folder gets ``rollouts.json.gz``, from which the coordinator recomputes the rewards.

Timing breakdown of a round (``Submission.timings``, seconds): ``load`` (adapter into the model), ``generate``
(TRL's ``_generate``: tokenising, sampling, decoding — measured by wrapping that method), ``reward`` (time inside
the reward functions), ``train`` (the rest of ``trainer.train()``: log-prob forward passes, backward, optimizer),
``save`` (adapter + submission.json), ``setup`` (trainer (re)build, when it happened this round), ``total``.

``train_steps`` runs ``trainer.train()`` inside ``frozen_heap`` (``hubgrpo.worker.grpo_trainer``).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from transformers import PrinterCallback, set_seed

from hubgrpo.card import adapter_base_name
from hubgrpo.config import Config, ParamsConfig
from hubgrpo.errors import DataError, LeaseError, ModelError
from hubgrpo.layout import ROLLOUTS_FILE, Lease, Submission, check_name
from hubgrpo.proof.sampling import KeyedSampling
from hubgrpo.task.data import PromptSource, truncate_prompt
from hubgrpo.task.rewards import load_rewards
from hubgrpo.task.rollouts import weighted_mean
from hubgrpo.worker.adapter_io import LiveAdapter, check_adapter
from hubgrpo.worker.decode import compile_decoding
from hubgrpo.worker.grpo_trainer import (
    ROUND_PARAMS,
    SCHEDULE_ARGS,
    GenerationMeter,
    freeze_lora_a,
    frozen_heap,
    grpo_config,
    lora_config,
)
from hubgrpo.worker.keyed import KeyedGRPOTrainer
from hubgrpo.worker.models import load_model, resolve_device
from hubgrpo.worker.rebase import Rebaser, Source
from hubgrpo.worker.rollouts import INDEX_COLUMN, RolloutRecorder
from hubgrpo.worker.round_result import TrainResult, build_submission, write_submission
from hubgrpo.worker.scoring import mean_reward
from hubgrpo.worker.sharing import SharingGRPOTrainer
from hubgrpo.worker.steplog import StepCallback, StepRecorder


class RoundEngine:
    """Base model + prompts + rewards + one GRPOTrainer, reused for every round a worker trains."""

    def __init__(
        self, cfg: Config, *, worker: str = "local", device: str | None = None, log: Callable[[str], None] | None = None
    ):
        self.cfg = cfg
        self.worker = check_name(worker)
        self.log = log or (lambda msg: None)
        self.device = resolve_device(device or cfg.worker.device)
        start = time.perf_counter()
        self._set_threads(cfg.worker.threads)
        self.model, self.tokenizer = load_model(
            cfg.base_model, gguf_file=cfg.gguf_file, device=self.device, dtype=cfg.worker.dtype
        )
        if cfg.data.chat_template and self.tokenizer.chat_template is None:
            raise ModelError(
                f"{cfg.base_model} has no chat template, but data.chat_template is true",
                hint="set data.chat_template: false to send plain-text prompts",
            )
        self.source = PromptSource.from_config(cfg)
        self.rewards = load_rewards(cfg.rewards)
        self.rollouts = RolloutRecorder(self.source)  # TRL calls the rewards through it: the round's rollouts file
        self._recorder = StepRecorder()
        self._rebaser = Rebaser()  # merge.rebase: moves a round onto newer versions between steps
        self._workdir = tempfile.TemporaryDirectory(prefix="hubgrpo-trainer-")
        self._meter = GenerationMeter()  # TRL's generation: seconds, completions, tokens
        self._params = self._merge_params({})
        self._live: LiveAdapter | None = None  # the trainer's adapter bound to its parameters (``_live_adapter``)
        self.trainer = self._build_trainer(self._params)
        self._init_state = {k: v.detach().clone() for k, v in self._adapter_state().items()}
        self._fresh_optimizer = True
        self._optimizers: dict[str, Any] = {}  # parked AdamW objects of other machines (``optimizer_key``)
        self._optimizer_owner: str | None = None
        self.setup_seconds = time.perf_counter() - start
        self.log(f"engine ready in {self.setup_seconds:.1f}s: {cfg.base_model} on {self.device_name}")

    # -------------------------------------------------------------------------------------- construction

    @staticmethod
    def _set_threads(n: int | None) -> None:
        if n:
            torch.set_num_threads(n)

    @property
    def device_name(self) -> str:
        """The device in words, e.g. ``cpu (2 threads)`` or ``cuda:0 (NVIDIA H200)``."""
        if self.device.startswith("cuda"):
            return f"{self.device} ({torch.cuda.get_device_name(torch.device(self.device))})"
        return f"{self.device} ({torch.get_num_threads()} threads)"

    @property
    def params(self) -> dict:
        """The validated params it trains with: cfg.params, or those of the last lease."""
        return self._params

    def _merge_params(self, overrides: dict) -> dict:
        """cfg.params with a lease's overrides, validated like the config itself (the worker's own settings,
        cfg.worker, are no params: a lease cannot change them)."""
        try:
            return ParamsConfig.model_validate({**self.cfg.params.model_dump(), **overrides}).model_dump()
        except ValueError as e:  # pydantic ValidationError
            raise LeaseError(
                f"lease params {overrides} are not valid hyper-parameters: {e}",
                hint="the coordinator's params must be fields of the config's params section",
            ) from None

    def _build_trainer(self, params: dict) -> KeyedGRPOTrainer:
        torch.manual_seed(params["seed"])  # LoRA A is drawn inside get_peft_model: version 0 follows params.seed
        placeholder = Dataset.from_list(self.prompt_rows([0]))
        trainer_class = SharingGRPOTrainer if self.cfg.worker.share_prompts else KeyedGRPOTrainer
        args = grpo_config(
            params,
            1,
            output_dir=self._workdir.name,
            device=self.device,
            dtype=self.model.dtype,
            reward_weights=[r.weight for r in self.rewards],
        )
        trainer = trainer_class(
            model=self.model,
            reward_funcs=self.rollouts.wrap(self.rewards),
            args=args,
            train_dataset=placeholder,
            processing_class=self.tokenizer,
            peft_config=lora_config(self.cfg.lora),
            callbacks=[self._recorder, self._rebaser],
        )
        trainer.remove_callback(PrinterCallback)  # it prints every log dict to stdout
        model: Any = trainer.model  # a PeftModel (given peft_config); transformers types it Module | None
        model.peft_config["default"].base_model_name_or_path = adapter_base_name(self.cfg.base_model)
        if self.cfg.merge.merge_method.frozen_a:
            freeze_lora_a(model)

        def after_generation() -> None:
            if self.cfg.merge.rebase_after_generation:  # the gradient at the newest model (worker/rebase.py)
                self._rebaser.after_generation(trainer.state.global_step)

        self._meter.wrap(trainer, after_generation)
        if self.cfg.worker.decode == "compiled":
            compile_decoding(trainer, (params["max_prompt_length"] or 0) + params["max_completion_length"])
        return trainer

    def _ensure_trainer(self, params: dict) -> float:
        """Rebuild the trainer (fresh base model) when a structural param changed; returns seconds spent."""
        changed = {k for k in params if k not in ROUND_PARAMS and params[k] != self._params[k]}
        self._set_threads(self.cfg.worker.threads)
        if not changed:
            self._params = params
            return 0.0
        start = time.perf_counter()
        self.log(f"rebuilding the trainer: lease changes {sorted(changed)}")
        state = {k: v.detach().clone() for k, v in self._adapter_state().items()}
        self.model, self.tokenizer = load_model(
            self.cfg.base_model, gguf_file=self.cfg.gguf_file, device=self.device, dtype=self.cfg.worker.dtype
        )
        self._params = params
        self.trainer = self._build_trainer(params)
        self._live_adapter().load(state)
        self._fresh_optimizer = True
        self._optimizers.clear()  # they hold the old trainer's parameters
        return time.perf_counter() - start

    # -------------------------------------------------------------------------------------- adapters

    def _live_adapter(self) -> LiveAdapter:
        """The trainer's adapter bound to its parameters (``LiveAdapter``; rebuilt with the trainer)."""
        if self._live is None or self._live.model is not self.trainer.model:
            self._live = LiveAdapter(self.trainer.model)
        return self._live

    def _adapter_state(self) -> dict[str, torch.Tensor]:
        return self._live_adapter().state()

    def load_adapter(self, adapter_dir: str | Path) -> None:
        """Load a PEFT adapter folder into the model; ``ModelError`` unless its config, keys and shapes fit."""
        state = check_adapter(Path(adapter_dir), self._adapter_state(), self.cfg.lora)
        self._live_adapter().load(state, str(adapter_dir))

    def save_adapter(self, out_dir: str | Path) -> Path:
        """Write the current "default" adapter (adapter_model.safetensors + adapter_config.json) to ``out_dir``."""
        return self._live_adapter().save(Path(out_dir))

    def init_adapter(self, out_dir: str | Path) -> Path:
        """Write the version-0 adapter: LoRA B = 0 (equal to the base model), A as PEFT draws it from params.seed."""
        self._live_adapter().load(self._init_state)
        return self.save_adapter(out_dir)

    # -------------------------------------------------------------------------------------- training

    def prompt_rows(self, indices, max_prompt_length: int | None = None) -> list[dict]:
        """The shard's rows, prompts left-truncated to max_prompt_length (default: the config's), each with its
        prompt index (``INDEX_COLUMN``: the reward functions get the row by it, see ``hubgrpo.worker.rollouts``)."""
        indices = list(indices)
        rows = self.source.rows(indices)
        limit = max_prompt_length or self.cfg.params.max_prompt_length
        for i, r in zip(indices, rows):
            r["prompt"] = truncate_prompt(r["prompt"], self.tokenizer, limit)
            r[INDEX_COLUMN] = int(i)
        return rows

    def _prepare_optimizer(self, params: dict, key: str | None = None) -> None:
        """Fresh AdamW (``rounds.reset_optimizer``), or the moments kept from the previous round — of the machine named
        ``key`` when one engine trains for several (the simulator): each keeps its own AdamW object, parked here
        while another trains (they all reference the one model's parameters)."""
        tr = self.trainer
        if key is not None and key != self._optimizer_owner and not self.cfg.rounds.reset_optimizer:
            if self._optimizer_owner is not None and tr.optimizer is not None:
                self._optimizers[self._optimizer_owner] = tr.optimizer
            tr.optimizer = self._optimizers.pop(key, None)
            self._optimizer_owner = key
        if self.cfg.rounds.reset_optimizer or self._fresh_optimizer or tr.optimizer is None:
            tr.optimizer = None
        else:  # keep Adam moments; the new round's learning rate still applies
            for group in tr.optimizer.param_groups:
                group["lr"] = group["initial_lr"] = params["learning_rate"]
        tr.lr_scheduler = None
        self._fresh_optimizer = False

    def train_steps(
        self,
        rows: list[dict],
        steps: int,
        *,
        seed: int,
        params: dict | None = None,
        on_step: StepCallback | None = None,
        optimizer_key: str | None = None,
    ) -> TrainResult:
        """Run ``steps`` GRPO optimizer steps on ``rows`` from the adapter currently in the model (AdamW state:
        see ``_prepare_optimizer``)."""
        params = params or self._params
        if steps > 0 and not rows:
            raise DataError("a round with steps > 0 got no prompts", hint="lease.prompt_indices must not be empty")
        tr = self.trainer
        for key in SCHEDULE_ARGS:
            setattr(tr.args, key, params[key])
        tr.args.max_steps, tr.args.seed = max(1, steps), seed
        tr.train_dataset = Dataset.from_list(rows) if rows else tr.train_dataset
        self._prepare_optimizer(params, optimizer_key)
        tr._step, tr._buffered_inputs = 0, None  # GRPO's generation buffer must not leak across rounds
        tr.keyed = KeyedSampling(seed) if self.cfg.worker.keyed_sampling else None  # hubgrpo.proof: the round's noise
        if tr.keyed is not None:
            tr.keyed_log = []  # the round's token ids: the rollouts file carries them
        for metrics in tr._metrics.values():
            metrics.clear()
        self._meter.reset()
        reward_before = sum(r.seconds for r in self.rewards)
        self._recorder.steps, self._recorder.on_step = [], on_step
        self.rollouts.reset()
        start = time.perf_counter()
        if steps > 0:
            set_seed(seed)
            with frozen_heap():  # see hubgrpo.worker.grpo_trainer
                tr.train()
        wall = time.perf_counter() - start
        reward_s = sum(r.seconds for r in self.rewards) - reward_before
        gen_s = self._meter.seconds
        samples = self._meter.samples
        return TrainResult(
            step_metrics=list(self._recorder.steps),
            samples=samples,
            prompts=samples // params["num_generations"],
            tokens=self._meter.tokens,
            timings={"generate": gen_s, "reward": reward_s, "train": max(0.0, wall - gen_s - reward_s)},
        )

    def run_round(
        self,
        adapter_dir: Path,
        lease: Lease,
        out_dir: Path,
        *,
        on_step: StepCallback | None = None,
        optimizer_key: str | None = None,
        rebase: Source | None = None,
    ) -> Submission:
        """Train ``lease.steps`` steps from ``adapter_dir`` on the lease's prompts; write the submission folder.

        ``out_dir`` receives adapter_model.safetensors, adapter_config.json and submission.json (worker and
        submission id from the lease). ``on_step(step, metrics_dict)`` is called after every optimizer step.
        ``optimizer_key``: the machine this round trains for, when one engine serves several (the simulator).
        ``rebase``: where newer versions come from in a ``merge.rebase`` run (``hubgrpo.worker.rebase``).
        """
        t0 = time.perf_counter()
        params = self._merge_params(dict(lease.params))
        setup = self._ensure_trainer(params)
        t1 = time.perf_counter()
        self.load_adapter(adapter_dir)
        t2 = time.perf_counter()
        rows = self.prompt_rows(lease.prompt_indices, params["max_prompt_length"])
        self._rebaser.start(self, rebase if self.cfg.merge.rebase else None, lease.base_version)
        try:
            result = self.train_steps(
                rows, lease.steps, seed=lease.seed, params=params, on_step=on_step, optimizer_key=optimizer_key
            )
        finally:
            source, self._rebaser.source = self._rebaser.source, None  # only this round moves
        if source is not None:
            result.timings["rebase"] = self._rebaser.seconds
        t3 = time.perf_counter()
        out_dir = Path(out_dir)
        self.save_adapter(out_dir)
        self.rollouts.save(out_dir / ROLLOUTS_FILE, self.trainer.keyed_log if self.trainer.keyed else None)
        sub = self._submission(lease, result)
        sub.timings.update(setup=setup, load=t2 - t1)
        sub.timings["save"] = time.perf_counter() - t3  # the JSON write below is part of it too (≈ ms)
        sub.timings["total"] = time.perf_counter() - t0
        write_submission(out_dir, sub)
        rewards = [m.reward for m in result.step_metrics]
        self.log(
            f"round {lease.round_id}: {len(rewards)} steps, reward {sub.reward_first:.3f} → "
            f"{sub.reward_last:.3f} in {sub.timings['total']:.1f}s"
        )
        return sub

    def _submission(self, lease: Lease, result: TrainResult) -> Submission:
        weights = [r.weight for r in self.rewards]
        return build_submission(
            lease,
            result,
            base_model=self.cfg.base_model,
            reward_mean=weighted_mean(weights, self.rollouts.batches) if result.step_metrics else 0.0,
            device=self.device_name,
            rebased_version=self._rebaser.rebased_version,
            rebased_sha=self._rebaser.rebased_sha,
        )

    # -------------------------------------------------------------------------------------- evaluation

    @torch.no_grad()
    def evaluate(
        self,
        adapter_dir: str | Path | None = None,
        n: int = 16,
        batch_size: int = 16,
        *,
        greedy: bool = True,
        seed: int = 0,
    ) -> float:
        """Mean weighted reward of completions on the first ``n`` held-out prompts: greedy, or (``greedy=False``)
        one sample per prompt at the training temperature with a fixed ``seed`` (the policy's expected reward,
        smoother than greedy for small models, and identical for identical adapters).

        Uses ``adapter_dir`` when given, else the adapter currently in the model.
        """
        if adapter_dir is not None:
            self.load_adapter(adapter_dir)
        rows = [
            dict(r, prompt=truncate_prompt(r["prompt"], self.tokenizer, self.cfg.params.max_prompt_length))
            for r in self.source.eval_rows(n)
        ]
        if not rows:
            raise DataError(
                "there are no held-out prompts to evaluate on", hint="set data.eval_fraction > 0 or data.eval_split"
            )
        model = self.trainer.model
        assert model is not None, "the trainer holds the model from its start"
        return mean_reward(
            model,
            self.tokenizer,
            rows,
            self.rewards,
            batch_size=batch_size,
            greedy=greedy,
            seed=seed,
            max_new_tokens=self._params["max_completion_length"],
            eos_token_ids=self.trainer.eos_token_ids,
            temperature=self.cfg.params.temperature,
        )
