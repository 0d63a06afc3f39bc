"""Signed leases: signing, checking, and lease ids.

A lease is signed with HMAC-SHA256 over its canonical JSON (every field but ``signature`` and the presigned
``uploads`` URLs, which the bucket's own signature protects and which are re-minted freely), so a restarted
coordinator recognises its own leases without storing them. Heartbeats re-sign the lease with a later deadline.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets

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
