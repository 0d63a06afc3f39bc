"""Reward functions with TRL's signature: ``f(prompts, completions, **kwargs) -> list[float | None]``.

Dataset columns other than the prompt (``answer``, ``numbers``…) arrive as keyword arguments, one value per
completion; ``RewardConfig.kwargs`` (e.g. ``{char: "a"}``) are added on top. Completions are strings, or lists of
message dicts for chat prompts (``completion_text`` handles both).

Built-ins (``builtin:<name>``) and the parsing of answers live in ``hubgrpo.task.builtins``.

A kwarg may hold a ``${NAME}`` placeholder (a run repo stores placeholders, never values from the environment of
whoever created it): ``fill_kwargs`` fills it from the environment of the process that runs the reward, and only
for the names that process's owner lists in ``HUBGRPO_REWARD_ENV`` (comma-separated), never HF_TOKEN or
HUBGRPO_SECRET; any other placeholder is refused (``ConfigError``). A run repo's text alone never reads anyone's
environment.

User functions: ``package.module:function`` or ``path/to/file.py:function``. A function without ``**kwargs``
gets only the keyword arguments it names. ``None`` (or NaN) means "no opinion": as in TRL, it becomes NaN and
is left out of the weighted sum (a completion every function skips gets no advantage). A function that raises,
returns the wrong number of values, a non-number or an infinity fails with ``RewardError`` naming the function
and the prompt index within the batch.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import math
import numbers
import os
import re
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from hubgrpo.config import RewardConfig
from hubgrpo.errors import ConfigError, HubGrpoError, RewardError
from hubgrpo.task.builtins import (  # noqa: F401  (re-exported: the reward API's one module)
    BUILTIN_REWARDS,
    answer_format,
    char_fraction,
    close_answer,
    completion_text,
    countdown,
    exact_answer,
    extract_answer,
    length_penalty,
    parse_number,
    reference_number,
)

# ------------------------------------------------------------------------------------------ loading


def load_function(spec: str) -> Callable:
    """``builtin:<name>``, ``package.module:function`` or ``path/to/file.py:function`` → the function."""
    if spec.startswith("builtin:"):
        name = spec.removeprefix("builtin:")
        if name not in BUILTIN_REWARDS:
            raise RewardError(
                f"unknown built-in reward {spec!r}",
                hint=f"use one of {', '.join('builtin:' + n for n in BUILTIN_REWARDS)}",
            )
        return BUILTIN_REWARDS[name]
    target, _, fn_name = spec.rpartition(":")
    if not target or not fn_name.isidentifier():
        raise RewardError(
            f"reward function {spec!r} is not of the form module:function or file.py:function",
            hint="e.g. my_pkg.rewards:score or rewards/score.py:score",
        )
    if target.endswith(".py") or "/" in target or "\\" in target:
        module = _import_file(Path(target).expanduser(), spec)
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as e:
            hint = "install the package or put it on PYTHONPATH; or use path/to/file.py:function"
            raise RewardError(f"cannot import module {target!r} for reward {spec!r}: {e}", hint=hint) from None
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise RewardError(
            f"{target} has no function {fn_name!r} (reward {spec!r})",
            hint=f"define def {fn_name}(prompts, completions, **kwargs) -> list[float]",
        )
    return fn


def _import_file(path: Path, spec: str):
    if not path.is_file():
        raise RewardError(
            f"reward file {path} does not exist (reward {spec!r})", hint="paths are relative to the current directory"
        )
    name = f"hubgrpo_user_reward_{abs(hash(str(path.resolve())))}"
    module_spec = importlib.util.spec_from_file_location(name, path)
    assert module_spec is not None and module_spec.loader is not None, f"{path} is a file: it has a loader"
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except Exception as e:  # the user's file: any error at import is reported as a RewardError
        raise RewardError(f"importing reward file {path} failed: {type(e).__name__}: {e}") from e
    sys.modules[name] = module
    return module


class Reward:
    """A reward function bound to its config kwargs, checked on every call; TRL sees it by ``__name__``."""

    def __init__(self, fn: Callable, *, name: str, weight: float = 1.0, kwargs: dict | None = None):
        self.fn, self.__name__, self.weight, self.kwargs = fn, name, weight, dict(kwargs or {})
        params = inspect.signature(fn).parameters.values()
        self._accepts_all = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
        self._names = {p.name for p in params}
        self.seconds = 0.0  # total time spent in this function

    def _call(self, prompts, completions, kwargs: dict):
        kwargs = {"prompts": prompts, "completions": completions, **kwargs}
        if not self._accepts_all:
            kwargs = {k: v for k, v in kwargs.items() if k in self._names}
        return self.fn(**kwargs)

    def __call__(self, prompts, completions, **kwargs) -> list[float | None]:
        kwargs = {**kwargs, **self.kwargs}
        start = time.perf_counter()
        try:
            out = self._call(prompts, completions, kwargs)
        except HubGrpoError:
            raise
        except Exception as e:  # a user function: report which one, and on which prompt
            idx = self._failing_index(prompts, completions, kwargs)
            where = f" on prompt index {idx} ({_short(prompts[idx])})" if idx is not None else ""
            raise RewardError(
                f"reward function {self.__name__} raised {type(e).__name__}: {e}{where}",
                hint="fix the function; return None for completions it cannot score",
            ) from e
        finally:
            self.seconds += time.perf_counter() - start
        return self._check(out, len(completions))

    def _failing_index(self, prompts, completions, kwargs: dict) -> int | None:
        """Re-run the function one completion at a time to find the first that raises."""
        n = len(completions)
        for i in range(n):
            one = {k: ([v[i]] if isinstance(v, (list, tuple)) and len(v) == n else v) for k, v in kwargs.items()}
            try:
                self._call([prompts[i]], [completions[i]], one)
            except Exception:  # the failure we are looking for
                return i
        return None

    def _check(self, out: Any, n: int) -> list[float | None]:
        if hasattr(out, "tolist"):  # numpy arrays, torch tensors
            out = out.tolist()
        if not isinstance(out, (list, tuple)):
            raise RewardError(
                f"reward function {self.__name__} returned {type(out).__name__}, not a list",
                hint="return one float (or None) per completion",
            )
        if len(out) != n:
            raise RewardError(
                f"reward function {self.__name__} returned {len(out)} values for {n} completions",
                hint="return exactly one float (or None) per completion, in order",
            )
        clean: list[float | None] = []
        for i, x in enumerate(out):
            if x is None or (isinstance(x, numbers.Real) and math.isnan(x)):
                clean.append(None)
            elif isinstance(x, numbers.Real) and math.isfinite(x):
                clean.append(float(x))
            else:
                raise RewardError(
                    f"reward function {self.__name__} returned {x!r} for prompt index {i}",
                    hint="rewards must be finite numbers, or None to skip a completion",
                )
        return clean


def _short(x: Any, n: int = 80) -> str:
    s = repr(x)
    return s if len(s) <= n else s[: n - 1] + "…"


REWARD_ENV = "HUBGRPO_REWARD_ENV"
NEVER_FILLED = ("HF_TOKEN", "HUBGRPO_SECRET")  # hubgrpo's own secrets: no reward gets them, whatever is listed


def fill_kwargs(rc: RewardConfig, env: Mapping[str, str] | None = None) -> dict:
    """``rc.kwargs`` with each ``${NAME}`` filled from ``env`` (this process's environment) for the names listed in
    its ``HUBGRPO_REWARD_ENV``; ``ConfigError`` for a placeholder naming anything else (values are never quoted)."""
    from hubgrpo.config import expand_env, placeholders

    names = placeholders(rc.kwargs)
    if not names:
        return dict(rc.kwargs)
    env = os.environ if env is None else env
    allowed = {n for n in re.split(r"[,\s]+", env.get(REWARD_ENV, "")) if n and n not in NEVER_FILLED}
    refused = sorted(set(names) - allowed)
    if refused:
        listed = ", ".join(f"${{{n}}}" for n in refused)
        names_hint = ",".join(sorted((allowed | set(refused)) - set(NEVER_FILLED)))
        raise ConfigError(
            f"reward {rc.function}: its kwargs hold {listed}, and a placeholder is filled only from a "
            f"name this machine's owner lists in {REWARD_ENV}",
            hint=f"read the run's config (whoever can write the run repo wrote it); only if this reward "
            f"should get that value from this machine: export {REWARD_ENV}={names_hint} and the "
            f"variable itself ({', '.join(NEVER_FILLED)} are never given to a reward)",
        )
    return expand_env(dict(rc.kwargs), f"reward {rc.function} kwargs", {n: env[n] for n in allowed if n in env})


def load_rewards(configs: Sequence[RewardConfig], *, isolate: Callable | None = None) -> list:
    """The checked, named reward functions of a config (names made unique for TRL's per-reward metrics), their
    kwargs' placeholders filled (``fill_kwargs``). With ``isolate``, a non-built-in function is not imported here:
    ``isolate(spec, name=, weight=, kwargs=)`` stands for it (``reward_process.IsolatedReward``)."""
    out, seen = [], Counter[str]()
    for rc in configs:
        kwargs = fill_kwargs(rc)
        base = rc.function.removeprefix("builtin:").rpartition(":")[2]
        seen[base] += 1
        name = base if seen[base] == 1 else f"{base}_{seen[base]}"
        if isolate is not None and not rc.function.startswith("builtin:"):
            out.append(isolate(rc.function, name=name, weight=rc.weight, kwargs=kwargs))
            continue
        out.append(Reward(load_function(rc.function), name=name, weight=rc.weight, kwargs=kwargs))
    return out


def foreign_code(configs: Sequence[RewardConfig]) -> list[str]:
    """The reward functions that are not built in (``module:function``, ``file.py:function``): code that runs
    in the worker's process."""
    return [rc.function for rc in configs if not rc.function.startswith("builtin:")]


def check_allowed(configs: Sequence[RewardConfig], allowed: Sequence[str]) -> None:
    """Refuse (``ConfigError``) to run reward code the worker's owner did not allow: a run repo's config is
    written by somebody else, and ``os:system`` is a ``module:function`` too."""
    from hubgrpo.errors import ConfigError

    missing = [f for f in foreign_code(configs) if f not in set(allowed)]
    if missing:
        flags = " ".join(f"--allow-reward {f!r}" for f in missing)
        raise ConfigError(
            f"the run's config names reward code that is not built in: {', '.join(missing)}; a "
            "worker runs only built-in rewards and the code its owner allows",
            hint=f"read that code, then start the worker with {flags}",
        )


def weighted_rewards(rewards: Sequence[Reward], prompts, completions, **kwargs) -> list[float]:
    """Σ weight·reward per completion, skipping None like TRL's nansum (0.0 when every function skips)."""
    totals = [0.0] * len(completions)
    for r in rewards:
        for i, v in enumerate(r(prompts, completions, **kwargs)):
            if v is not None:
                totals[i] += r.weight * v
    return totals
