"""Which completions of a submitted round to replay: chosen after submission, unpredictable to the worker.

The choice is a function of a key that only the verifier side can compute: ``selection_key(secret, digest)`` is
HMAC-SHA256 of the submission's own digest (say, the sha256 of its rollouts file) under the coordinator's secret.
The worker knows its digest but not the secret, so it cannot tell which completions will be checked; the
coordinator can recompute the choice later (an audit replays the same completions). ``choose`` shuffles the
completions with that key and takes them in turn while their tokens fit the budget (a fraction of the round's
completion tokens), and always at least one. No torch.
"""

from __future__ import annotations

import hashlib
import hmac
import random
from collections.abc import Sequence

BUDGET = 0.10  # at most this fraction of a round's completion tokens is replayed


def selection_key(secret: bytes, digest: bytes | str) -> bytes:
    """The key that picks a submission's checked completions: HMAC-SHA256(secret, digest)."""
    if len(secret) < 16:
        raise ValueError("the selection secret must hold at least 16 bytes: use the coordinator's signing secret")
    data = digest.encode() if isinstance(digest, str) else digest
    return hmac.new(secret, data, hashlib.sha256).digest()


def choose(lengths: Sequence[int], key: bytes, budget: float = BUDGET) -> list[int]:
    """Indices (ascending) of the completions to replay: a keyed shuffle, taken while the tokens stay within
    ``budget`` × the round's tokens; at least one completion (the first of the shuffle) when there is any."""
    if not 0 < budget <= 1:
        raise ValueError(f"budget {budget} is not a fraction in (0, 1]")
    order = list(range(len(lengths)))
    random.Random(int.from_bytes(key, "big")).shuffle(order)
    allowed = budget * sum(lengths)
    taken: list[int] = []
    used = 0
    for i in order:
        if taken and used + lengths[i] > allowed:
            continue
        taken.append(i)
        used += lengths[i]
    return sorted(taken)
