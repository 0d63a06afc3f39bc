"""The sections of a hubgrpo config (pydantic models): what each field means, its default and its bounds."""

from __future__ import annotations

import math
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, SecretStr, field_validator, model_validator

from hubgrpo.config.methods import BY_NAME, MergeMethod

FREE_COMMITS = 1_000_000  # a commit budget this high is lifted (a local folder: commits cost nothing)
OUTER_LR_MAX = 10.0  # a merge's outer learning rate: above this a version only amplifies its rounds' noise


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    @field_validator("*", mode="before")
    @classmethod
    def _blank_is_none(cls, v: Any, info) -> Any:
        """``${VAR:-}`` expands to ''; for optional fields that means "not set"."""
        f = cls.model_fields.get(info.field_name)
        if v == "" and f is not None and not f.is_required() and f.get_default() is None:
            return None
        return v


class DataConfig(_Section):
    """Where prompts come from."""

    path: str = Field(
        "builtin:addition", description="Hub dataset id, local .jsonl/.csv/.parquet file, or builtin:<task>."
    )
    name: str | None = Field(None, description="Dataset configuration name (the 2nd argument of load_dataset).")
    train_split: str = Field("train", description="Split used for training prompts.")
    eval_split: str | None = Field(
        None, description="Split for held-out evaluation; None = carve `eval_fraction` out of train."
    )
    eval_fraction: float = Field(0.05, ge=0.0, lt=1.0, description="Share of train held out when no eval_split exists.")
    column_mapping: dict[str, str] = Field(
        default_factory=lambda: {"prompt": "prompt", "answer": "answer"},
        description="Maps hubgrpo's columns (prompt, answer, system) to the dataset's column names.",
    )
    system_prompt: str | None = Field(None, description="System message prepended to every chat prompt.")
    chat_template: bool = Field(True, description="Send prompts as chat messages (True) or as plain text (False).")
    max_samples: int | None = Field(None, gt=0, description="Use only the first N training rows.")
    options: dict[str, Any] = Field(
        default_factory=dict, description="Options for builtin tasks, e.g. {digits: 2, size: 5000}."
    )


class RewardConfig(_Section):
    """One reward function; several are summed with their weights."""

    function: str = Field(description="builtin:<name>, package.module:function, or path/to/file.py:function.")
    weight: float = Field(1.0, description="Weight of this reward in the sum.")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Extra keyword arguments passed to the function.")


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


class LoraSection(_Section):
    """The LoRA adapter every worker trains (peft LoraConfig)."""

    r: int = Field(16, gt=0, description="LoRA rank of the global adapter.")
    alpha: float = Field(32, gt=0, description="lora_alpha; scaling is alpha/r (alpha/sqrt(r) with use_rslora).")
    dropout: float = Field(0.0, ge=0, lt=1, description="LoRA dropout.")
    target_modules: list[str] | str = Field("all-linear", description="Module names, or 'all-linear'.")
    use_rslora: bool = Field(False, description="Rank-stabilised scaling alpha/sqrt(r).")


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


class CoordinatorSection(_Section):
    """The coordinator (a Gradio app, usually a Space) that leases rounds and merges."""

    url: str | None = Field(None, description="Coordinator URL or Space id; None = embedded (hubgrpo run).")
    lease_timeout_s: float = Field(600, gt=0, description="A lease with no heartbeat for this long expires.")
    heartbeat_interval_s: float = Field(30, gt=0, description="How often workers heartbeat.")
    round_timeout_s: float = Field(900, gt=0, description="Merge at this deadline when at least one submission is in.")
    lease_waits_for_merge_s: float = Field(
        30,
        ge=0,
        description="A lease asked while a merge is due or running waits up to this long for the new "
        "version (0 = lease the current one at once, one version staler).",
    )
    allowed_users: list[str] = Field(
        default_factory=list, description="Users/orgs allowed to work; empty = repo owner."
    )
    evaluators: list[str] = Field(
        default_factory=list,
        description="Users/orgs allowed to record held-out scores (hubgrpo evaluate); empty = the repo owner.",
    )
    keep_submissions: int | None = Field(
        2,
        ge=0,
        description="Submission folders of the last N merged versions "
        "stay in the repo's head; older ones leave it with a later merge commit "
        "(history keeps them until `hubgrpo gc`); None = keep all.",
    )
    commit_budget_per_hour: int = Field(
        60,
        gt=0,
        description="Keep repo commits per hour under this (the Hub's "
        "hourly commit quota); `hubgrpo run` in a local directory lifts it unless "
        "the config sets it.",
    )
    checkpoint_every_s: float | None = Field(
        None,
        ge=0,
        le=86400,
        description="How often a new version is committed to the run repo as a checkpoint "
        "(adapter, state.json, model card; tagged vNNNNNN); between checkpoints workers get versions from the "
        "coordinator, and a restarted coordinator resumes from the last checkpoint. None = from the budget: "
        "7200 / commit_budget_per_hour seconds (half the budget), every version when the budget is lifted; "
        "0 = every version.",
    )
    checkpoint_every_versions: int | None = Field(
        None,
        gt=0,
        le=1_000_000,
        description="Also checkpoint once "
        "this many versions were merged since the last checkpoint "
        "(never beyond the commit budget).",
    )
    rate_limit_per_minute: int = Field(120, gt=0, description="API calls per worker per minute.")
    max_leases_per_user: int = Field(32, gt=0, description="Live leases one user may hold at once.")
    scan_interval_s: float = Field(
        60,
        gt=0,
        description="How often the repo is scanned for committed rounds "
        "that were never submitted (a crashed worker, a lost answer).",
    )
    refusal_flush_s: float = Field(
        120,
        gt=0,
        description="Refusals are written to state.json with the next "
        "merge, or on their own after this long without one.",
    )
    reward_timeout_s: float = Field(
        60,
        gt=0,
        le=86400,
        description="How long the run's non-built-in reward "
        "functions may take to rescore one submitted round (in a child process, killed "
        "after it): a round over it is refused (reward_timeout).",
    )
    secret: SecretStr | None = Field(None, description="HMAC secret that signs leases; usually ${HUBGRPO_SECRET}.")

    @property
    def checkpoint_interval_s(self) -> float:
        """Seconds between checkpoints (``checkpoint_every_s``, or its default from the commit budget)."""
        if self.checkpoint_every_s is not None:
            return float(self.checkpoint_every_s)
        return 0.0 if self.commit_budget_per_hour >= FREE_COMMITS else 7200.0 / self.commit_budget_per_hour


class HubSection(_Section):
    """The run repo (the bucket)."""

    repo_id: str | None = Field(None, description="user/name on the Hub, or a local path; None = runs/<project_name>.")
    token: SecretStr | None = Field(None, description="Hub token; use ${HF_TOKEN}, never a literal.")
    private: bool = Field(True, description="Create the Hub repo as private.")
    push_to_hub: bool = Field(False, description="hubgrpo train/run: push the final adapter to hub.repo_id.")
    submissions: str | None = Field(
        None,
        description="The run's inbox, where workers put their rounds: coordinator (through its upload route, kept "
        "on its disk under $HUBGRPO_CACHE/rounds: no commits, no write access for workers), s3://bucket/prefix "
        "(workers get presigned upload URLs, no commits), a local folder (./path, /path), or unset = the run repo "
        "itself (one commit per round).",
    )

    @field_validator("submissions")
    @classmethod
    def _inbox(cls, v: str | None) -> str | None:
        if v is None:
            return v
        from hubgrpo.errors import HubGrpoError
        from hubgrpo.store.inboxes import check_inbox_spec

        try:
            return check_inbox_spec(v)
        except HubGrpoError as e:
            raise ValueError(f"{e.message} ({e.hint})") from None


class BackendOptions(_Section):
    """Where ``hubgrpo run`` starts its workers when ``backend: hf-jobs`` (Hugging Face Jobs)."""

    workers: int = Field(2, ge=1, le=256, description="Worker jobs to start.")
    flavor: str = Field("t4-small", description="HF Jobs hardware (cpu-basic, t4-small, l4x1, a10g-small, …).")
    timeout: str = Field("2h", description="Longest a job runs (90m, 2h, 1d, or seconds).")
    image: str | None = Field(None, description="Docker image (default: CUDA PyTorch for GPUs, python:3.12 for CPUs).")
    install: str = Field("space", description="space (the coordinator Space's wheel) | none | a pip requirement.")
    coordinator: str | None = Field(None, description="The coordinator: a Space id (user/name) or an https URL.")
    deploy: bool = Field(True, description="Deploy the coordinator Space first (when coordinator is a Space id).")


class Config(_Section):
    """A whole hubgrpo run."""

    # key path → the text as written, for each value that came from the environment (``loading.from_env``)
    _from_env: dict[tuple, str] = PrivateAttr(default_factory=dict)

    task: Literal["llm-grpo"] = Field("llm-grpo", description="Always llm-grpo.")
    base_model: str = Field(
        description="Hub id, local path, GGUF file, or builtin:tiny / builtin:smollm2-135m-instruct."
    )
    gguf_file: str | None = Field(None, description="GGUF file name inside base_model (a repo or folder).")
    project_name: str = Field(description="Run name: letters, digits, '-', '_' and '.'.")
    log: Literal["none", "trackio", "tensorboard"] = Field("none", description="Metrics tracker.")
    data: DataConfig = Field(default_factory=DataConfig, description="Prompts.")
    rewards: list[RewardConfig] = Field(
        default_factory=lambda: [RewardConfig(function="builtin:exact_answer")],
        description="Reward functions, summed with their weights.",
    )
    params: ParamsConfig = Field(default_factory=ParamsConfig, description="GRPO and round parameters.")
    lora: LoraSection = Field(default_factory=LoraSection, description="The LoRA adapter.")
    merge: MergeSection = Field(default_factory=MergeSection, description="Merging submissions.")
    coordinator: CoordinatorSection = Field(default_factory=CoordinatorSection, description="The coordinator.")
    hub: HubSection = Field(default_factory=HubSection, description="The run repo.")
    backend: Literal["local", "hf-jobs"] = Field(
        "local",
        description="hubgrpo run: workers as local processes, or as Hugging Face Jobs with the coordinator on a Space.",
    )
    backend_options: BackendOptions = Field(default_factory=BackendOptions, description="For backend hf-jobs.")

    @field_validator("project_name")
    @classmethod
    def _slug(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}", v):
            raise ValueError("use 1-96 letters, digits, '-', '_' or '.', starting with a letter or digit")
        return v

    @field_validator("rewards")
    @classmethod
    def _some_reward(cls, v: list[RewardConfig]) -> list[RewardConfig]:
        if not v:
            raise ValueError("at least one reward function is required")
        return v
