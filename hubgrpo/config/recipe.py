"""The recipe: the settings that decide how a fleet learns together (the merge, the round schedule, the optimizer
across rounds, the learning rate over the run). Their defaults are the recipe the benchmarks measured best
(``benchmarks/README.md``); ``hubgrpo config show`` says whether a config keeps it and, if not, where it differs.
"""

from __future__ import annotations

from typing import Any

from hubgrpo.config.sections import Config

RECIPE_KEYS = (
    "merge.method",
    "merge.rebase",
    "merge.quorum",
    "merge.outer_lr",
    "merge.fleet_outer_lr",
    "merge.fleet_outer_lr_decays",
    "merge.outer_momentum",
    "merge.max_staleness",
    "merge.staleness_per_worker",
    "rounds.steps",
    "rounds.reset_optimizer",
    "rounds.lr_schedule",
    "rounds.lr_warmup",
    "rounds.lr_decay",
    "worker.pipeline",
)


def _get(obj: Any, key: str) -> Any:
    for part in key.split("."):
        obj = getattr(obj, part)
    return obj


def default_recipe() -> dict[str, Any]:
    """key path → the default value, for every key of the recipe."""
    cfg = Config(base_model="builtin:tiny", project_name="recipe")
    return {key: _get(cfg, key) for key in RECIPE_KEYS}


def differences(cfg: Config) -> dict[str, tuple[Any, Any]]:
    """key path → (the config's value, the default) where ``cfg`` leaves the recipe."""
    defaults = default_recipe()
    return {key: (_get(cfg, key), defaults[key]) for key in RECIPE_KEYS if _get(cfg, key) != defaults[key]}


PIPELINING_NEEDS = (
    "this run allows it only with coordinator.leases_per_worker >= 2 and merge.max_staleness or "
    "merge.staleness_per_worker above 0 (or merge.rebase on)"
)


def allows_pipelining(cfg: Config) -> bool:
    """Whether the run lets a worker deliver a round while it trains the next: two live leases per worker, and a
    round one version older than its lease's admitted (a staleness limit above 0, or rebased rounds)."""
    m = cfg.merge
    return cfg.coordinator.leases_per_worker >= 2 and (m.max_staleness > 0 or m.staleness_per_worker > 0 or m.rebase)


def pipeline_flag(pipeline: bool | None) -> list[str]:
    """The ``hubgrpo worker`` argument that carries a choice over the config's ``worker.pipeline`` (None: none)."""
    return [] if pipeline is None else ["--pipeline" if pipeline else "--no-pipeline"]


def _schedule(cfg: Config) -> str:
    if not cfg.worker.pipeline:
        return "rounds in sequence"
    return (
        "rounds pipelined"
        if allows_pipelining(cfg)
        else "rounds in sequence (worker.pipeline, but the run allows one lease per worker or no stale round)"
    )


def describe(cfg: Config) -> str:
    """One line: the recipe ``cfg`` trains with (ffa + rebase, quorum 1, 1-step rounds, ...), and whether it is
    the default."""
    m, r = cfg.merge, cfg.rounds
    words = [
        f"{m.method}{' + rebase' if m.rebase else ''}",
        f"quorum {m.quorum}",
        f"{r.steps}-step rounds",
        f"staleness {m.max_staleness}"
        + (f" (or {m.staleness_per_worker:g} per live worker)" if m.staleness_per_worker else ""),
        "AdamW kept across rounds" if not r.reset_optimizer else "fresh AdamW each round",
        f"{r.lr_schedule} learning rate over the run",
        _schedule(cfg),
    ]
    if m.outer_lr != 1 or m.outer_momentum:
        words.append(f"outer lr {m.outer_lr:g}, momentum {m.outer_momentum:g}{' (Nesterov)' if m.nesterov else ''}")
    if m.fleet_outer_lr is not None:
        fades = ", fading with the learning rate" if m.fleet_outer_lr_decays else ""
        words.append(f"outer lr {m.fleet_outer_lr:g} while two or more workers are live{fades}")
    diff = differences(cfg)
    tail = (
        "the default, measured best"
        if not diff
        else "differs from the default in " + ", ".join(f"{k} ({v!r}; default {d!r})" for k, (v, d) in diff.items())
    )
    return f"recipe: {', '.join(words)} — {tail}"
