"""Config keys that moved, still accepted: ``params`` once held the round schedule and the worker's machine
besides GRPO's hyper-parameters. A key found at its old place is moved to its new one with a deprecation note
(``migrate``; ``new_key`` for ``--set`` overrides); the loader logs each note once and ``hubgrpo config validate``
prints them. The old key and the new one both set to different values is an error naming both."""

from __future__ import annotations

from typing import Any

import yaml

# old dotted key → new dotted key
MOVED: dict[str, str] = {
    "params.steps_per_round": "rounds.steps",
    "params.fleet_batch": "rounds.fleet_batch",
    "params.balance_rounds": "rounds.balance",
    "params.stagger_rounds": "rounds.stagger",
    "params.versions": "rounds.versions",
    "params.run_lr_schedule": "rounds.lr_schedule",
    "params.run_lr_final": "rounds.lr_final",
    "params.run_lr_warmup": "rounds.lr_warmup",
    "params.run_lr_decay": "rounds.lr_decay",
    "params.reset_optimizer": "rounds.reset_optimizer",
    "params.device": "worker.device",
    "params.dtype": "worker.dtype",
    "params.num_threads": "worker.threads",
    "params.share_prompts": "worker.share_prompts",
}


class MovedKeyConflict(ValueError):
    """An old key and its new one both set, to different values."""

    def __init__(self, old: str, new: str, old_value: Any, new_value: Any):
        self.old, self.new = old, new
        super().__init__(
            f"{old} ({old_value!r}) and {new} ({new_value!r}) are both set: {old} is now {new}; keep only {new}"
        )


def note(old: str) -> str:
    """The deprecation message for the old key ``old``."""
    return f"{old} is now {MOVED[old]}; write it there"


def new_key(key: str) -> tuple[str, str | None]:
    """``key`` (dotted, as ``--set`` names it) at its current place, and the deprecation note if it moved."""
    if key in MOVED:
        return MOVED[key], note(key)
    return key, None


def migrate(raw: Any) -> tuple[Any, list[str]]:
    """``raw`` (a parsed config) with every moved key at its new place, and a note per key moved. The input is
    not changed; values move as they are (no ``${...}`` is expanded here). Raises ``MovedKeyConflict``."""
    if not isinstance(raw, dict):
        return raw, []
    found = [old for old in MOVED if _has(raw, old)]
    if not found:
        return raw, []
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in raw.items()}
    notes = []
    for old in found:
        new = MOVED[old]
        (osec, okey), (nsec, nkey) = old.split("."), new.split(".")
        value = out[osec].pop(okey)
        target = out.get(nsec)
        if target is None:
            target = out[nsec] = {}
        if not isinstance(target, dict):  # the section is not a mapping: its own validation says so
            continue
        if nkey in target and target[nkey] != value:
            raise MovedKeyConflict(old, new, value, target[nkey])
        target[nkey] = value
        notes.append(note(old))
    return out, notes


def _has(raw: dict, dotted: str) -> bool:
    section, key = dotted.split(".")
    return isinstance(raw.get(section), dict) and key in raw[section]


# keys whose default changed since run repos stored configs: a stored config is a full dump of its Config, so one
# that lacks such a key was written before the key existed, and its run behaved as this value (the default then)
FORMER_DEFAULTS: dict[str, Any] = {"coordinator.verify_tolerance": "wide"}


def with_former_defaults(text: str) -> str:
    """A run repo's stored config (YAML text) with each ``FORMER_DEFAULTS`` key it lacks set to its former default,
    so a run keeps behaving as it was created; the text unchanged when none is missing (or it is not a mapping)."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError:
        return text  # the loader names the problem
    if not isinstance(raw, dict):
        return text
    changed = False
    for key, value in FORMER_DEFAULTS.items():
        *parents, last = key.split(".")
        node: Any = raw
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and last not in node:
            node[last] = value
            changed = True
    return yaml.safe_dump(raw, sort_keys=False, allow_unicode=True) if changed else text
