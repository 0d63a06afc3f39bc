"""A round's rollouts (``rollouts.json.gz``): the file, its bounds, and scoring completions the same way everywhere.

A worker records every completion its round generated, with the lease's prompt index it answers and the value of
each reward function (``hubgrpo.worker.rollouts``); the coordinator reads the file back within bounds derived from
the lease (``read``, ``expected_shape``, ``size_limit``) and recomputes each value with the run's own reward
functions (``score``). Both sides call the reward functions through ``score`` with the same inputs — the prompt and
the dataset columns of the row the prompt index names (from the run's own data, never from the worker), the
completion as recorded, and the config's kwargs — so an honest round's recorded and recomputed rewards are equal.
TRL's extra keyword arguments (``trainer_state``, ``completion_ids``, ``log_extra``…) are not passed: a reward must
be a function of the prompt row and the completion text to be verifiable. No torch.
"""

from __future__ import annotations

import gzip
import math
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from hubgrpo.errors import InvalidSubmission
from hubgrpo.layout import ROLLOUTS_FILE, Rollouts

BYTES_PER_TOKEN = 128  # a generous bound on the UTF-8 JSON bytes one generated token can decode to
ROW_OVERHEAD = 512  # JSON around one completion: index, message keys, one reward per function
BYTES_PER_ID = 9  # one token id in JSON: up to 8 digits (MAX_TOKEN_ID) and a comma
UNBOUNDED_PROMPT = 8192  # prompt tokens allowed when params.max_prompt_length is None
FILE_OVERHEAD = 64 << 10


def dumps(rollouts: Rollouts) -> bytes:
    """The compressed file (deterministic: no timestamp in the gzip header)."""
    return gzip.compress(rollouts.model_dump_json().encode(), compresslevel=6, mtime=0)


def as_recorded(completion: Any) -> str | list[dict]:
    """A completion in the form the file keeps (text, or chat messages with string role and content): reward
    functions are called with exactly this form on both sides."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        completion = [completion]
    if isinstance(completion, (list, tuple)):
        return [
            {
                "role": str(m.get("role", "assistant")) if isinstance(m, dict) else "assistant",
                "content": _text(m.get("content", "") if isinstance(m, dict) else m),
            }
            for m in completion
        ]
    return "" if completion is None else str(completion)


def _text(x: Any) -> str:
    return x if isinstance(x, str) else str(x)


# ------------------------------------------------------------------------------------------ bounds


def lease_params(cfg, lease) -> dict:
    """The run's params with the lease's overrides (what the worker trained with)."""
    return {**cfg.params.model_dump(), **{k: v for k, v in lease.params.items() if v is not None}}


def expected_shape(cfg, lease) -> tuple[int, int, int]:
    """(generation batches, completions per batch, completions per prompt) of a round of ``lease``: TRL generates
    once every ``num_iterations`` optimizer steps, per_device_train_batch_size × gradient_accumulation_steps
    completions each time, in groups of ``num_generations`` per prompt."""
    p = lease_params(cfg, lease)
    steps, mu = int(lease.steps), max(1, int(p["num_iterations"]))
    per_batch = int(p["per_device_train_batch_size"]) * int(p["gradient_accumulation_steps"])
    return -(-steps // mu), per_batch, int(p["num_generations"])


def completion_limit(cfg, lease) -> int:
    """The most characters one completion of ``lease`` can decode to (``max_completion_length`` tokens)."""
    return int(lease_params(cfg, lease)["max_completion_length"]) * BYTES_PER_TOKEN


def prompt_limit(cfg, lease) -> int:
    """The most token ids one prompt of ``lease`` can have (``max_prompt_length``, or ``UNBOUNDED_PROMPT``)."""
    return int(lease_params(cfg, lease)["max_prompt_length"] or UNBOUNDED_PROMPT)


def size_limit(cfg, lease) -> int:
    """The largest rollouts file (decompressed) a round of ``lease`` can honestly produce (with its token ids)."""
    batches, per_batch, _ = expected_shape(cfg, lease)
    p = lease_params(cfg, lease)
    ids = (int(p["max_completion_length"]) + prompt_limit(cfg, lease)) * BYTES_PER_ID
    per_row = int(p["max_completion_length"]) * BYTES_PER_TOKEN + ids + ROW_OVERHEAD
    return batches * per_batch * per_row + FILE_OVERHEAD


def read(path: Path, max_bytes: int) -> Rollouts:
    """The rollouts file at ``path``, decompressed at most ``max_bytes`` (a decompression bomb stops there) and
    validated (finite numbers, bounded lists). Raises ``InvalidSubmission``: ``no_rollouts``, ``too_large``,
    ``bad_rollouts``."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise InvalidSubmission(
            "no_rollouts",
            f"the submission has no {ROLLOUTS_FILE}",
            hint="upgrade hubgrpo on the worker: submissions carry their round's rollouts",
        ) from None
    if size > max_bytes:
        raise InvalidSubmission(
            "too_large",
            f"{ROLLOUTS_FILE} holds {size:,} bytes, more than a round of this lease can produce ({max_bytes:,})",
            hint="submit the rollouts your round generated",
        )
    raw = _gunzip(path.read_bytes(), max_bytes)
    try:
        return Rollouts.model_validate_json(raw)
    except ValidationError as e:
        err: Mapping[str, Any] = e.errors()[0] if e.errors() else {}
        where = ".".join(str(p) for p in err.get("loc", ())) or "file"
        why = f"{where}: {err.get('msg', 'invalid')}"[:300]
    except (ValueError, RecursionError) as e:
        why = f"{type(e).__name__}: {str(e)[:200]}"
    raise InvalidSubmission(
        "bad_rollouts",
        f"{ROLLOUTS_FILE} is invalid ({why})",
        hint="rewards must be finite numbers or null; upgrade hubgrpo on the worker",
    )


def _gunzip(data: bytes, max_bytes: int) -> bytes:
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)  # gzip only
    try:
        out = d.decompress(data, max_bytes + 1)
    except zlib.error as e:
        raise InvalidSubmission(
            "bad_rollouts",
            f"{ROLLOUTS_FILE} is not a gzip file ({e})",
            hint="write it with hubgrpo (gzip-compressed JSON)",
        ) from None
    if len(out) > max_bytes or d.unconsumed_tail:
        raise InvalidSubmission(
            "too_large",
            f"{ROLLOUTS_FILE} decompresses to more than {max_bytes:,} bytes, more "
            "than a round of this lease can produce",
            hint="submit the rollouts your round generated",
        )
    if not d.eof or d.unused_data:
        raise InvalidSubmission(
            "bad_rollouts",
            f"{ROLLOUTS_FILE} is truncated or has trailing data",
            hint="the upload was probably interrupted",
        )
    return out


# ------------------------------------------------------------------------------------------ scoring


def reward_inputs(source, indices: Sequence[int]) -> tuple[list, dict[str, list]]:
    """(prompts, dataset columns) for the completions of ``indices``: from the run's own rows."""
    rows = source.rows(indices)
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r if k != "prompt" and k not in keys]
    return [r["prompt"] for r in rows], {k: [r.get(k) for r in rows] for k in keys}


def score(rewards: Sequence, source, indices: Sequence[int], completions: list) -> list[list[float | None]]:
    """Each reward function's values for ``completions`` of the prompts ``indices`` (``[function][completion]``)."""
    prompts, columns = reward_inputs(source, indices)
    return [reward(prompts, completions, **columns) for reward in rewards]


def weighted_mean(weights: Sequence[float], batches) -> float:
    """Mean over every completion of Σ weight·reward, skipping None (``hubgrpo.task.rewards.weighted_rewards``)."""
    total, n = 0.0, 0
    for b in batches:
        for i in range(len(b.completions)):
            total += sum(w * col[i] for w, col in zip(weights, b.rewards) if col[i] is not None)
            n += 1
    return total / n if n else 0.0


def same_reward(a: float | None, b: float | None) -> bool:
    """Recorded and recomputed values agree: both None, or equal up to float noise of another machine's libm."""
    if a is None or b is None:
        return a is None and b is None
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
