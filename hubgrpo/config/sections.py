"""The sections of a hubgrpo config (pydantic models): what each field means, its default and its bounds.

The larger sections live beside this module (``params_section``, ``rounds_section``, ``worker_section``,
``merge_section``) and are re-exported here with the rest, the whole tree (``Config``). Keys that moved are still
accepted at their old place, with a deprecation note (``legacy``)."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, PrivateAttr, SecretStr, field_validator, model_validator

from hubgrpo.config.legacy import migrate
from hubgrpo.config.merge_section import MergeSection
from hubgrpo.config.params_section import ParamsConfig
from hubgrpo.config.rounds_section import RoundsSection
from hubgrpo.config.section_base import _Section
from hubgrpo.config.worker_section import WorkerSection

FREE_COMMITS = 1_000_000  # a commit budget this high is lifted (a local folder: commits cost nothing)


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


class LoraSection(_Section):
    """The LoRA adapter every worker trains (peft LoraConfig)."""

    r: int = Field(16, gt=0, description="LoRA rank of the global adapter.")
    alpha: float = Field(32, gt=0, description="lora_alpha; scaling is alpha/r (alpha/sqrt(r) with use_rslora).")
    dropout: float = Field(0.0, ge=0, lt=1, description="LoRA dropout.")
    target_modules: list[str] | str = Field("all-linear", description="Module names, or 'all-linear'.")
    use_rslora: bool = Field(False, description="Rank-stabilised scaling alpha/sqrt(r).")


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
    verify: Literal["off", "sample", "all", "untrusted"] = Field(
        "off",
        description="Proof of rollouts (hubgrpo.proof): sample = a verifier (hubgrpo evaluate --verify) replays a "
        "sample of the completions of each admitted round with the leased version, and a failed round excludes its "
        "participant (no merge weight for its pending rounds, no leaderboard credit, later rounds refused); all = "
        "the same, and a round is merged only once it passed; untrusted = like all for participants not in "
        "coordinator.trusted; rounds must carry their token ids (worker.keyed_sampling). off = no verdicts.",
    )
    verify_tolerance: Literal["wide", "strict"] = Field(
        "strict",
        description="How far below the replayed choice a recorded token may lie (hubgrpo.proof.verify): strict = "
        "0.0005 + 0.00001 x the position's largest |logit / T|, for float32 workers (with verification on, "
        "worker.dtype auto resolves to float32 on every device), which catches forgeries that change a few tokens "
        "by little; wide = 0.001 + 0.06 x, which also covers bfloat16 workers and lets most such forgeries "
        "through (catch rates: benchmarks/proof/results/proof-smollm2-long.md, -long-s1.md).",
    )
    trusted: list[str] = Field(
        default_factory=list,
        description="Users (or worker names, in runs without auth) whose rounds merge without waiting for their "
        "verdict under coordinator.verify: untrusted.",
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
    leases_per_worker: int = Field(
        2,
        ge=1,
        le=4,
        description="Live leases one worker name may hold: 2 lets a worker deliver a round while it trains the "
        "next and ask its next lease ahead; 1 refuses a second one (the worker then runs its rounds in sequence).",
    )
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
    # deprecation notes for the keys it was given at their old place (``legacy``), in the order found
    _deprecations: list[str] = PrivateAttr(default_factory=list)

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
    params: ParamsConfig = Field(default_factory=ParamsConfig, description="GRPO's hyper-parameters.")
    rounds: RoundsSection = Field(default_factory=RoundsSection, description="The run's schedule.")
    lora: LoraSection = Field(default_factory=LoraSection, description="The LoRA adapter.")
    merge: MergeSection = Field(default_factory=MergeSection, description="Merging submissions.")
    coordinator: CoordinatorSection = Field(default_factory=CoordinatorSection, description="The coordinator.")
    hub: HubSection = Field(default_factory=HubSection, description="The run repo.")
    worker: WorkerSection = Field(default_factory=WorkerSection, description="The worker's machine.")
    backend: Literal["local", "hf-jobs"] = Field(
        "local",
        description="hubgrpo run: workers as local processes, or as Hugging Face Jobs with the coordinator on a Space.",
    )
    backend_options: BackendOptions = Field(default_factory=BackendOptions, description="For backend hf-jobs.")

    @model_validator(mode="wrap")
    @classmethod
    def _moved_keys(cls, data: Any, handler):
        """Keys given at their old place move to their new one (``legacy.migrate``), with a deprecation note."""
        data, notes = migrate(data)
        cfg = handler(data)
        if notes:
            cfg._deprecations = notes
        return cfg

    @model_validator(mode="after")
    def _split_fits(self):
        p = self.params
        if self.rounds.fleet_batch == "split" and p.per_device_train_batch_size % p.num_generations:
            raise ValueError(
                f"rounds.fleet_batch split shares params.per_device_train_batch_size "
                f"({p.per_device_train_batch_size}) out in prompt groups of params.num_generations "
                f"({p.num_generations}): make the batch a multiple of num_generations"
            )
        return self

    @model_validator(mode="after")
    def _verify_needs_replayable_workers(self):
        if self.coordinator.verify != "off" and not self.worker.keyed_sampling:
            raise ValueError(
                f"coordinator.verify {self.coordinator.verify} replays rounds sampled with the lease's noise, and "
                "worker.keyed_sampling false makes workers sample without it: every round would be refused at "
                "admission; set worker.keyed_sampling: true, or coordinator.verify: off"
            )
        if self.coordinator.verify != "off" and self.coordinator.verify_tolerance == "strict":
            if self.worker.dtype in ("bfloat16", "float16"):
                raise ValueError(
                    f"coordinator.verify_tolerance strict (the default with coordinator.verify on) leaves no room "
                    f"for {self.worker.dtype} rounding: every worker must generate in float32; set worker.dtype: "
                    "float32 or auto, or coordinator.verify_tolerance: wide (which lets through most forgeries that "
                    "change tokens by little)"
                )
        return self

    def worker_batch(self, live_workers: int) -> int:
        """Completions per step of one worker's round while ``live_workers`` workers are live
        (``rounds.fleet_batch``)."""
        p = self.params
        if self.rounds.fleet_batch != "split" or live_workers <= 1:
            return p.per_device_train_batch_size
        groups = p.per_device_train_batch_size // p.num_generations
        return max(1, -(-groups // live_workers)) * p.num_generations

    def run_lr(self, version: int) -> float:
        """The learning rate of a round leased on ``version``: params.learning_rate on the run's schedule
        (``rounds.lr_schedule``, ``RoundsSection.lr_scale``)."""
        return self.params.learning_rate * self.rounds.lr_scale(version)

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
