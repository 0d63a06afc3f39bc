"""Recording a round's rollouts while TRL trains: the reward functions TRL calls are wrapped.

``RolloutRecorder.wrap(rewards)`` gives TRL one callable per reward function. Each call (one per generation batch
and function) scores the batch through ``hubgrpo.task.rollouts.score`` — the row's own prompt and columns, looked up
by the prompt index the engine puts in every training row (``INDEX_COLUMN``), and the completion in its recorded
form — records the values and returns them to TRL. So the rewards TRL trains on are exactly what the coordinator
recomputes from the file. ``rollouts()`` is the round's ``Rollouts`` record; ``reset()`` starts the next round.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from hubgrpo.errors import RewardError
from hubgrpo.layout import RolloutBatch, Rollouts
from hubgrpo.task.rollouts import as_recorded, dumps, score

INDEX_COLUMN = "hubgrpo_prompt_index"  # the lease's prompt index of a training row (never shown to rewards)


class RolloutRecorder:
    """Every completion of the current round, its prompt index and each reward function's values."""

    def __init__(self, source) -> None:
        self.source = source
        self.names: list[str] = []
        self.batches: list[RolloutBatch] = []

    def wrap(self, rewards: Sequence) -> list:
        """The callables to hand to TRL, one per reward function, in order."""
        self.names = [r.__name__ for r in rewards]
        return [_Recorded(self, j, r) for j, r in enumerate(rewards)]

    def reset(self) -> None:
        self.batches = []

    def rollouts(self) -> Rollouts:
        return Rollouts(reward_names=list(self.names), batches=list(self.batches))

    def save(self, path: Path) -> Path:
        """Write the round's rollouts file."""
        path.write_bytes(dumps(self.rollouts()))
        return path

    def record(self, j: int, indices: list[int], completions: list, values: list) -> None:
        """Function ``j``'s values for one batch: the first function opens the batch, the others add a column."""
        if j == 0:
            self.batches.append(RolloutBatch(prompt_indices=indices, completions=completions, rewards=[values]))
            return
        last = self.batches[-1] if self.batches else None
        if last is None or last.prompt_indices != indices or len(last.rewards) != j:
            raise RewardError(
                f"reward function {self.names[j]} was called out of order",
                hint="TRL calls every reward function once per generation batch, in order",
            )
        last.rewards.append(values)


class _Recorded:
    """One reward function as TRL sees it (named like it, so TRL's per-reward metrics keep their names)."""

    def __init__(self, recorder: RolloutRecorder, j: int, reward):
        self.recorder, self.j, self.reward = recorder, j, reward
        self.__name__ = reward.__name__

    def __call__(self, prompts, completions, **kwargs):
        indices = kwargs.get(INDEX_COLUMN)
        if indices is None:  # rows without prompt indices (not a leased round): score as given, record nothing
            return self.reward(prompts, completions, **kwargs)
        indices = [int(i) for i in indices]
        recorded = [as_recorded(c) for c in completions]
        values = score([self.reward], self.recorder.source, indices, recorded)[0]
        self.recorder.record(self.j, indices, recorded, values)
        return values
