"""What one round produced: the trainer's metrics, counts and seconds, and the submission record made of them."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from hubgrpo.layout import SUBMISSION_FILE, Lease, StepMetrics, Submission, submission_id
from hubgrpo.worker.steplog import library_versions


@dataclass
class TrainResult:
    """What ``RoundEngine.train_steps`` did: per-step metrics, counts and seconds."""

    step_metrics: list[StepMetrics]
    samples: int = 0  # completions generated
    prompts: int = 0  # prompt rows sampled (samples / num_generations)
    tokens: int = 0  # prompt + completion tokens of the generated samples
    timings: dict[str, float] = field(default_factory=dict)


def build_submission(
    lease: Lease,
    result: TrainResult,
    *,
    base_model: str,
    reward_mean: float,
    device: str,
    rebased_version: int | None,
    rebased_sha: str | None,
) -> Submission:
    """The submission record of a round trained on ``lease`` (worker and submission id from the lease)."""
    rewards = [m.reward for m in result.step_metrics]
    return Submission(
        submission_id=submission_id(lease.worker, lease.lease_id),
        worker=lease.worker,
        user=lease.user,
        lease=lease,
        base_version=lease.base_version,
        base_sha=lease.base_sha,
        base_model=base_model,
        steps=len(result.step_metrics),
        samples=result.samples,
        prompts=result.prompts,
        tokens=result.tokens,
        reward_mean=reward_mean,
        reward_first=rewards[0] if rewards else 0.0,
        reward_last=rewards[-1] if rewards else 0.0,
        step_metrics=result.step_metrics,
        timings=dict(result.timings),
        versions=library_versions(),
        device=device,
        created_at=time.time(),
        rebased_version=rebased_version,
        rebased_sha=rebased_sha,
    )


def write_submission(out_dir: Path, sub: Submission) -> None:
    """Write ``submission.json`` into ``out_dir`` atomically (a temporary file, then a rename)."""
    tmp = out_dir / f".{SUBMISSION_FILE}.tmp"
    tmp.write_bytes(sub.to_json())
    os.replace(tmp, out_dir / SUBMISSION_FILE)
