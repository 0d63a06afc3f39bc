"""The prompt pool: which prompt indices a lease gets.

Prompt indices are a running counter (``PromptSource.rows`` maps any index onto the data set, epoch by epoch);
shards of expired or released leases go back to the pool and are handed out first.
"""

from __future__ import annotations

from collections import deque


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
