"""worker.decode (hubgrpo.worker.decode): the compiled setting asks transformers for a static cache and its
compiled decoding step, and what it samples is what eager decoding samples (on a CPU transformers compiles
nothing, so this checks the static cache; the compiled step itself is measured on a GPU by gpu_bench.py)."""

from __future__ import annotations

import pytest

from tests.support.models_fixture import tiny_cache  # noqa: F401  (fixture)
from tests.support.proof_support import SHARP, record_round, sharp_engine, verifier, verify_batch

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("tiny_cache")]


def test_compiled_decoding_samples_the_tokens_eager_decoding_samples():
    runs = {}
    for decode in ("eager", "compiled"):
        engine = sharp_engine([f"worker.decode={decode}", "worker.threads=1"])
        config = engine.trainer.generation_config
        assert (config.cache_implementation == "static") is (decode == "compiled")
        assert config.disable_compile is (decode == "eager")  # TRL's own setting stays for eager
        runs[decode] = (engine, *record_round(engine, engine.prompt_rows(range(8)), 1, 7))
        static = getattr(engine.trainer.model.get_base_model(), "_previous_max_cache_length", None)
        assert (static is not None) is (decode == "compiled")  # generate built a static cache: the path ran
    (_, eager_log, _), (compiled, log, states) = runs["eager"], runs["compiled"]
    assert [b.completion_ids for b in log] == [b.completion_ids for b in eager_log]
    assert sum(len(c) for b in log for c in b.completion_ids) > len(log[0].completion_ids)  # not all empty
    verdict = verify_batch(verifier(compiled, states[0], scale=SHARP), compiled, log[0], 7)
    assert verdict.mismatches == 0 and verdict.checked > 0, verdict
