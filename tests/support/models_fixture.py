"""Helpers for the model/engine tests: a tiny model built once per test module into a temporary hubgrpo cache,
a small config around it, and lease construction.

Import the fixture into a test module (``from tests.support.models_fixture import tiny_cache``) to use it there.
"""

from __future__ import annotations

import time

import pytest

from hubgrpo.config import Config, loads
from hubgrpo.layout import Lease

TINY_YAML = """
base_model: builtin:tiny
project_name: tiny-test
data: {path: "builtin:addition", options: {size: 300}}
rewards: [{function: "builtin:char_fraction", kwargs: {char: "a"}}]
params: {learning_rate: 2.0e-2, per_device_train_batch_size: 8, num_generations: 4, max_completion_length: 8,
         max_prompt_length: 64, seed: 0}
rounds: {steps: 8, reset_optimizer: true, lr_schedule: constant}
worker: {device: cpu, threads: 2}
lora: {r: 4, alpha: 8}
merge: {method: svd, quorum: 2, rebase: false, staleness_per_worker: 0}
"""


@pytest.fixture(scope="module")
def tiny_cache(tmp_path_factory):
    """A fresh HUBGRPO_CACHE holding ``builtin:tiny`` (built once per test module, < 1 s)."""
    cache = tmp_path_factory.mktemp("hubgrpo-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HUBGRPO_CACHE", str(cache))
        from hubgrpo.worker.models import tiny_dir

        tiny_dir()
        yield cache


def tiny_config(overrides: list[str] | None = None) -> Config:
    """The small tiny-model config used by the tests, with ``a.b=value`` overrides."""
    return loads(TINY_YAML, overrides=overrides)


def make_lease(steps: int = 2, *, lease_id: str = "l1", indices: list[int] | None = None, seed: int = 1,
               params: dict | None = None, worker: str = "w1") -> Lease:
    """A lease as the coordinator would issue it (unsigned)."""
    now = time.time()
    return Lease(lease_id=lease_id, run_id="run", round_id=1, worker=worker, base_version=0, base_sha="0" * 40,
                 prompt_indices=list(range(8)) if indices is None else indices, steps=steps, seed=seed,
                 params=params or {}, issued_at=now, deadline=now + 600)
