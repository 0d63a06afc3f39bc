"""worker.decode (hubgrpo.worker.decode): the compiled setting decodes over a static cache kept for the worker's
life and turns transformers' compiled decoding step on, and what it samples is what eager decoding samples (on a
CPU transformers compiles nothing unless told to, so the first test checks the static cache; the second forces the
compiler on the CPU; the GPU's CUDA graphs are measured by gpu_bench.py)."""

from __future__ import annotations

import pytest
import torch

from hubgrpo.worker.decode import static_caches
from tests.support.models_fixture import tiny_cache  # noqa: F401  (fixture)
from tests.support.proof_support import SHARP, record_round, sharp_engine, verifier, verify_batch

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("tiny_cache")]


def _pointers(keeper) -> list[int]:
    return [layer.keys.data_ptr() for cache in keeper.caches.values() for layer in cache.layers]


def test_compiled_decoding_samples_the_tokens_eager_decoding_samples():
    runs = {}
    for decode in ("eager", "compiled"):
        engine = sharp_engine([f"worker.decode={decode}", "worker.threads=1"])
        config = engine.trainer.generation_config
        assert config.cache_implementation is None  # compiled: the kept cache, not one built per call
        assert config.disable_compile is (decode == "eager")  # TRL's own setting stays for eager
        runs[decode] = (engine, *record_round(engine, engine.prompt_rows(range(8)), 2, 7))
    (_, eager_log, _), (compiled, log, states) = runs["eager"], runs["compiled"]
    assert static_caches(runs["eager"][0].trainer.model) is None
    assert [b.completion_ids for b in log] == [b.completion_ids for b in eager_log]
    assert sum(len(c) for b in log for c in b.completion_ids) > len(log[0].completion_ids)  # not all empty
    for step in range(2):
        verdict = verify_batch(verifier(compiled, states[step], scale=SHARP), compiled, log[step], 7)
        assert verdict.mismatches == 0 and verdict.checked > 0, verdict
    keeper = static_caches(compiled.trainer.model)
    assert keeper is not None and keeper.built == 1 and len(keeper.caches) == 1  # two generations, one cache
    before = _pointers(keeper)
    assert before and all(before)
    record_round(compiled, compiled.prompt_rows(range(8, 16)), 1, 8)  # another round, other prompts
    assert keeper.built == 1 and _pointers(keeper) == before  # the same tensors: a CUDA graph replays, not re-records


def test_a_prompt_longer_than_the_cache_gets_a_longer_cache_and_the_same_tokens():
    engine = sharp_engine(["worker.decode=compiled", "worker.threads=1"])
    keeper = static_caches(engine.trainer.model)
    assert keeper is not None
    short = keeper.cache(2, 10)
    first = keeper.lengths[2]
    assert first >= engine.cfg.params.max_completion_length  # sized for a whole completion at least
    longer = keeper.cache(2, first + 1)
    assert longer is not short and keeper.lengths[2] > first and keeper.built == 2
    assert keeper.cache(2, 10) is longer  # a shorter call reuses the longer cache


def test_only_the_most_recently_used_batch_sizes_keep_a_cache():
    engine = sharp_engine(["worker.decode=compiled", "worker.threads=1"])
    keeper = static_caches(engine.trainer.model)
    assert keeper is not None
    eight = keeper.cache(8, 10)
    sixteen = keeper.cache(16, 10)  # held-out scoring's full batches
    keeper.cache(3, 10)  # and its last one
    assert keeper.cache(8, 10) is eight and keeper.cache(16, 10) is sixteen  # used again: the most recent
    keeper.cache(5, 10)  # a fourth size: the least recently used (3) goes
    assert sorted(keeper.caches) == sorted(keeper.lengths) == [5, 8, 16]
    assert keeper.cache(8, 10) is eight and keeper.built == 4


def _widened(engine, rows, words: int) -> list[dict]:
    """The rows with ``words`` more words in their prompts (prompts of another length: another cache shape)."""
    out = engine.prompt_rows(rows)
    for row in out:
        row["prompt"][-1]["content"] += " Think." * words
    return out


@pytest.mark.slow
def test_forced_compilation_on_the_cpu_compiles_once_over_rounds():
    """transformers' compiled step, forced on the CPU (inductor; needs a C compiler): one graph over three rounds
    whose prompts grow (46, 70, 94 tokens), where a cache built per call recompiles at each, and the tokens eager
    decoding samples."""
    from transformers import CompileConfig

    torch._dynamo.reset()
    logs = {}
    for decode in ("eager", "compiled"):
        engine = sharp_engine([f"worker.decode={decode}", "worker.threads=1"])
        if decode == "compiled":
            config = CompileConfig(fullgraph=False, dynamic=False)
            config._compile_all_devices = True
            engine.trainer.generation_config.compile_config = config
        logs[decode] = [record_round(engine, _widened(engine, range(8), k), 1, 7)[0] for k in (0, 4, 8)]
    widths = [max(len(p) for p in log[0].prompt_ids) for log in logs["compiled"]]
    assert widths[0] < widths[1] < widths[2], widths
    compiled = [b.completion_ids for log in logs["compiled"] for b in log]
    assert compiled == [b.completion_ids for log in logs["eager"] for b in log]
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    assert graphs == 1, dict(torch._dynamo.utils.counters["stats"])


def test_a_model_that_names_its_own_cache_still_generates_the_same_tokens():
    """generate fills the unset fields of a call's config from the model's own generation config: a model that
    names a cache implementation must not get a second cache from the keeper (transformers refuses both)."""
    logs = {}
    for decode in ("eager", "compiled"):
        engine = sharp_engine([f"worker.decode={decode}", "worker.threads=1"])
        inner = engine.trainer.model.get_base_model()
        if decode == "compiled":
            assert inner.generation_config.cache_implementation is None  # cleared when the keeper was installed
        inner.generation_config.cache_implementation = "static"  # as a model's generation_config.json may say
        logs[decode] = record_round(engine, engine.prompt_rows(range(8)), 1, 7)[0]
        keeper = static_caches(engine.trainer.model)
        assert keeper is None or keeper.built == 0  # the call went to transformers' own cache
    assert [b.completion_ids for b in logs["compiled"]] == [b.completion_ids for b in logs["eager"]]
