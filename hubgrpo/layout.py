"""The run repo's schema: record types (strict, schema-versioned pydantic) and the one place that knows paths.

Layout of a run repo (the bucket)::

    adapter_model.safetensors, adapter_config.json   current global adapter (loadable with PeftModel)
    README.md                                        model card
    hubgrpo.yaml                                     resolved config (secrets redacted)
    state.json                                       RunState: versions, merged/refused submissions, workers
    optimizer/outer_momentum.safetensors             outer-optimizer state (only with outer momentum)
    submissions/<base version>/<worker>-<lease>/     adapter_model.safetensors, adapter_config.json,
                                                     rollouts.json.gz, submission.json
    tags v000000, v000001, ...                       one per global version

No torch import here: the coordinator's Space stays light.
"""

from __future__ import annotations

import hashlib
import re
from typing import Annotated, Literal, TypeGuard

from pydantic import BaseModel, ConfigDict, Field, field_validator

from hubgrpo.errors import InvalidPath, InvalidSubmission

SCHEMA_VERSION = 1
# The wire protocol between workers and coordinators; a lease request carries it and a coordinator refuses any other
# (code ``version``). Raise it with every change a worker and a coordinator of different releases would disagree on.
PROTOCOL_VERSION = 7  # what each version changed: CHANGELOG.md, "Wire protocol versions"
WHEELS_DIR = "wheels"  # where `hubgrpo space deploy` publishes the hubgrpo wheel in the Space repo


def wheel_name(version: str) -> str:
    """The file name of hubgrpo's wheel (pure Python, any platform)."""
    return f"hubgrpo-{version}-py3-none-any.whl"


def space_wheel_url(space_id: str, endpoint: str, version: str) -> str:
    """Where a run's Space publishes the wheel of the hubgrpo it coordinates with (one-line worker install)."""
    return f"{endpoint.rstrip('/')}/spaces/{space_id}/resolve/main/{WHEELS_DIR}/{wheel_name(version)}"


ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
MODEL_CARD = "README.md"
CONFIG_FILE = "hubgrpo.yaml"
STATE_FILE = "state.json"
MOMENTUM_FILE = "optimizer/outer_momentum.safetensors"
SUBMISSIONS = "submissions"
SUBMISSION_FILE = "submission.json"
ROLLOUTS_FILE = "rollouts.json.gz"  # the round's prompt indices, completions and rewards (gzip-compressed JSON)
ADAPTER_FILES = (ADAPTER_WEIGHTS, ADAPTER_CONFIG)
SUBMISSION_FILES = (
    *ADAPTER_FILES,
    ROLLOUTS_FILE,
    SUBMISSION_FILE,
)  # what a worker delivers, in this order: the record last

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_TAG = re.compile(r"v(\d{6,})")
_SHA = re.compile(r"[0-9a-f]{40}")
_COMMIT_TAG = re.compile(r"v\d{6,10}")  # a version tag as a revision (versions stop at 10**9)
_SUB = re.compile(r"submissions/(\d{6,})/([A-Za-z0-9][A-Za-z0-9._-]{0,160})/([^/]+)")


# Every number a participant sends is finite (NaN, ±Infinity and overflowing literals such as 1e400 are refused,
# see Record) and bounded; every string and collection is bounded. What the coordinator writes must load again.
Num = Annotated[float, Field(ge=-1e9, le=1e9)]
Seconds = Annotated[float, Field(ge=0, le=1e12)]  # durations and Unix times
Count = Annotated[int, Field(ge=0, le=10**12)]
Text = Annotated[str, Field(max_length=200)]
LongText = Annotated[str, Field(max_length=2000)]
Index = Annotated[int, Field(ge=0, le=10**12)]
Version = Annotated[int, Field(ge=0, le=10**9)]
ParamValue = (
    Annotated[float, Field(ge=-1e12, le=1e12)] | Annotated[int, Field(ge=-(10**12), le=10**12)] | Text | bool | None
)
MAX_MESSAGE = 500  # characters of a refusal's message kept in state.json


class Record(BaseModel):
    """Base of every record kept in the repo: unknown keys refused, types strict, numbers finite."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=False, allow_inf_nan=False)

    def to_json(self) -> bytes:
        return self.model_dump_json(indent=1).encode()

    @classmethod
    def from_json(cls, data: bytes | str):
        return cls.model_validate_json(data)


class Lease(Record):
    """A round leased to one worker. Signed by the coordinator (HMAC), so it needs no durable storage."""

    schema_version: Literal[1] = 1
    lease_id: Text
    run_id: Text
    round_id: Count
    worker: Text
    user: Text | None = None
    base_version: Version
    base_sha: Text
    prompt_indices: list[Index] = Field(max_length=1_000_000)
    steps: Annotated[int, Field(ge=0, le=1_000_000)]
    seed: Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]
    params: dict[Text, ParamValue] = Field(default_factory=dict, max_length=64)
    issued_at: Seconds
    deadline: Seconds
    signature: Text = ""
    # file name → presigned PUT URL when hub.submissions is an S3 inbox (not signed by the coordinator: the URLs
    # carry the bucket's own signature); never written to submission.json
    uploads: dict[Text, Annotated[str, Field(max_length=8192)]] = Field(default_factory=dict, max_length=8)

    # A coordinator is only a URL a participant was given: what becomes a folder, a file name or a revision on
    # the worker (adapters/<base_sha>, rounds/<worker>-<lease_id>) or a request target is checked here.
    @field_validator("base_sha")
    @classmethod
    def _commit_id(cls, value: str) -> str:
        if not is_commit_id(value):
            raise ValueError(f"{value[:80]!r} is not a commit id (40 lowercase hex digits, or a tag vNNNNNN)")
        return value

    @field_validator("lease_id", "worker", "run_id")
    @classmethod
    def _name(cls, value: str) -> str:
        if not is_name(value):
            raise ValueError(f"{value[:80]!r} is not a name (1-64 letters, digits, '.', '_', '-'; no '..')")
        return value

    @field_validator("uploads")
    @classmethod
    def _upload_urls(cls, value: dict[str, str]) -> dict[str, str]:
        for name, url in value.items():
            if name not in SUBMISSION_FILES:
                raise ValueError(f"{name[:80]!r} is not a submission file ({', '.join(SUBMISSION_FILES)})")
            if not url.startswith(("https://", "http://")):
                raise ValueError(f"the upload URL for {name} is not http(s): {url[:40]!r}")
        return value

    def changed_from(self, other: Lease) -> list[str]:
        """The fields in which this lease is another round than ``other``: all but what a renewal changes
        (``RENEWED``: the deadline, the signature, the upload URLs)."""
        return [f for f in type(self).model_fields if f not in RENEWED and getattr(self, f) != getattr(other, f)]


RENEWED = frozenset({"deadline", "signature", "uploads"})  # what a heartbeat changes in a lease


class StepMetrics(Record):
    """One GRPO optimizer step, as logged by TRL."""

    step: Count
    reward: Num
    reward_std: Num | None = None
    loss: Num | None = None
    kl: Num | None = None
    clip_ratio: Num | None = None
    entropy: Num | None = None
    grad_norm: Num | None = None
    completion_length: Num | None = None
    step_time: Seconds | None = None


class Submission(Record):
    """submission.json: what a worker trained in one round."""

    schema_version: Literal[1] = 1
    submission_id: Text
    worker: Text
    user: Text | None = None
    lease: Lease
    base_version: Version
    base_sha: Text
    base_model: LongText
    steps: Count
    samples: Count  # self-reported: shown, never used (the merge weight comes from the lease)
    prompts: Count
    tokens: Count
    reward_mean: Num  # self-reported: ignored (the coordinator recomputes it from the rollouts)
    reward_first: Num
    reward_last: Num
    step_metrics: list[StepMetrics] = Field(max_length=100_000)
    timings: dict[Text, Seconds] = Field(max_length=64)
    versions: dict[Text, Text] = Field(max_length=64)
    device: Text
    created_at: Seconds
    # merge.rebase (ffa): the newer version this round moved onto between steps (``hubgrpo.worker.rebase``); the
    # coordinator measures the update and the staleness from it. None: trained on ``base_version`` throughout.
    rebased_version: Version | None = None
    rebased_sha: Text | None = None  # the adapter id of ``rebased_version`` (the coordinator checks its lineage)

    def to_json(self) -> bytes:  # without rebase the record stays readable by coordinators older than the field
        exclude = {"rebased_version", "rebased_sha"} if self.rebased_version is None else None
        return self.model_dump_json(indent=1, exclude=exclude).encode()

    @property
    def trained_base(self) -> int:
        """The version the submitted adapter is an update of."""
        return self.base_version if self.rebased_version is None else self.rebased_version


class MergedEntry(Record):
    """One submission as it went into a version."""

    submission_id: Text
    worker: Text
    user: Text | None = None
    base_version: Version
    staleness: Version
    weight: Annotated[float, Field(ge=0, le=1e6)]
    samples: Count  # derived from the lease (completions per step × steps), never from the worker
    reward_mean: Num  # recomputed from the round's rollouts with the run's reward functions
    update_norm: Annotated[float, Field(ge=0, le=1e12)] | None = None  # ‖ΔWᵢ − ΔW_base‖ (norm bound history)
    steps: Count | None = None


MAX_COMPLETION_CHARS = 1_000_000
CompletionText = Annotated[str, Field(max_length=MAX_COMPLETION_CHARS)]
MAX_TOKEN_ID = 1 << 24  # above any vocabulary (the coordinator also checks the base model's own size, verify.py)
MAX_IDS = 1 << 16  # token ids of one prompt or one completion
TokenIds = Annotated[list[Annotated[int, Field(ge=0, lt=MAX_TOKEN_ID)]], Field(max_length=MAX_IDS)]


class Message(Record):
    """One chat message of a completion (TRL's conversational form)."""

    role: Text
    content: CompletionText


class RolloutBatch(Record):
    """One generation batch of a round, as the reward functions saw it: the lease's prompt index of each
    completion, the completion, and each reward function's value per completion (None: no opinion)."""

    prompt_indices: list[Index] = Field(max_length=100_000)
    completions: list[CompletionText | Annotated[list[Message], Field(max_length=16)]] = Field(max_length=100_000)
    rewards: list[list[Num | None]] = Field(max_length=64)  # [function][completion]
    # schema 2, keyed sampling (``hubgrpo.proof``): what a verifier replays — each completion's prompt token ids
    # (as ``generate`` got them, unpadded) and its sampled token ids; None when the round was not sampled keyed
    prompt_ids: list[TokenIds] | None = Field(None, max_length=100_000)
    completion_ids: list[TokenIds] | None = Field(None, max_length=100_000)


class Rollouts(Record):
    """rollouts.json.gz: every completion of a round and its rewards, so the coordinator can recompute them (and
    from schema 2, the token ids a verifier replays)."""

    schema_version: Literal[1, 2] = 2
    reward_names: list[Text] = Field(max_length=64)
    batches: list[RolloutBatch] = Field(max_length=100_000)


class Refusal(Record):
    """A refused submission or request, with its machine-readable code and human reason."""

    submission_id: Text
    worker: Text
    code: Text
    message: LongText
    at: Seconds
    version: Version


class VersionRecord(Record):
    """One global version; checkpointed versions are tagged vNNNNNN."""

    version: Version
    tag: Text | None = None  # vNNNNNN when the version was committed as a checkpoint, else None
    created_at: Seconds
    method: Text
    adapter_id: Text | None = None  # ``adapter_id`` of its adapter: what leases on it carry as ``base_sha``
    algorithm: Text | None = None
    residual: Annotated[float, Field(ge=0, le=1e6)] | None = None
    update_norm: Annotated[float, Field(ge=0, le=1e12)] | None = None
    outer_lr: Annotated[float, Field(gt=0, le=1e6)] = 1.0
    merged: list[MergedEntry] = Field(default_factory=list, max_length=100_000)
    reward_mean: Num | None = None  # recomputed by the coordinator from the rounds' rollouts, never reported
    samples: Count = 0
    eval_reward: Num | None = None  # held-out reward, recorded by an evaluator (``hubgrpo evaluate``)
    eval_samples: Count | None = None
    start_version: Version | None = None  # set when the merge started from another version than the previous one


class VerdictReport(Record):
    """What a verifier reports about one admitted round (``record_verdict``): hostile input until checked."""

    passed: bool
    completions: Count  # completions replayed
    tokens: Count  # their completion tokens
    checked: Count  # positions compared (not ambiguous)
    mismatches: Count
    reason: LongText | None = None  # why the round failed, in words (a prompt or text that is not its ids…)


class VerdictRecord(Record):
    """A proof-of-rollouts verdict on one admitted round (``hubgrpo evaluate --verify``, ``coordinator/verdicts``)."""

    submission_id: Text
    worker: Text
    user: Text | None = None
    report: VerdictReport
    at: Seconds


class WorkerStats(Record):
    """Leaderboard row for one worker."""

    worker: Text
    user: Text | None = None
    accepted: Count = 0  # rounds merged with weight > 0 (credited)
    refused: Count = 0
    uncredited: Count = 0  # rounds merged with weight 0: their update was below the norm floor
    samples: Count = 0
    reward_sum: Annotated[float, Field(ge=-1e15, le=1e15)] = 0.0
    reward_first: Num | None = None
    reward_last: Num | None = None
    first_seen: Seconds = 0.0
    last_seen: Seconds = 0.0


class RunState(Record):
    """state.json: everything the coordinator needs to continue after a restart."""

    schema_version: Literal[1] = 1
    run_id: Text
    project_name: Text
    version: Version = 0
    versions: list[VersionRecord] = Field(default_factory=list)
    merged_ids: list[Text] = Field(default_factory=list)
    refused: list[Refusal] = Field(default_factory=list)
    workers: dict[Text, WorkerStats] = Field(default_factory=dict)
    next_prompt: Index = 0
    commit_times: list[Seconds] = Field(default_factory=list)
    samples_total: Count = 0
    started_at: Seconds = 0.0
    finished: bool = False
    verdicts: list[VerdictRecord] = Field(default_factory=list, max_length=100_000)  # proof of rollouts


# ------------------------------------------------------------------------------------------------ paths


def is_name(name: object) -> bool:
    """Whether ``name`` is safe as one path segment: 1-64 of [A-Za-z0-9._-], not starting with '.', '_' or '-',
    no '..'."""
    return isinstance(name, str) and bool(_NAME.fullmatch(name)) and ".." not in name


def check_name(name: str, what: str = "worker name") -> str:
    """Worker names and lease ids become path segments: refuse anything but [A-Za-z0-9._-]."""
    if not is_name(name):
        raise InvalidSubmission(
            "bad_name",
            f"{what} {str(name)[:80]!r} is not allowed",
            hint="use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit",
        )
    return name


def is_commit_id(revision: object) -> TypeGuard[str]:
    """Whether ``revision`` is a commit sha (40 lowercase hex digits) or a version tag (vNNNNNN): the only
    revisions that may name a folder (``runrepo.adapter_at``) or come from a coordinator."""
    return isinstance(revision, str) and bool(_SHA.fullmatch(revision) or _COMMIT_TAG.fullmatch(revision))


def adapter_id(weights: bytes, config: bytes) -> str:
    """The id of a version's adapter: 40 hex digits of SHA-256 over its two files. A lease names its base version
    by it (``Lease.base_sha``), the coordinator serves the adapter by it, and a worker checks what it got with it;
    a version lost with a restarted coordinator and merged again from other rounds gets another id."""
    h = hashlib.sha256(b"hubgrpo-adapter\0" + len(weights).to_bytes(8, "big"))
    h.update(weights)
    h.update(config)
    return h.hexdigest()[:40]


def check_commit_id(revision: object, what: str = "revision") -> str:
    """``revision`` if it is a commit id (``is_commit_id``), else ``InvalidPath`` naming it."""
    if not is_commit_id(revision):
        raise InvalidPath(
            f"{what} {str(revision)[:80]!r} is not a commit id",
            hint="a commit id is a sha of 40 lowercase hex digits or a version tag such as v000003; "
            "a coordinator that sends anything else is broken or hostile",
        )
    return revision


def version_tag(version: int) -> str:
    """Tag of a global version: v000000, v000001, ..."""
    return f"v{version:06d}"


def parse_tag(tag: str) -> int | None:
    """The version number of a tag, or None when the tag is not a version tag."""
    m = _TAG.fullmatch(tag)
    return int(m.group(1)) if m else None


def submission_id(worker: str, lease_id: str) -> str:
    return f"{check_name(worker)}-{check_name(lease_id, 'lease id')}"


def inbox_token(record: bytes) -> str:
    """What a worker submits for a round put in an inbox (``hub.submissions``): the sha256 of its submission.json."""
    import hashlib

    return "sha256:" + hashlib.sha256(record).hexdigest()


def submission_dir(base_version: int, sub_id: str) -> str:
    """Folder of one submission: submissions/<base version>/<worker>-<lease>."""
    return f"{SUBMISSIONS}/{base_version:06d}/{sub_id}"


def submission_path(base_version: int, sub_id: str, filename: str) -> str:
    return f"{submission_dir(base_version, sub_id)}/{filename}"


def parse_submission_path(path: str) -> tuple[int, str, str] | None:
    """(base version, submission id, file name) for a path inside submissions/, else None."""
    m = _SUB.fullmatch(path)
    return (int(m.group(1)), m.group(2), m.group(3)) if m else None
