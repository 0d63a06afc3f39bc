"""A config fitted to the Hub's commit quota, before a run repo on the Hub is created (``hubgrpo init``).

The Hub lets a repo make about ``quota`` commits in a rolling hour (``HubStore.hourly_commit_quota``, 128) and
answers 429 past it; the coordinator keeps its own commits under ``coordinator.commit_budget_per_hour``.
``fit_hub_quota`` checks a config against both at init, so that nothing is left to ``budget`` refusals an hour
into the run:

- a budget above the quota is refused (its sole effect would be the Hub's 429s instead of the coordinator's
  own pacing);
- rounds go through the coordinator (``hub.submissions: coordinator``: no commit per round) unless the config
  says where they go; ``hub.submissions: null`` written explicitly keeps one commit per round in the run repo;
- the checkpoint interval is written out (``coordinator.checkpoint_every_s``, so the run repo's config says what
  is used) and raised where checkpoints alone would take more than ``CHECKPOINT_SHARE`` of the budget;
- with rounds in the run repo, the notes give the commits an hour and the fleet that fits in what is left.

Pure: no I/O; the caller decides whether the repo is on the Hub (a local folder or S3 has no such quota).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from hubgrpo.config.sections import Config
from hubgrpo.errors import ConfigError
from hubgrpo.store.inboxes import COORDINATOR as VIA_COORDINATOR  # rounds through its upload route, no commit each

CHECKPOINT_SHARE = 0.5  # checkpoints alone take at most this share of the commit budget
ROUND_SECONDS = (300, 900, 3600)  # round lengths the rounds-in-repo note turns into a fleet size


@dataclass
class QuotaFit:
    """``config`` as fitted (a copy), ``changes``: one line per changed key, saying what and why; ``notes``:
    what the config, as it stands, puts on the fleet."""

    config: Config
    changes: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def fit_hub_quota(cfg: Config, quota: int) -> QuotaFit:
    """``cfg`` for a run repo on the Hub (see the module docstring); ``ConfigError`` where it cannot fit: a budget
    above ``quota`` (commits an hour per repo), or rounds in the run repo with no commit left for them."""
    check_budget(cfg, quota)
    fit = QuotaFit(cfg.model_copy(deep=True))
    _route_rounds(fit, quota)
    _checkpoint_interval(fit, quota)
    if rounds_in_repo(fit.config):
        fit.notes.append(rounds_note(fit.config, quota))
    return fit


def check_budget(cfg: Config, quota: int) -> None:
    """Refuse a ``coordinator.commit_budget_per_hour`` above the Hub's ``quota``."""
    budget = cfg.coordinator.commit_budget_per_hour
    if budget > quota:
        raise ConfigError(
            f"coordinator.commit_budget_per_hour is {budget}, above the Hub's quota of about {quota} "
            f"commits an hour per repo: past {quota} the Hub answers 429 and commits wait for minutes",
            hint=f"leave it unset (60, the default) or --set coordinator.commit_budget_per_hour=N with N <= "
            f"{quota}; a local folder (--repo ./runs/NAME) has no quota",
        )


def rounds_in_repo(cfg: Config) -> bool:
    """Whether every round is a commit to the run repo (``hub.submissions`` unset)."""
    return cfg.hub.submissions is None


def checkpoint_floor_s(budget: int) -> float:
    """The shortest checkpoint interval that keeps checkpoints within ``CHECKPOINT_SHARE`` of ``budget``
    (whole seconds, rounded up: 120 for the default budget of 60)."""
    return float(math.ceil(3600 / (CHECKPOINT_SHARE * budget)))


def _route_rounds(fit: QuotaFit, quota: int) -> None:
    hub = fit.config.hub
    if hub.submissions is not None or "submissions" in hub.model_fields_set:
        return  # the config says where rounds go (null written out: the run repo)
    hub.submissions = VIA_COORDINATOR
    fit.changes.append(
        f"hub.submissions: unset -> {VIA_COORDINATOR}: rounds go through the coordinator, no commit per round "
        f"(one commit per round in the run repo would spend the Hub's ~{quota} commits an hour on "
        "rounds); to keep them in the run repo write hub.submissions: null (--set hub.submissions=null)"
    )


def _checkpoint_interval(fit: QuotaFit, quota: int) -> None:
    coord = fit.config.coordinator
    budget, floor = coord.commit_budget_per_hour, checkpoint_floor_s(coord.commit_budget_per_hour)
    share = f"{CHECKPOINT_SHARE:.0%} of coordinator.commit_budget_per_hour ({budget})"
    if coord.checkpoint_every_s is None:
        coord.checkpoint_every_s = floor
        fit.changes.append(
            f"coordinator.checkpoint_every_s: unset -> {floor:g}: a checkpoint commit at most every "
            f"{floor:g} s keeps checkpoints within {share}; written into the run repo's config"
        )
    elif coord.checkpoint_every_s < floor:
        was = coord.checkpoint_every_s
        often = "at every version" if was == 0 else f"every {was:g} s (up to {3600 / was:g} commits an hour)"
        coord.checkpoint_every_s = floor
        fit.changes.append(
            f"coordinator.checkpoint_every_s: {was:g} -> {floor:g}: checkpoints {often} would take more than "
            f"{share}; to checkpoint more often raise the budget (at most {quota})"
        )
    if coord.checkpoint_every_versions is not None:
        fit.notes.append(
            f"coordinator.checkpoint_every_versions: {coord.checkpoint_every_versions}: checkpoints every "
            f"{coord.checkpoint_every_versions} versions are held to the commit budget ({budget}/hour), not to "
            f"checkpoint_every_s: fast versions can spend all of it"
        )


def round_room(cfg: Config) -> int:
    """Commits an hour left for rounds once checkpoints (at most one per ``checkpoint_interval_s``) are paid."""
    coord = cfg.coordinator
    interval = coord.checkpoint_interval_s
    checkpoints = coord.commit_budget_per_hour if interval <= 0 else 3600 / interval
    return max(0, math.floor(coord.commit_budget_per_hour - checkpoints + 1e-9))


def rounds_note(cfg: Config, quota: int) -> str:
    """What one commit per round in the run repo allows: commits an hour = rounds an hour + checkpoints, and the
    fleet (workers × 3600 / round seconds) that fits in the budget; ``ConfigError`` when no round fits."""
    room, budget = round_room(cfg), cfg.coordinator.commit_budget_per_hour
    if room < 1:
        raise ConfigError(
            f"hub.submissions: null keeps one commit per round in the run repo, but "
            f"coordinator.commit_budget_per_hour ({budget}) leaves no commit an hour for rounds "
            f"once checkpoints are paid",
            hint=f"raise the budget (at most {quota}), or send rounds through the "
            f"coordinator: hub.submissions: {VIA_COORDINATOR}",
        )
    fleets = ", ".join(f"{room * s // 3600} workers with {s // 60}-min rounds" for s in ROUND_SECONDS)
    return (
        f"hub.submissions: null: one commit per round in the run repo. Commits an hour = workers x 3600 / "
        f"round seconds + checkpoints (<= {budget - room}); the budget ({budget}) leaves {room} rounds an "
        f"hour: one worker needs rounds of at least {math.ceil(3600 / room)} s; at most {fleets}; "
        f"beyond that leases wait (budget). Rounds through the coordinator (hub.submissions: "
        f"{VIA_COORDINATOR}) cost no commit"
    )
