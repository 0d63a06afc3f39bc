"""What every worker would refuse about a config's task, found before a run starts (no torch, no user code run).

``hubgrpo config validate``, ``hubgrpo init``, ``run``, ``train`` and ``simulate`` call ``check_task`` after the
config loaded: a misspelt built-in reward or data task, a built-in task's unknown option, a reward spec that is
not ``module:function`` or ``file.py:function``, or a scheduler transformers does not have would otherwise be
published to the run repo and fail on every worker. User reward functions are not imported here (a worker
imports them, in its own environment); only their form is checked.
"""

from __future__ import annotations

import inspect

from hubgrpo.config import Config
from hubgrpo.errors import ConfigError, DataError
from hubgrpo.task.builtins import BUILTIN_REWARDS
from hubgrpo.task.procedural import BUILTIN_TASKS

# transformers.SchedulerType's values (tests/system/test_recipe.py keeps this list equal to the installed enum)
SCHEDULERS = (
    "linear",
    "cosine",
    "cosine_with_restarts",
    "polynomial",
    "constant",
    "constant_with_warmup",
    "inverse_sqrt",
    "reduce_lr_on_plateau",
    "cosine_with_min_lr",
    "cosine_warmup_with_min_lr",
    "warmup_stable_decay",
    "greedy",
)


def reward_problem(spec: str) -> str | None:
    """Why the reward spec ``spec`` cannot load anywhere, or None."""
    if spec.startswith("builtin:"):
        name = spec.removeprefix("builtin:")
        if name not in BUILTIN_REWARDS:
            return f"unknown built-in reward {spec!r}: use one of {', '.join('builtin:' + n for n in BUILTIN_REWARDS)}"
        return None
    target, _, fn_name = spec.rpartition(":")
    if not target or not fn_name.isidentifier():
        return (
            f"reward function {spec!r} is not of the form module:function or file.py:function "
            "(e.g. my_pkg.rewards:score or rewards/score.py:score)"
        )
    return None


def data_problem(path: str, options: dict) -> str | None:
    """Why the built-in task ``path`` with ``options`` cannot make rows, or None (other paths: None)."""
    if not path.startswith("builtin:"):
        return None
    task = path.removeprefix("builtin:")
    if task not in BUILTIN_TASKS:
        return f"unknown built-in task {path!r}: use one of {', '.join('builtin:' + t for t in BUILTIN_TASKS)}"
    make = BUILTIN_TASKS[task]
    counts = {k: v for k, v in options.items() if k in ("size", "seed", "eval_size")}
    bad = [k for k, v in counts.items() if isinstance(v, bool) or not isinstance(v, int) or v < 0]
    if bad:
        return f"{path}: data.options {', '.join(bad)} must be whole numbers >= 0 (got {counts})"
    opts = {k: v for k, v in options.items() if k not in counts}
    knobs = [p for p in inspect.signature(make).parameters if p not in ("size", "seed")]
    unknown = sorted(set(opts) - set(knobs))
    if unknown:
        return (
            f"{path} has no option {', '.join(map(repr, unknown))} in data.options: it accepts size, seed, "
            f"eval_size{', ' + ', '.join(knobs) if knobs else ''}"
        )
    try:
        make(2, 0, **opts)
    except (DataError, TypeError, ValueError) as e:
        return f"{path} with data.options {opts}: {getattr(e, 'message', e)}"
    return None


def problems(cfg: Config) -> list[str]:
    """Every task problem of ``cfg``, each naming its key."""
    out = [f"rewards[{i}].function: {p}" for i, rc in enumerate(cfg.rewards) if (p := reward_problem(rc.function))]
    if p := data_problem(cfg.data.path, cfg.data.options):
        out.append(f"data: {p}")
    params, rounds = cfg.params, cfg.rounds
    if params.lr_scheduler_type not in SCHEDULERS:
        out.append(
            f"params.lr_scheduler_type: {params.lr_scheduler_type!r} is not a transformers scheduler: "
            f"use one of {', '.join(SCHEDULERS)}"
        )
    elif params.warmup_steps >= rounds.steps and params.lr_scheduler_type != "constant":
        out.append(
            f"params.warmup_steps ({params.warmup_steps}) >= rounds.steps ({rounds.steps}): the "
            f"{params.lr_scheduler_type} schedule starts again every round, so its steps would all train at a "
            "warm-up rate; for a warm-up over the whole run use rounds.lr_schedule: wsd with "
            "rounds.lr_warmup, and warmup_steps: 0"
        )
    return out


def check_task(cfg: Config, source: str = "the config") -> None:
    """Raise ``ConfigError`` listing every problem ``problems`` finds in ``cfg``."""
    found = problems(cfg)
    if found:
        raise ConfigError(
            f"{source} would fail on every worker:\n  " + "\n  ".join(found),
            hint="fix these keys (`hubgrpo config fields` lists what each accepts)",
        )
