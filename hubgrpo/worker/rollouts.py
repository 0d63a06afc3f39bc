"""Recording a round's rollouts while TRL trains: the reward functions TRL calls are wrapped.

``RolloutRecorder.wrap(rewards)`` gives TRL one callable per reward function. Each call (one per generation batch
and function) scores the batch through ``hubgrpo.task.rollouts.score`` — the row's own prompt and columns, looked up
by the prompt index the engine puts in every training row (``INDEX_COLUMN``), and the completion in its recorded
form — records the values and returns them to TRL. So the rewards TRL trains on are exactly what the coordinator
recomputes from the file. ``rollouts()`` is the round's ``Rollouts`` record; ``reset()`` starts the next round.
With keyed sampling, ``save`` adds the token ids of every generation batch (``hubgrpo.worker.keyed.KeyedBatch``, in
the same order as the reward calls): what a verifier replays (``hubgrpo.proof``).
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

    def save(self, path: Path, keyed: Sequence | None = None) -> Path:
        """Write the round's rollouts file; ``keyed``: the round's keyed generation batches (their token ids)."""
        if keyed is not None:
            self.attach_ids(keyed)
        path.write_bytes(dumps(self.rollouts()))
        return path

    def attach_ids(self, keyed: Sequence) -> None:
        """Give batch ``b`` the prompt and completion ids of keyed generation batch ``b`` (same completions, same
        order: TRL scores what it generated, in order)."""
        sizes = [len(b.completions) for b in self.batches]
        if [len(k.completion_ids) for k in keyed] != sizes or [len(k.prompt_ids) for k in keyed] != sizes:
            raise RewardError(
                f"the round generated {len(keyed)} keyed batches of {[len(k.completion_ids) for k in keyed][:8]} "
                f"completions, but its rewards scored {len(sizes)} batches of {sizes[:8]}",
                hint="a verifier could not replay this round; report this as a bug of hubgrpo",
            )
        for b, k in zip(self.batches, keyed):
            b.prompt_ids = [[int(t) for t in ids] for ids in k.prompt_ids]
            b.completion_ids = [[int(t) for t in ids] for ids in k.completion_ids]

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
