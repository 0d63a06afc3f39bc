"""Proof of rollouts through the worker's own trainer (hubgrpo.worker.keyed): honest rounds replay exactly, on
TRL's generation path and on prompt sharing's, in float32 and through a bfloat16 verifier; every forgery fails."""

from __future__ import annotations

import pytest
import torch

from hubgrpo.proof.verify import RoundRule
from hubgrpo.worker.engine import RoundEngine
from hubgrpo.worker.keyed import KeyedBatch
from tests.support.models_fixture import tiny_cache, tiny_config  # noqa: F401  (fixture)
from tests.support.proof_support import (
    ATTACKS,
    SHARP,
    Forgery,
    adapter_state,
    forge,
    record_round,
    sharp_engine,
    truncated,
    verifier,
    verify_batch,
)

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("tiny_cache")]
SEED = 7


def _engine(share: bool) -> RoundEngine:
    """The tiny model sharpened (``proof_support.sharpen``) with a non-zero adapter."""
    return sharp_engine([f"worker.share_prompts={str(share).lower()}", "worker.threads=1"])


@pytest.mark.parametrize("share", [True, False], ids=["sharing", "trl"])
def test_honest_rounds_replay_exactly_in_float32_and_pass_in_bfloat16(share):
    engine = _engine(share)
    log, states = record_round(engine, engine.prompt_rows(range(8)), 2, SEED)
    assert [b.first for b in log] == [0, 8]  # the round's numbering runs across its generation batches
    for batch, state in zip(log, states):
        exact = verify_batch(verifier(engine, state, scale=SHARP), engine, batch, SEED)
        assert exact.mismatches == 0 and exact.checked > 0.9 * exact.tokens, exact
        half = verify_batch(verifier(engine, state, torch.bfloat16, SHARP), engine, batch, SEED)
        assert half.passes() and half.checked > 0.2 * half.tokens, half


def test_every_forgery_fails_the_round():
    engine = _engine(True)
    older = adapter_state(engine.trainer.model)
    older = {k: torch.zeros_like(v) if "lora_B" in k else v for k, v in older.items()}  # version 0
    rows = engine.prompt_rows(range(8))
    log, states = record_round(engine, rows, 1, SEED)
    f = Forgery(engine, log[0], SEED, states[0], older, rows, SHARP)
    exact, half = verifier(engine, states[0], scale=SHARP), verifier(engine, states[0], torch.bfloat16, SHARP)
    for kind in ATTACKS:
        forged = type(f.batch)(f.batch.first, f.batch.prompt_ids, forge(kind, f))
        assert forged.completion_ids != f.batch.completion_ids, kind
        for model in (exact, half):
            verdict = verify_batch(model, engine, forged, SEED)
            assert not verdict.passes(), (kind, verdict)
            assert not verdict.passes(RoundRule(0)), (kind, verdict)


def test_a_completion_must_end_where_generation_ends_it():
    engine = _engine(True)
    log, states = record_round(engine, engine.prompt_rows(range(8)), 1, SEED)
    batch, model = log[0], verifier(engine, states[0], scale=SHARP)
    most, stop = engine.params["max_completion_length"], engine.trainer.eos_token_ids
    for c in batch.completion_ids:  # what TRL records: up to and including the first stop token, no padding
        assert 0 < len(c) <= most and not set(c[:-1]) & set(stop) and (c[-1] in stop or len(c) == most), c
    assert verify_batch(model, engine, batch, SEED).passes()

    def replayed(completions):
        return verify_batch(model, engine, KeyedBatch(batch.first, batch.prompt_ids, completions), SEED)

    shorter = [c[:-1] for c in batch.completion_ids]  # cut short, no stop token at the end
    verdict = replayed(shorter)
    assert verdict.unended == len(shorter) and not verdict.passes() and verdict.mismatches == 0, verdict
    longer = [c + [c[0]] for c in batch.completion_ids]  # a token past the stop token, or past the length limit
    assert replayed(longer).unended == len(longer)
    ended = replayed(truncated(batch.completion_ids, stop))  # cut short and ended with a stop token: replayed
    assert ended.unended == 0 and ended.mismatches > 0 and not ended.passes(), ended
    assert sum(m > 0 for m in ended.per_completion) > len(batch.completion_ids) // 2, ended


def test_keyed_sampling_off_leaves_trls_sampling():
    engine = RoundEngine(tiny_config(["worker.keyed_sampling=false", "worker.threads=1"]))
    rows = engine.prompt_rows(range(8))
    engine.trainer.keyed_log = []
    engine.train_steps(rows, 1, seed=SEED)
    assert engine.trainer.keyed is None and engine.trainer.keyed_log == []


def test_a_keyed_round_refuses_what_the_verifier_would_not_replay():
    """A model whose own generation config adds a processor (no repeated n-grams) or whose attention drops in
    training mode would sample from scores the verifier does not compute: the round stops with a ConfigError
    naming the option instead of producing honest rounds that fail as forged; the same for a generate call the
    keyed wrapper cannot key."""
    from transformers import GenerationConfig, LogitsProcessorList

    from hubgrpo.errors import ConfigError
    from hubgrpo.proof.sampling import KeyedSampling, keyed_generate

    engine = RoundEngine(tiny_config(["worker.threads=1"]))
    rows = engine.prompt_rows(range(8))
    base = engine.trainer.model.get_base_model()
    base.generation_config.no_repeat_ngram_size = 2  # TRL's own config leaves it unset: generate takes the model's
    with pytest.raises(ConfigError, match="no_repeat_ngram_size"):
        engine.train_steps(rows, 1, seed=SEED)
    base.generation_config.no_repeat_ngram_size = None
    attention = next(m for m in base.modules() if isinstance(getattr(m, "attention_dropout", None), float))
    attention.attention_dropout = 0.1
    with pytest.raises(ConfigError, match="attention_dropout"):
        engine.train_steps(rows, 1, seed=SEED)
    attention.attention_dropout = 0.0
    engine.train_steps(rows, 1, seed=SEED)  # both back to neutral: the round runs keyed
    ids = torch.ones(1, 3, dtype=torch.long)
    with pytest.raises(ConfigError, match="cannot key: no generation_config"):
        keyed_generate(base.generate, KeyedSampling(SEED), None, input_ids=ids)
    greedy = GenerationConfig(do_sample=False, max_new_tokens=2)
    with pytest.raises(ConfigError, match="cannot key: do_sample is false"):
        keyed_generate(base.generate, KeyedSampling(SEED), None, input_ids=ids, generation_config=greedy)
    sampling = GenerationConfig(do_sample=True, max_new_tokens=2)
    with pytest.raises(ConfigError, match="cannot key: logits processors of the caller's own"):
        keyed_generate(base.generate, KeyedSampling(SEED), None, input_ids=ids, generation_config=sampling,
                       logits_processor=LogitsProcessorList([]) + [lambda i, s: s])
    with pytest.raises(ConfigError, match="stop_strings"):  # where a completion ends is replayed too
        keyed_generate(base.generate, KeyedSampling(SEED), GenerationConfig(stop_strings=["\n"]), input_ids=ids,
                       generation_config=sampling)


@pytest.mark.timeout(120)
def test_a_bfloat16_worker_stops_before_a_strictly_verified_run_leases_to_it():
    from hubgrpo.errors import ConfigError
    from hubgrpo.worker.engine import RoundEngine
    from hubgrpo.worker.loop import check_precision
    from tests.support.coord_helpers import make_config

    engine = RoundEngine(make_config(**{"worker.dtype": "bfloat16"}), worker="w")
    strict = make_config(**{"coordinator.verify": "sample", "coordinator.verify_tolerance": "strict"})
    with pytest.raises(ConfigError) as ei:
        check_precision(strict, engine)
    assert "bfloat16" in str(ei.value) and "verify_tolerance" in (ei.value.hint or "")
    default = make_config(**{"coordinator.verify": "sample"})
    with pytest.raises(ConfigError):
        check_precision(default, engine)  # strict is the default
    wide = make_config(**{"coordinator.verify": "sample", "coordinator.verify_tolerance": "wide"})
    check_precision(wide, engine)  # wide: bfloat16 is covered


@pytest.mark.timeout(120)
def test_a_strictly_verified_run_resolves_auto_to_float32_in_its_workers():
    from hubgrpo.worker.loop import make_engine
    from tests.support.coord_helpers import make_config

    cfg = make_config(**{"coordinator.verify": "sample"})  # strict: the default
    engine = make_engine(cfg, "w")
    assert cfg.worker.dtype == "float32" and next(engine.model.parameters()).dtype.is_floating_point
    assert str(next(engine.model.parameters()).dtype) == "torch.float32"
    wide = make_config(**{"coordinator.verify": "sample", "coordinator.verify_tolerance": "wide"})
    make_engine(wide, "w")
    assert wide.worker.dtype == "auto", "a wide run leaves the worker's precision to its machine"
