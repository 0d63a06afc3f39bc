"""Prompt sharing (hubgrpo.worker.sharing) gives TRL's own numbers: log-probabilities, entropies, gradients and
generated tokens, on the tiny model with a non-zero adapter, prompts of different lengths and groups of 4."""

from __future__ import annotations

import torch

from hubgrpo.worker.engine import RoundEngine
from hubgrpo.worker.keyed import KeyedGRPOTrainer
from hubgrpo.worker.sharing import SharingGRPOTrainer, distinct_rows
from tests.support.models_fixture import make_lease, tiny_cache, tiny_config  # noqa: F401  (fixture)

GROUP = 4


def _engine(share: bool = True) -> RoundEngine:
    engine = RoundEngine(tiny_config([f"worker.share_prompts={str(share).lower()}", "worker.threads=1"]))
    torch.manual_seed(1)
    for name, p in engine.trainer.model.named_parameters():
        if "lora_B" in name:  # B = 0 at version 0: make the adapter matter
            p.data.normal_(0, 0.5)
    return engine


def _batch(engine: RoundEngine, completion: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    """Two prompts of different lengths, each repeated for a group, left-padded; completions right-padded."""
    tok = engine.tokenizer
    prompts = [tok("what is 2 + 3 ?")["input_ids"], tok("1 + 1 =")["input_ids"]]
    width = max(map(len, prompts))
    gen = torch.Generator().manual_seed(0)
    ids, mask = [], []
    for p in prompts:
        for g in range(GROUP):
            done = completion - g  # completions of different lengths
            c = torch.randint(5, tok.vocab_size, (completion,), generator=gen).tolist()
            ids.append([tok.pad_token_id] * (width - len(p)) + p + c)
            mask.append([0] * (width - len(p)) + [1] * len(p) + [1] * done + [0] * (completion - done))
    return torch.tensor(ids), torch.tensor(mask)


def test_distinct_rows_finds_the_groups():
    ids = torch.tensor([[0, 5, 6], [0, 5, 6], [7, 8, 9], [0, 5, 6]])
    mask = torch.tensor([[0, 1, 1], [0, 1, 1], [1, 1, 1], [0, 1, 1]])
    unique_ids, _, inverse = distinct_rows(ids, mask)
    assert unique_ids.size(0) == 2
    assert torch.equal(unique_ids[inverse], ids)
    assert distinct_rows(ids[1:3], mask[1:3]) is None


def test_shared_forward_gives_trls_logps_entropies_and_gradients(tiny_cache):
    engine = _engine()
    trainer, model = engine.trainer, engine.trainer.model
    assert isinstance(trainer, SharingGRPOTrainer)
    ids, mask = _batch(engine)
    keep = 6
    results = []
    for compute in (trainer._get_per_token_logps_and_entropies, super(SharingGRPOTrainer, trainer)._get_per_token_logps_and_entropies):
        model.zero_grad()
        logps, entropies, _ = compute(model, ids, mask, keep, compute_entropy=True)
        (logps * mask[:, -keep:]).sum().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results.append((logps.detach(), entropies.detach(), grads))
    (shared, shared_h, shared_g), (plain, plain_h, plain_g) = results
    assert shared.shape == plain.shape == (ids.size(0), keep)
    assert torch.allclose(shared, plain, atol=1e-5), (shared - plain).abs().max()
    assert torch.allclose(shared_h, plain_h, atol=1e-5)
    assert shared_g.keys() == plain_g.keys() and plain_g
    for name, g in plain_g.items():
        assert torch.allclose(shared_g[name], g, atol=1e-5, rtol=1e-4), (name, (shared_g[name] - g).abs().max())


def test_shared_generation_gives_the_same_tokens(tiny_cache):
    engine = _engine()
    model = engine.trainer.model
    from hubgrpo.worker.sharing import shared_generate
    from transformers import GenerationConfig

    ids, mask = _batch(engine)
    prompt_ids, prompt_mask = ids[:, :-6], mask[:, :-6]
    tok = engine.tokenizer
    for sample in (False, True):
        config = GenerationConfig(max_new_tokens=8, do_sample=sample, temperature=1.0, top_k=0, top_p=1.0,
                                  pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
        outputs = []
        for generate in (functools_partial(shared_generate, model.generate, model), model.generate):
            torch.manual_seed(3)
            with torch.no_grad():
                outputs.append(generate(input_ids=prompt_ids, attention_mask=prompt_mask, generation_config=config))
        assert torch.equal(outputs[0], outputs[1]), sample


def functools_partial(f, *args):
    import functools

    return functools.partial(f, *args)


def test_rounds_with_and_without_sharing_agree(tiny_cache):
    """Two steps from the same adapter and seed: the same rewards, adapters equal up to float rounding."""
    states, rewards = [], []
    for share in (True, False):
        engine = _engine(share)
        assert type(engine.trainer) is (SharingGRPOTrainer if share else KeyedGRPOTrainer)
        result = engine.train_steps(engine.prompt_rows(range(8)), 2, seed=5)
        rewards.append([m.reward for m in result.step_metrics])
        states.append({k: v.clone() for k, v in engine._adapter_state().items()})
    assert rewards[0] == rewards[1]
    for key, value in states[1].items():  # 2 AdamW steps at lr 2e-2: an entry moves up to 4e-2, a wrong one by that
        # much; a near-zero gradient that differs by rounding alone can move its entry ~1e-4 (Adam divides by √v)
        assert torch.allclose(states[0][key], value, atol=5e-4), key
