"""The simulated fleet: how fast each worker is, what a round costs in virtual seconds, who drops out when.

Nothing here measures this machine: a round's virtual duration comes from a deterministic cost model, so a
simulation gives the same answer on a busy laptop and on a quiet server.

- **Speeds** (``--speeds``): ``1`` (every worker at speed 1), ``spread:K`` (evenly spaced from slowest to fastest
  with fastest/slowest = K and mean 1, so the fleet's total compute equals N workers of speed 1), or a list
  ``1,0.5,2`` (cycled over the workers).
- **Cost** of one round at speed s: ``steps × step_s / s`` of training plus ``latency_s`` for each of the lease,
  the adapter download, the upload and the submit. ``step_s`` is seconds per GRPO step of one worker at speed 1
  (``STEP_S`` for the built-in models, measured on one core of a 2-core x86 VM; pass your own for other models or
  hardware).
- **Batch**: a lease for a smaller batch than the config's (``rounds.fleet_batch`` split) costs ``fixed_share +
  (1 − fixed_share) × batch ratio`` of a step (``FIXED_SHARE``: the part of a step a smaller batch does not
  shorten).
- **Generation** takes ``GENERATE_SHARE`` of each step (0.5 for other models): with
  ``merge.rebase_after_generation`` a round moves onto the versions published by then, before the step's backward.
- **Jitter** (``--jitter J``, default 0.1): each round's training time is multiplied by a factor uniform in
  [1 − J, 1 + J] (completion lengths and machine noise vary), so equal workers do not finish in lock-step.
- **Starts** (``--starts``): ``0`` (every machine asks for its first lease at virtual time 0), ``spread:S`` (each
  at a time uniform in [0, S], from its own stream), or a list ``0,1.5`` of seconds (cycled). Machines that start
  in the same instant deliver in phase; real ones never start together (process start, model load), and two
  workers that start a second apart cross each other's phase far less often (fewer fresh, τ = 0, rounds).
- **Dropouts** (``--dropout P``): each round is abandoned with probability P at a uniform point of its training
  (a crashed or pre-empted machine: its lease expires, its prompts go back to the pool); the worker rejoins
  ``rejoin_s`` later (default: one round at speed 1) as a new process, under a new name.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from hubgrpo.errors import ConfigError

# The cost model of the built-in models with their shipped configs, one core per worker, from this project's 2-core
# x86 VM (where each value comes from: benchmarks/LOG.md, "The simulator's cost constants"): seconds per GRPO step,
STEP_S = {"builtin:tiny": 0.45, "builtin:smollm2-135m-instruct": 3.78}
# the share of a step spent sampling (where merge.rebase_after_generation moves a round),
GENERATE_SHARE = {"builtin:tiny": 0.35, "builtin:smollm2-135m-instruct": 0.48}
# and the share of a step that a smaller batch does not shorten (rounds.fleet_batch: split).
FIXED_SHARE = {"builtin:tiny": 0.35, "builtin:smollm2-135m-instruct": 0.31}


def _per_worker(
    spec: str,
    n: int,
    spread: Callable[[float], list[float] | None],
    valid: Callable[[float], bool],
    error: Callable[[str], ConfigError],
) -> list[float]:
    """One value for each of ``n`` workers from ``spread:X`` (``spread(X)``, None when X is out of range) or a
    comma-separated list of ``valid`` numbers, cycled; anything else raises ``error(spec)``."""
    spec = str(spec).strip()
    try:
        if spec.startswith("spread:"):
            out = spread(float(spec.split(":", 1)[1]))
            if out is None:
                raise ValueError
            return out
        values = [float(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or not all(valid(v) for v in values):
        raise error(spec)
    return [values[i % len(values)] for i in range(n)]


def parse_speeds(spec: str, n: int) -> list[float]:
    """Speeds of ``n`` workers from ``1`` | ``spread:K`` | ``a,b,c`` (see the module docstring)."""

    def spread(ratio: float) -> list[float] | None:
        if not ratio >= 1:
            return None
        if n == 1:
            return [1.0]
        lo = 2.0 / (1.0 + ratio)  # mean of an even spread from lo to ratio·lo is 1
        return [lo + (ratio * lo - lo) * i / (n - 1) for i in range(n)]

    return _per_worker(
        spec,
        n,
        spread,
        lambda v: 0 < v < 1e6,
        lambda s: ConfigError(
            f"--speeds {s!r} is not a speed spec",
            hint="use 1, spread:2 (fastest = 2× slowest, mean 1) or a list such as 1,0.5,2",
        ),
    )


def parse_starts(spec: str, n: int, seed: int) -> list[float]:
    """Virtual times of ``n`` workers' first leases from ``0`` | ``spread:S`` | ``a,b,c`` (the module docstring)."""

    def spread(width: float) -> list[float] | None:
        if not 0 <= width < 1e7:
            return None
        return [width * random.Random(f"start-{seed}-{i}").random() for i in range(n)]

    return _per_worker(
        spec,
        n,
        spread,
        lambda v: 0 <= v < 1e7,
        lambda s: ConfigError(
            f"--starts {s!r} is not a start spec",
            hint="use 0, spread:10 (each machine starts at a random time in the first 10 s) or a list of seconds "
            "such as 0,1.5",
        ),
    )


@dataclass(frozen=True)
class CostModel:
    """Virtual seconds of one round (see the module docstring)."""

    step_s: float
    latency_s: float = 0.0
    fixed_share: float = 0.0  # of step_s, what a smaller batch (rounds.fleet_batch split) does not shorten

    def train_s(self, steps: int, speed: float, batch_ratio: float = 1.0) -> float:
        """``steps`` steps at ``speed``, each of ``batch_ratio`` × the config's completions."""
        per_step = self.step_s * (self.fixed_share + (1 - self.fixed_share) * batch_ratio)
        return steps * per_step / speed


@dataclass
class SimWorker:
    """One simulated machine: its name, speed, and its own random stream for dropouts."""

    name: str
    speed: float
    rng: random.Random
    rounds: int = 0
    dropped: int = 0

    @property
    def process_name(self) -> str:
        """The name it leases under: a machine that dropped out rejoins as a new process, with a new name (as
        ``hubgrpo worker`` names each process ``<host>-<random>``), so its old lease does not block it."""
        return self.name if self.dropped == 0 else f"{self.name}r{self.dropped}"

    def jitter(self, spread: float) -> float:
        """This round's duration factor, uniform in [1 − spread, 1 + spread] (rounds are never all alike:
        completion lengths, machine noise), from the worker's own stream."""
        return 1.0 + spread * (2.0 * self.rng.random() - 1.0) if spread > 0 else 1.0

    def drops_this_round(self, p: float) -> float | None:
        """The fraction of the round at which this round is abandoned, or None when it completes."""
        if p > 0 and self.rng.random() < p:
            return self.rng.random()
        return None


def make_fleet(n: int, speeds: str, seed: int) -> list[SimWorker]:
    if n < 1:
        raise ConfigError(f"--workers {n}: a simulation needs at least one worker")
    return [
        SimWorker(name=f"sim{i:02d}", speed=s, rng=random.Random(seed * 7919 + i))
        for i, s in enumerate(parse_speeds(speeds, n))
    ]


def default_step_s(base_model: str) -> float | None:
    return STEP_S.get(base_model)


def default_fixed_share(base_model: str) -> float:
    return FIXED_SHARE.get(base_model, 0.0)


def default_generate_share(base_model: str) -> float:
    return GENERATE_SHARE.get(base_model, 0.5)
