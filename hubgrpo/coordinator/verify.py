"""Verified rewards: the coordinator recomputes every submitted round's rewards from its rollouts file.

A submission carries ``rollouts.json.gz`` (``hubgrpo.task.rollouts``): for each generation batch the lease's prompt
index of every completion, the completion, and each reward function's value. ``check(c, lease, folder)`` reads it
within bounds derived from the lease (never from the worker), checks its shape against what the lease's round
generates (batches, completions per batch, groups of ``num_generations`` per prompt, prompt indices of this lease
only, the run's reward functions by name), recomputes every value with the run's own reward functions on the
prompts and columns of the run's own data, and refuses any difference (``reward_mismatch``). The reward of the
round shown everywhere (leaderboard, curves, state.json, model card) is the mean it recomputed; ``reward_mean`` in
submission.json is ignored. No model is needed: a round's rewards take milliseconds.

This proves that the rewards match the completions, not that the submitted adapter wrote them.

The coordinator runs only reward code its operator allowed: built-ins, and ``module:function`` / ``file.py:function``
names passed as ``allow_code`` (``--allow-reward``; a run repo's config alone never makes it import anything). It runs
the allowed non-built-in functions in a child process, within ``coordinator.reward_timeout_s`` per round
(``hubgrpo.task.reward_process``): a round whose completions keep them busy longer (a catastrophic regex) is refused
(``reward_timeout``) and the child killed, while the other admissions go on.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from hubgrpo.errors import HubGrpoError, InvalidSubmission, RewardError
from hubgrpo.layout import MAX_TOKEN_ID, ROLLOUTS_FILE, Lease, Rollouts
from hubgrpo.task import rollouts as rl
from hubgrpo.task.rewards import completion_text

log = logging.getLogger("hubgrpo.coordinator")


class RewardCheck:
    """The run's reward functions and prompt data, loaded once on first use (the data may be a Hub dataset)."""

    def __init__(self, cfg, allow_code: list[str] | None = None):
        from hubgrpo.errors import ConfigError
        from hubgrpo.task.rewards import fill_kwargs, foreign_code

        missing = [f for f in foreign_code(cfg.rewards) if f not in set(allow_code or [])]
        if missing:  # at startup: the coordinator would otherwise import code a run repo's config names
            flags = " ".join(f"--allow-reward {f!r}" for f in missing)
            raise ConfigError(
                f"the run's config names reward code that is not built in: {', '.join(missing)}; the "
                "coordinator recomputes every round's rewards and runs only code its operator allows",
                hint=f"read that code, then start the coordinator with {flags} (on a Space: set the "
                f"variable HUBGRPO_ALLOW_REWARD={','.join(missing)})",
            )
        for rc in cfg.rewards:  # at startup too: a kwarg's placeholder the operator did not allow (fill_kwargs)
            fill_kwargs(rc)
        self.cfg = cfg
        self._lock = threading.Lock()
        self._loaded: tuple | None = None

    def loaded(self) -> tuple[list, object]:
        """(reward functions, prompt source)."""
        with self._lock:
            if self._loaded is None:
                from hubgrpo.task.data import PromptSource
                from hubgrpo.task.reward_process import IsolatedReward, score
                from hubgrpo.task.rewards import load_rewards

                rewards = load_rewards(self.cfg.rewards, isolate=IsolatedReward)
                far = [r for r in rewards if isinstance(r, IsolatedReward)]
                try:  # imported once in a child now: an import error is the operator's, never a round's
                    if far:
                        score(far, [], self.cfg.coordinator.reward_timeout_s)
                except TimeoutError as e:
                    raise RewardError(
                        f"importing the run's reward code: {e}",
                        hint="raise coordinator.reward_timeout_s, or import less at module level",
                    ) from None
                self._loaded = (rewards, PromptSource.from_config(self.cfg))
            return self._loaded

    def check(self, lease: Lease, folder: Path) -> float:
        """The round's mean weighted reward, recomputed; ``InvalidSubmission`` when the file is missing, too large,
        malformed, shaped unlike the lease's round, or its rewards differ from the recomputed ones."""
        data = rl.read(folder / ROLLOUTS_FILE, rl.size_limit(self.cfg, lease))
        rewards, source = self.loaded()
        check_shape(self.cfg, lease, data, [r.__name__ for r in rewards])
        values = self.rescore(rewards, source, data)
        for b, (batch, again) in enumerate(zip(data.batches, values)):
            for j, (said, real) in enumerate(zip(batch.rewards, again)):
                for i, (x, y) in enumerate(zip(said, real)):
                    if not rl.same_reward(x, y):
                        raise InvalidSubmission(
                            "reward_mismatch",
                            f"{ROLLOUTS_FILE}: reward {rewards[j].__name__} of completion {i} in "
                            f"batch {b} is {x}, but its completion scores {y}",
                            hint="submit the rewards the run's reward functions give your completions",
                        )
        return rl.weighted_mean([r.weight for r in rewards], data.batches)

    def rescore(self, rewards: list, source, data: Rollouts) -> list[list[list]]:
        """``[batch][function][completion]`` recomputed: built-ins here, the others in one child process within
        ``coordinator.reward_timeout_s`` (``InvalidSubmission``: ``reward_timeout`` past it, ``reward_mismatch``
        when a function fails on these completions)."""
        from hubgrpo.task.reward_process import IsolatedReward, score

        inputs = [(*rl.reward_inputs(source, b.prompt_indices), completions_of(b)) for b in data.batches]
        far = [j for j, r in enumerate(rewards) if isinstance(r, IsolatedReward)]
        out: list[list] = [[None] * len(rewards) for _ in inputs]
        batch = None
        try:
            for batch, (prompts, columns, completions) in enumerate(inputs):
                for j, r in enumerate(rewards):
                    if j not in far:
                        out[batch][j] = r(prompts, completions, **columns)
            batch = None  # the child names the batch itself
            if far:
                for b, row in enumerate(
                    score([rewards[j] for j in far], inputs, self.cfg.coordinator.reward_timeout_s)
                ):
                    for j, v in zip(far, row):
                        out[b][j] = v
        except HubGrpoError as e:  # a reward function failed on these completions
            where = "" if batch is None else f"batch {batch}: "
            raise InvalidSubmission(
                "reward_mismatch", where + e.message[:300], hint="submit the completions your round generated"
            ) from None
        except TimeoutError as e:
            raise InvalidSubmission(
                "reward_timeout",
                str(e),
                hint="submit the completions your round generated; "
                "the coordinator's operator may raise coordinator.reward_timeout_s",
            ) from None
        return out


def completions_of(batch) -> list:
    """The batch's completions as reward functions get them (text, or chat messages as dicts)."""
    return [c if isinstance(c, str) else [m.model_dump() for m in c] for c in batch.completions]


def check_shape(cfg, lease: Lease, data: Rollouts, names: list[str]) -> None:
    """The file holds exactly what a round of ``lease`` generates, scored by the run's reward functions."""
    n_batches, per_batch, group = rl.expected_shape(cfg, lease)

    def bad(why: str):
        raise InvalidSubmission(
            "bad_rollouts", f"{ROLLOUTS_FILE}: {why}", hint="submit the rollouts file your round wrote, unchanged"
        )

    if data.reward_names != names:
        bad(f"reward functions {data.reward_names[:8]} are not the run's {names}")
    if len(data.batches) != n_batches:
        bad(f"{len(data.batches)} generation batches; a round of {lease.steps} steps has {n_batches}")
    allowed, longest = set(lease.prompt_indices), rl.completion_limit(cfg, lease)
    for b, batch in enumerate(data.batches):
        sizes = {len(batch.prompt_indices), len(batch.completions), *(len(col) for col in batch.rewards)}
        if sizes != {per_batch} or len(batch.rewards) != len(names):
            bad(f"batch {b} is not {per_batch} completions with one value per reward function")
        if not allowed.issuperset(batch.prompt_indices):
            foreign = sorted(set(batch.prompt_indices) - allowed)[:5]
            bad(f"batch {b} answers prompts the lease did not give (indices {foreign})")
        idx = batch.prompt_indices
        if any(len(set(idx[k : k + group])) != 1 for k in range(0, per_batch, group)):
            bad(f"batch {b} is not in groups of {group} completions per prompt")
        if any(len(completion_text(c)) > longest for c in completions_of(batch)):  # before any reward runs on it
            bad(
                f"batch {b} holds a completion longer than {longest:,} characters, more than "
                f"max_completion_length tokens decode to"
            )
        check_ids(cfg, lease, b, batch, bad)


def check_ids(cfg, lease: Lease, b: int, batch, bad) -> None:
    """Batch ``b``'s token ids (schema 2, keyed sampling): one prompt and one completion per completion, ids in
    [0, vocabulary), completions within max_completion_length tokens and their texts within what those tokens can
    decode to; rounds without ids only where no verification is asked for (``coordinator.verify: off``)."""
    if batch.prompt_ids is None or batch.completion_ids is None:
        if batch.prompt_ids is not None or batch.completion_ids is not None:
            bad(f"batch {b} carries prompt ids or completion ids, not both")
        if cfg.coordinator.verify != "off":
            bad(
                f"batch {b} carries no token ids, and this run verifies rounds (coordinator.verify: "
                f"{cfg.coordinator.verify})"
            )
        return
    n = len(batch.completions)
    if len(batch.prompt_ids) != n or len(batch.completion_ids) != n:
        bad(f"batch {b} has {len(batch.completion_ids)} completion ids and {len(batch.prompt_ids)} prompt ids for {n}")
    most = int(rl.lease_params(cfg, lease)["max_completion_length"])
    prompt_most, vocab = rl.prompt_limit(cfg, lease), vocab_size(cfg)
    for i, (text, ids) in enumerate(zip(completions_of(batch), batch.completion_ids)):
        if len(ids) > most:
            bad(f"completion {i} of batch {b} has {len(ids)} tokens, more than max_completion_length ({most})")
        if len(completion_text(text).encode()) > len(ids) * rl.BYTES_PER_TOKEN:
            bad(f"completion {i} of batch {b} is longer than its {len(ids)} tokens can decode to")
        if ids and max(ids) >= vocab:
            bad(f"completion {i} of batch {b} has token id {max(ids)}, outside the vocabulary ({vocab})")
    for i, ids in enumerate(batch.prompt_ids):
        if not ids or len(ids) > prompt_most:
            bad(f"prompt ids {i} of batch {b} hold {len(ids)} tokens (1…{prompt_most} allowed)")
        if max(ids) >= vocab:
            bad(f"prompt ids {i} of batch {b} have token id {max(ids)}, outside the vocabulary ({vocab})")


_VOCAB: dict[str, int] = {}


def vocab_size(cfg) -> int:
    """The base model's vocabulary size (its config.json, read once); ``MAX_TOKEN_ID`` when it cannot be read."""
    if cfg.base_model.startswith("builtin:"):  # built on the worker side: the verifier checks them
        return MAX_TOKEN_ID
    if cfg.base_model not in _VOCAB:
        try:
            from transformers import AutoConfig

            conf = AutoConfig.from_pretrained(cfg.base_model)
            text = getattr(conf, "get_text_config", lambda: conf)()
            _VOCAB[cfg.base_model] = int(text.vocab_size)
        except Exception as e:  # noqa: BLE001 — any failure falls back to the schema's bound
            log.warning("vocabulary of %s unknown (%s): token ids checked against %d", cfg.base_model, e, MAX_TOKEN_ID)
            _VOCAB[cfg.base_model] = MAX_TOKEN_ID  # a verifier checks them against the model itself
    return _VOCAB[cfg.base_model]
