"""``hubgrpo init`` on the Hub: the config fitted to the Hub's commit quota (``hubgrpo.config.quota``) before the
run repo is created; a local folder or S3 (no quota) takes the config as it is."""

from __future__ import annotations

from hubgrpo import layout
from hubgrpo.config import Config
from hubgrpo.store.base import Store


def fit_to_store(cfg: Config, store: Store) -> tuple[Config, list[str]]:
    """``cfg`` as ``init`` stores it in ``store``, and the lines to print: on a store with an hourly commit quota
    (the Hub), fitted to it ("changed KEY: ..." saying what and why, then "note ..."; ``ConfigError`` for a config
    that cannot fit); elsewhere (a local folder, S3) as it is, with no lines. No I/O."""
    quota = hourly_quota(store)
    if not quota:
        return cfg, []
    from hubgrpo.config.quota import fit_hub_quota

    fit = fit_hub_quota(cfg, quota)
    return fit.config, [f"changed {c}" for c in fit.changes] + [f"note {n}" for n in fit.notes]


def holds_run(store: Store) -> bool:
    """Whether ``store`` already holds a run (a head with a state.json); reads, creates nothing."""
    return store.exists() and store.head() is not None and store.exists_file(layout.STATE_FILE)


def hourly_quota(store: Store) -> int | None:
    """Commits an hour ``store`` allows per repo (``hourly_commit_quota``: the Hub's); None where commits are free."""
    return getattr(store, "hourly_commit_quota", None) or None
