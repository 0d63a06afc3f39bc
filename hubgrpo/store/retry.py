"""The retry policy shared by the remote backends (``hub``, ``s3``): how long to wait before trying again."""

from __future__ import annotations

import random

from hubgrpo.errors import RateLimited, RepoBusy, StoreError, StoreUnavailable


def retry_delay(
    err: StoreError, attempt: int, *, base_s: float = 1.0, cap_s: float = 30.0, rng: random.Random | None = None
) -> float | None:
    """Seconds to wait before retry ``attempt`` (1, 2, …) after ``err``; None means the error is final.

    429: the server's wait plus up to 10 % jitter. 409 (busy) and 5xx/timeouts: full-jitter exponential backoff,
    ``base_s·2^(attempt-1)`` capped at ``cap_s``, times a factor in [0.5, 1). Everything else is not retried.
    """
    r = (rng or random).random()
    if isinstance(err, RateLimited):
        return err.wait_s * (1.0 + 0.1 * r)
    if isinstance(err, (RepoBusy, StoreUnavailable)):
        return min(cap_s, base_s * 2 ** (attempt - 1)) * (0.5 + 0.5 * r)
    return None
