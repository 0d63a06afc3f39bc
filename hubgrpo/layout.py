"""The run repo's schema: record types (strict, schema-versioned pydantic) and the one place that knows paths.

Layout of a run repo (the bucket)::

    adapter_model.safetensors, adapter_config.json   current global adapter (loadable with PeftModel)
    README.md                                        model card
    hubgrpo.yaml                                     resolved config (secrets redacted)
    state.json                                       RunState: versions, merged/refused submissions, workers
    optimizer/outer_momentum.safetensors             outer-optimizer state (only with outer momentum)
    submissions/<base version>/<worker>-<lease>/     adapter_model.safetensors, adapter_config.json, submission.json
    tags v000000, v000001, ...                       one per global version

No torch import here: the coordinator's Space stays light.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from hubgrpo.errors import InvalidSubmission

SCHEMA_VERSION = 1

ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
MODEL_CARD = "README.md"
CONFIG_FILE = "hubgrpo.yaml"
STATE_FILE = "state.json"
MOMENTUM_FILE = "optimizer/outer_momentum.safetensors"
SUBMISSIONS = "submissions"
SUBMISSION_FILE = "submission.json"
ADAPTER_FILES = (ADAPTER_WEIGHTS, ADAPTER_CONFIG)

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_TAG = re.compile(r"v(\d{6,})")
_SUB = re.compile(r"submissions/(\d{6,})/([A-Za-z0-9][A-Za-z0-9._-]{0,160})/([^/]+)")


class Record(BaseModel):
    """Base of every record kept in the repo: unknown keys refused, types strict."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=False)

    def to_json(self) -> bytes:
        return self.model_dump_json(indent=1).encode()

    @classmethod
    def from_json(cls, data: bytes | str):
        return cls.model_validate_json(data)


class Lease(Record):
    """A round leased to one worker. Signed by the coordinator (HMAC), so it needs no durable storage."""

    schema_version: Literal[1] = 1
    lease_id: str
    run_id: str
    round_id: int
    worker: str
    user: str | None = None
    base_version: int
    base_sha: str
    prompt_indices: list[int]
    steps: int
    seed: int
    params: dict[str, float | int | str | bool | None] = Field(default_factory=dict)
    issued_at: float
    deadline: float
    signature: str = ""


class StepMetrics(Record):
    """One GRPO optimizer step, as logged by TRL."""

    step: int
    reward: float
    reward_std: float | None = None
    loss: float | None = None
    kl: float | None = None
    clip_ratio: float | None = None
    entropy: float | None = None
    grad_norm: float | None = None
    completion_length: float | None = None
    step_time: float | None = None


class Submission(Record):
    """submission.json: what a worker trained in one round."""

    schema_version: Literal[1] = 1
    submission_id: str
    worker: str
    user: str | None = None
    lease: Lease
    base_version: int
    base_sha: str
    base_model: str
    steps: int
    samples: int
    prompts: int
    tokens: int
    reward_mean: float
    reward_first: float
    reward_last: float
    step_metrics: list[StepMetrics]
    timings: dict[str, float]
    versions: dict[str, str]
    device: str
    created_at: float


class MergedEntry(Record):
    """One submission as it went into a version."""

    submission_id: str
    worker: str
    user: str | None = None
    base_version: int
    staleness: int
    weight: float
    samples: int
    reward_mean: float


class Refusal(Record):
    """A refused submission or request, with its machine-readable code and human reason."""

    submission_id: str
    worker: str
    code: str
    message: str
    at: float
    version: int


class VersionRecord(Record):
    """One global version (tag vNNNNNN)."""

    version: int
    tag: str
    created_at: float
    method: str
    algorithm: str | None = None
    residual: float | None = None
    update_norm: float | None = None
    outer_lr: float = 1.0
    merged: list[MergedEntry] = Field(default_factory=list)
    reward_mean: float | None = None
    samples: int = 0


class WorkerStats(Record):
    """Leaderboard row for one worker."""

    worker: str
    user: str | None = None
    accepted: int = 0
    refused: int = 0
    samples: int = 0
    reward_sum: float = 0.0
    reward_first: float | None = None
    reward_last: float | None = None
    first_seen: float = 0.0
    last_seen: float = 0.0


class RunState(Record):
    """state.json: everything the coordinator needs to continue after a restart."""

    schema_version: Literal[1] = 1
    run_id: str
    project_name: str
    version: int = 0
    versions: list[VersionRecord] = Field(default_factory=list)
    merged_ids: list[str] = Field(default_factory=list)
    refused: list[Refusal] = Field(default_factory=list)
    workers: dict[str, WorkerStats] = Field(default_factory=dict)
    next_prompt: int = 0
    commit_times: list[float] = Field(default_factory=list)
    samples_total: int = 0
    started_at: float = 0.0
    finished: bool = False


# ------------------------------------------------------------------------------------------------ paths


def check_name(name: str, what: str = "worker name") -> str:
    """Worker names and lease ids become path segments: refuse anything but [A-Za-z0-9._-]."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or ".." in name:
        raise InvalidSubmission("bad_name", f"{what} {name!r} is not allowed",
                                hint="use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit")
    return name


def version_tag(version: int) -> str:
    """Tag of a global version: v000000, v000001, ..."""
    return f"v{version:06d}"


def parse_tag(tag: str) -> int | None:
    """The version number of a tag, or None when the tag is not a version tag."""
    m = _TAG.fullmatch(tag)
    return int(m.group(1)) if m else None


def submission_id(worker: str, lease_id: str) -> str:
    return f"{check_name(worker)}-{check_name(lease_id, 'lease id')}"


def submission_dir(base_version: int, sub_id: str) -> str:
    """Folder of one submission: submissions/<base version>/<worker>-<lease>."""
    return f"{SUBMISSIONS}/{base_version:06d}/{sub_id}"


def submission_path(base_version: int, sub_id: str, filename: str) -> str:
    return f"{submission_dir(base_version, sub_id)}/{filename}"


def parse_submission_path(path: str) -> tuple[int, str, str] | None:
    """(base version, submission id, file name) for a path inside submissions/, else None."""
    m = _SUB.fullmatch(path)
    return (int(m.group(1)), m.group(2), m.group(3)) if m else None
