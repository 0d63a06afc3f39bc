"""Held-out scoring: completions for a batch of prompts, greedy or sampled, and the rewards they earn."""

from __future__ import annotations

from typing import Any

import torch
from transformers import GenerationConfig

from hubgrpo.task.rewards import weighted_rewards


def mean_reward(
    model: Any,
    tokenizer: Any,
    rows: list[dict],
    rewards: list,
    *,
    batch_size: int,
    greedy: bool,
    seed: int,
    max_new_tokens: int,
    eos_token_ids: Any,
    temperature: float,
) -> float:
    """The mean of ``score_batch`` over ``rows`` in batches of ``batch_size``, the model in eval mode meanwhile
    (sampling starts from ``seed``)."""
    was_training = model.training
    model.eval()
    try:
        totals: list[float] = []
        if not greedy:
            torch.manual_seed(seed)
        for i in range(0, len(rows), batch_size):
            totals += score_batch(
                model,
                tokenizer,
                rows[i : i + batch_size],
                rewards,
                max_new_tokens=max_new_tokens,
                eos_token_ids=eos_token_ids,
                temperature=temperature,
                greedy=greedy,
            )
    finally:
        model.train(was_training)
    return sum(totals) / len(totals)


def score_batch(
    model: Any,
    tokenizer: Any,
    rows: list[dict],
    rewards: list,
    *,
    max_new_tokens: int,
    eos_token_ids: Any,
    temperature: float,
    greedy: bool = True,
) -> list[float]:
    """The weighted reward of one completion per row: greedy, or sampled at ``temperature`` (top_p 1, no top_k)."""
    tok = tokenizer
    prompts = [r["prompt"] for r in rows]
    chat = isinstance(prompts[0], list)
    texts = (
        [tok.apply_chat_template(p, add_generation_prompt=True, tokenize=False) for p in prompts] if chat else prompts
    )
    enc = tok(texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=not chat).to(
        model.device
    )
    sampling = {} if greedy else {"temperature": temperature, "top_p": 1.0, "top_k": 0}
    gen = GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=not greedy,
        eos_token_id=eos_token_ids,
        pad_token_id=tok.pad_token_id,
        **sampling,
    )
    out = model.generate(**enc, generation_config=gen)
    texts_out = tok.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    completions = [[{"role": "assistant", "content": t}] for t in texts_out] if chat else texts_out
    columns = {k: [r.get(k) for r in rows] for k in rows[0] if k != "prompt"}
    return weighted_rewards(rewards, prompts, completions, **columns)
