"""What to simulate (``SimOptions``, the options of ``hubgrpo simulate``) and the run config as the simulation
uses it (``sim_config``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hubgrpo.config import Config


@dataclass
class SimOptions:
    """How to simulate (see ``hubgrpo simulate --help``)."""

    workers: int
    speeds: str = "1"
    starts: str = "0"  # when each machine asks for its first lease (fleet.parse_starts)
    dropout: float = 0.0
    latency_s: float = 0.0
    seed: int = 0
    step_s: float | None = None
    rejoin_s: float | None = None
    until_version: int | None = None
    until_reward: float | None = None
    min_virtual_s: float = 0.0  # until_reward stops the run only from this virtual time on
    max_virtual_s: float | None = None
    max_rounds: int | None = None
    eval_samples: int = 32
    eval_every: int = 1
    eval_sampled: int = 0  # 0: greedy; k: mean of k sampled passes at the training temperature (fixed seeds)
    jitter: float = 0.1
    keep_budget: bool = False
    commit_quota: int | None = None  # the Hub's commits per rolling hour on the run repo (None: commits are free)
    generate_share: float | None = None  # of a step's time, sampling (default: fleet.GENERATE_SHARE for the model)


def sim_config(cfg: Config, opts: SimOptions, output: Path | None = None) -> Config:
    """The run config as the simulation uses it (see ``hubgrpo.sim.loop``). The commit budget: the config's
    with ``keep_budget``; else, under a quota, the quota's figure unless the config sets one; without a quota,
    lifted. Rounds go to an inbox (``hub.submissions`` set, whatever it names) in ``output``/inbox."""
    cfg = cfg.model_copy(deep=True)
    cfg.rounds.schedule_versions = cfg.rounds.schedule_span()  # the run's learning-rate schedule, kept
    cfg.rounds.versions = opts.until_version or 10**6  # the simulation's own stop conditions end it
    cfg.log = "none"
    co = cfg.coordinator
    if opts.commit_quota is None and not opts.keep_budget:
        co.commit_budget_per_hour = 10**9
    elif opts.commit_quota is not None and not opts.keep_budget and "commit_budget_per_hour" not in co.model_fields_set:
        co.commit_budget_per_hour = opts.commit_quota
    if cfg.hub.submissions and output is not None:
        cfg.hub.submissions = str(Path(output).absolute() / "inbox")
    return cfg
