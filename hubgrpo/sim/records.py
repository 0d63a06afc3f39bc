"""What a simulation keeps of its run: the events on its virtual clock and the record of each leased round."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(order=True)
class Event:
    """Something that happens at virtual time ``t`` (``seq`` orders events at the same time)."""

    t: float
    seq: int
    kind: str = field(compare=False)
    worker: int = field(compare=False, default=-1)
    data: Any = field(compare=False, default=None)


@dataclass
class RoundRecord:
    """One leased round: when it was leased, trained and delivered (virtual seconds), and what became of it."""

    worker: str
    lease_id: str
    base_version: int
    t_lease: float
    t_deliver: float | None = None
    status: str = "training"  # admitted | merged | refused | dropped
    code: str | None = None
    staleness_at_delivery: int | None = None
    train_reward: float | None = None
    rebased_version: int | None = None  # merge.rebase: the version the round moved onto mid-round
