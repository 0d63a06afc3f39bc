"""Signed leases and the prompt pool.

A lease is signed with HMAC-SHA256 over its canonical JSON (every field but ``signature`` and the presigned
``uploads`` URLs, which the bucket's own signature protects and which are re-minted freely), so a restarted
coordinator recognises its own leases without storing them. Heartbeats re-sign the lease with a later deadline.
Prompt indices are a running counter (``PromptSource.rows`` maps any index onto the data set, epoch by epoch);
shards of expired or released leases go back to the pool and are handed out first.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from collections import deque

from hubgrpo.errors import LeaseError
from hubgrpo.layout import Lease


def _payload(lease: Lease) -> bytes:
    data = lease.model_dump(mode="json", exclude={"signature", "uploads"})  # URLs are signed by the bucket
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()


def sign(lease: Lease, secret: bytes) -> Lease:
    """A copy of ``lease`` carrying its HMAC signature."""
    sig = hmac.new(secret, _payload(lease), hashlib.sha256).hexdigest()
    return lease.model_copy(update={"signature": sig})


def verify(lease: Lease, secret: bytes, *, run_id: str, now: float, check_deadline: bool = True) -> Lease:
    """Raise LeaseError unless ``lease`` was signed by this coordinator for this run (and has not expired)."""
    expected = hmac.new(secret, _payload(lease), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, lease.signature or ""):
        raise LeaseError(
            f"lease {lease.lease_id} has an invalid signature (forged, altered, or from another coordinator secret)",
            hint="ask for a new lease",
            code="bad_signature",
        )
    if lease.run_id != run_id:
        raise LeaseError(
            f"lease {lease.lease_id} belongs to run {lease.run_id}, not {run_id}",
            hint="the run repo was re-initialised; ask for a new lease",
            code="wrong_run",
        )
    if check_deadline and now > lease.deadline:
        raise LeaseError(
            f"lease {lease.lease_id} expired {now - lease.deadline:.0f} s ago",
            hint="heartbeat more often than coordinator.lease_timeout_s; ask for a new lease",
            code="expired",
        )
    return lease


def new_lease_id() -> str:
    return secrets.token_hex(6)


class PromptPool:
    """Hands out prompt shards: returned shards first, then fresh indices from a running counter."""

    def __init__(self, next_index: int = 0):
        self.next_index = next_index
        self._returned: deque[list[int]] = deque()

    def take(self, n: int) -> list[int]:
        """n prompt indices (a returned shard is split or topped up from the counter to exactly n)."""
        out: list[int] = []
        while self._returned and len(out) < n:
            shard = self._returned.popleft()
            room = n - len(out)
            out += shard[:room]
            if len(shard) > room:
                self._returned.appendleft(shard[room:])
        fresh = n - len(out)
        out += list(range(self.next_index, self.next_index + fresh))
        self.next_index += fresh
        return out

    def give_back(self, indices: list[int]) -> None:
        if indices:
            self._returned.append(list(indices))

    def reclaim(self, indices: list[int]) -> None:
        """Take ``indices`` out of the returned shards (a lease revived after they were given back)."""
        drop = set(indices)
        kept = [[i for i in shard if i not in drop] for shard in self._returned]
        self._returned = deque(s for s in kept if s)

    @property
    def returned(self) -> int:
        return sum(len(s) for s in self._returned)
