"""Sampling that can be replayed: Gumbel-max with the lease's noise, as a transformers ``LogitsProcessor``.

``KeyedGumbelProcessor`` turns a row's scores into ``warp(scores) + g``: ``warp`` is what transformers' sampling
applies (``TemperatureLogitsWarper``, then ``TopKLogitsWarper``, then ``TopPLogitsWarper``, the same classes in the
same order with the same ``min_tokens_to_keep``), ``g`` the keyed noise of ``hubgrpo.proof.noise``. Greedy decoding
over these scores (``do_sample=False``: argmax) samples from ``softmax(warp(scores))`` exactly (the Gumbel-max
trick), and anyone holding the model, the key and the tokens can replay each choice.

``keyed_generate`` is a ``model.generate`` wrapper that makes a sampling call of TRL's into such a call: it copies
the generation config with ``do_sample=False`` and the warpers' settings cleared (the processor applies them), and
passes the processor, which comes after every processor ``generate`` builds itself (a repetition penalty, …).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import (
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from hubgrpo.errors import ConfigError
from hubgrpo.proof.noise import gumbel

# sampling options of a GenerationConfig this module cannot replay; each must be off (None, or its neutral value)
UNSUPPORTED = {"min_p": None, "typical_p": 1.0, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0, "top_h": None}
# options with which ``generate`` changes the scores before the keyed processor (a processor of its own), decodes
# otherwise, or ends a completion elsewhere than its stop tokens and length, none of which the verifier replays; each
# must be off in the call's config and, where that leaves it unset (None), in the model's own generation config,
# which ``generate`` fills such fields from (a model's generation_config.json can carry them). Options that act on
# encoder-decoder models or on an empty prompt only are left out.
PROCESSED = {
    "repetition_penalty": 1.0,
    "no_repeat_ngram_size": 0,
    "bad_words_ids": None,
    "sequence_bias": None,
    "min_length": 0,
    "min_new_tokens": 0,
    "forced_eos_token_id": None,
    "suppress_tokens": None,
    "begin_suppress_tokens": None,
    "exponential_decay_length_penalty": None,
    "guidance_scale": 1.0,
    "watermarking_config": None,
    "num_beams": 1,
    "dola_layers": None,
    "stop_strings": None,
    "max_time": None,
}


def effective(config: Any, defaults: Any, name: str) -> Any:
    """A generation setting as ``generate`` uses it: the call's config's, or where that leaves it unset (None) the
    model's own generation config's (``defaults``; ``generate`` fills the unset fields from it)."""
    value = getattr(config, name, None)
    return getattr(defaults, name, None) if value is None else value


def check_processors(config: GenerationConfig, defaults: GenerationConfig | None) -> None:
    """``ConfigError`` when ``generate`` would change the scores before the keyed processor (``PROCESSED``): the
    worker would sample from scores the verifier does not compute, and its honest rounds would fail."""
    used = {}
    for key, neutral in PROCESSED.items():
        value = effective(config, defaults, key)
        if value not in (None, neutral) and value != [] and value != {}:
            used[key] = value
    if used:
        raise ConfigError(
            f"keyed sampling cannot replay the generation options {used} (from the call or the model's "
            "generation_config)",
            hint="set them to their neutral values in the model's generation_config, or worker.keyed_sampling: false",
        )


@dataclass(frozen=True)
class Warp:
    """The sampling distribution's settings: temperature, top-k (0 or None: off), top-p (1.0 or None: off)."""

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None

    def processors(self) -> list[LogitsProcessor]:
        """The warpers transformers' sampling builds for these settings, in its order."""
        out: list[LogitsProcessor] = []
        if self.temperature != 1.0:
            out.append(TemperatureLogitsWarper(self.temperature))
        if self.top_k:
            out.append(TopKLogitsWarper(top_k=self.top_k, min_tokens_to_keep=1))
        if self.top_p is not None and self.top_p < 1.0:
            out.append(TopPLogitsWarper(top_p=self.top_p, min_tokens_to_keep=1))
        return out

    def apply(self, scores: torch.Tensor) -> torch.Tensor:
        """``scores`` [N, V] float32, warped (masked tokens at -inf)."""
        for p in self.processors():
            scores = p(None, scores)  # the warpers never read input_ids
        return scores

    @classmethod
    def of(cls, config: GenerationConfig) -> Warp:
        """The settings a sampling ``GenerationConfig`` samples with; ``ConfigError`` for options it cannot replay."""
        used = {k: getattr(config, k, v) for k, v in UNSUPPORTED.items() if getattr(config, k, v) not in (None, v)}
        if used or (config.num_beams or 1) > 1:
            raise ConfigError(
                f"keyed sampling cannot replay the generation options {used or {'num_beams': config.num_beams}}",
                hint="leave min_p, typical_p, epsilon/eta cutoffs and beams unset, or set worker.keyed_sampling: false",
            )
        return cls(config.temperature or 1.0, config.top_k or None, config.top_p)


class KeyedGumbelProcessor(LogitsProcessor):
    """``warp(scores) + g(seed, completion index, position)``: greedy decoding over it is sampling.

    ``completions`` [B]: each row's completion index in the round; ``prompt_length``: the width of the (padded)
    prompt ``generate`` started from, so the position of the token being chosen is
    ``input_ids.shape[1] - prompt_length`` (0 for the first completion token).
    """

    def __init__(self, seed: int, completions: torch.Tensor, prompt_length: int, warp: Warp):
        self.seed, self.completions, self.prompt_length, self.warp = seed, completions, prompt_length, warp

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        position = input_ids.shape[1] - self.prompt_length
        rows = self.completions.to(scores.device)
        noise = gumbel(self.seed, rows, torch.full_like(rows, position), scores.shape[-1])
        return self.warp.apply(scores.float()) + noise  # type: ignore[return-value]


@dataclass
class KeyedSampling:
    """A round's sampling key: the lease's seed and the index of the next completion the round generates."""

    seed: int
    next_index: int = 0

    def take(self, rows: int) -> torch.Tensor:
        """The completion indices of the next ``rows`` completions (in the order ``generate`` gets them)."""
        indices = torch.arange(self.next_index, self.next_index + rows, dtype=torch.int64)
        self.next_index += rows
        return indices


def greedy_config(config: GenerationConfig) -> GenerationConfig:
    """A copy of a sampling config that decodes greedily, its warpers cleared (the processor applies them)."""
    greedy = GenerationConfig.from_dict(config.to_dict())
    greedy.do_sample = False
    greedy.temperature, greedy.top_k, greedy.top_p = None, None, None
    return greedy


def unkeyable(args: tuple, config: GenerationConfig | None, ids, processors) -> str:
    """Why a ``generate`` call cannot be keyed ('' when it can)."""
    if args:
        return "positional arguments"
    if config is None or ids is None:
        return "no generation_config or input_ids keyword"
    if not config.do_sample:
        return "do_sample is false"
    return "logits processors of the caller's own" if processors else ""


def keyed_generate(original, sampling: KeyedSampling, defaults: GenerationConfig | None, *args, **kwargs):
    """``model.generate`` (``original``) with a sampling config replaced by keyed Gumbel-max decoding; ``defaults``:
    the model's own generation config (``check_processors``).

    It wraps only the calls of a keyed round, whose completions are recorded as keyed: a call it cannot key (no
    sampling config or input ids as keywords, ``do_sample`` false, processors of the caller's own) is a
    ``ConfigError``, never a round of TRL's random sampling that the verifier would fail as forged."""
    config = kwargs.get("generation_config")
    ids = kwargs.get("input_ids")
    why = unkeyable(args, config, ids, kwargs.get("logits_processor"))
    if why or config is None or ids is None:
        raise ConfigError(
            f"keyed sampling got a generate call it cannot key: {why}",
            hint="this TRL version generates otherwise than hubgrpo expects (pin the trl version hubgrpo requires), "
            "or set worker.keyed_sampling: false (rounds then cannot be verified)",
        )
    check_processors(config, defaults)
    warp = Warp.of(config)
    processor = KeyedGumbelProcessor(sampling.seed, sampling.take(ids.size(0)), ids.size(1), warp)
    kwargs["generation_config"] = greedy_config(config)
    return original(**kwargs, logits_processor=LogitsProcessorList([processor]))


def left_pad(prompts_ids: Sequence[Sequence[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention mask) [B, P]: prompts left-padded to the longest, as TRL hands them to ``generate``."""
    width = max(len(p) for p in prompts_ids)
    ids = torch.full((len(prompts_ids), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts_ids):
        if len(p):
            ids[i, width - len(p) :] = torch.tensor(list(p), dtype=torch.long)
            mask[i, width - len(p) :] = 1
    return ids, mask


def cut_at_eos(completions: torch.Tensor, eos: Sequence[int]) -> list[list[int]]:
    """Each row up to and including its first end-of-sequence token (what TRL keeps of a completion)."""
    out = []
    for row in completions.tolist():
        end = next((i for i, t in enumerate(row) if t in eos), len(row) - 1)
        out.append(row[: end + 1])
    return out


@torch.no_grad()
def generate_keyed(
    model,
    prompts_ids: Sequence[Sequence[int]],
    *,
    seed: int,
    first_index: int = 0,
    warp: Warp = Warp(),
    max_new_tokens: int,
    eos_token_id: int | list[int],
    pad_token_id: int,
) -> list[list[int]]:
    """Completions sampled with keyed Gumbel-max outside a trainer (a verifier's own replay, tests, benchmarks):
    row ``i`` is completion ``first_index + i`` of the round."""
    ids, mask = left_pad(prompts_ids, pad_token_id)
    device = next(model.parameters()).device
    eos = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
    config = GenerationConfig(
        max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos, pad_token_id=pad_token_id
    )
    indices = torch.arange(first_index, first_index + len(prompts_ids), dtype=torch.int64)
    processor = KeyedGumbelProcessor(seed, indices, ids.size(1), warp)
    out = model.generate(
        input_ids=ids.to(device),
        attention_mask=mask.to(device),
        generation_config=config,
        logits_processor=LogitsProcessorList([processor]),
    )
    return cut_at_eos(out[:, ids.size(1) :].cpu(), eos)
