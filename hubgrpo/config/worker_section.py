"""The ``worker`` section: settings of the machine a worker runs on, which a lease cannot change."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from hubgrpo.config.section_base import _Section


class WorkerSection(_Section):
    """The worker's own machine: device, precision, threads (a lease cannot change them)."""

    device: str = Field(
        "auto", description="auto (cuda if available), cpu, cuda, cuda:1, mps (`hubgrpo worker --device` overrides it)."
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto",
        description="auto: bf16 on CUDA, fp32 on CPU; fp32 everywhere in a run that verifies rollouts strictly "
        "(coordinator.verify on, verify_tolerance strict: the default).",
    )
    threads: int | None = Field(
        None, gt=0, description="torch threads per worker (`hubgrpo worker --threads`); None = cores // local workers."
    )
    share_prompts: bool = Field(
        True,
        description="Compute each prompt once for its num_generations completions, when generating and in the "
        "loss's forward and backward (the same numbers up to float rounding); false: TRL's own path, which repeats "
        "the prompt for every completion.",
    )
    decode: Literal["eager", "compiled"] = Field(
        "eager",
        description="How generation decodes (hubgrpo.worker.decode). eager: a growing cache, nothing compiled, prompts "
        "shared; compiled: a static key/value cache kept for the worker's life and the decoding step compiled by "
        "transformers' generate (torch.compile with CUDA graphs on a GPU; the first round pays the compilation; on "
        "a CPU only the static cache; prompts shared in the loss only). compiled is unmeasured on a GPU so far: "
        "benchmarks/gpu/gpu_bench.py measures both.",
    )
    keyed_sampling: bool = Field(
        True,
        description="Sample every token as the argmax of its warped scores plus Gumbel noise keyed by the lease's "
        "seed, the completion's index in the round and its position (hubgrpo.proof): the same distribution as "
        "sampling, and a verifier holding the model can replay each choice; false: TRL's own random sampling (a run "
        "with coordinator.verify on refuses it).",
    )
    pipeline: bool = Field(
        False,
        description="Deliver each round while the next one trains and ask the next lease ahead (`hubgrpo worker "
        "--pipeline`; the run must allow it: coordinator.leases_per_worker >= 2, and merge.max_staleness or "
        "merge.staleness_per_worker above 0 or merge.rebase on). Its rounds start from an older "
        "version: it won on configs/addition-mixed.yaml and lost on configs/demo.yaml (benchmarks/speedup/). "
        "`hubgrpo worker --pipeline/--no-pipeline` overrides it; `hubgrpo simulate` runs rounds in sequence.",
    )
