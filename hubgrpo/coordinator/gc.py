"""``hubgrpo gc``: reclaim a run repo's history, keeping the newest versions loadable by their tags.

A run adds one commit per round and per version; submission folders leave the head with later merges
(``coordinator.keep_submissions``) but stay in the history, and so does every version's adapter. ``collect(store,
keep)`` rewrites the history (``hubgrpo.store.squash``): the main branch becomes one commit holding the head (the
current version's tag points at it), each of the other ``keep - 1`` newest version tags is re-created on a commit
holding that version's root files (adapter, config, state.json, model card, outer momentum), every older version tag
is deleted, and what nothing reaches any more is reclaimed (on the Hub: the LFS files too). ``PeftModel``
loads every kept version by its tag as before; older versions are gone for good.

A failure anywhere loses no kept version (``squash_hub``), and a rerun finishes the job: it first repairs what a
crash left (``reconcile.version_shas``: a tag on the move, the current version's tag).

Stop the coordinator and the workers first. gc refuses while the run looks live (``check_idle``): something was
written within ``2 × coordinator.round_timeout_s`` (30 min by default) — a commit other than gc's own, a merge, a
worker seen, as state.json records them. A run with a working worker writes at least that often: a round is
committed within its lease, and the merge that takes it in comes at the next round deadline. An idle coordinator
writes nothing and cannot be told apart: after a gc it notices the rewrite at its next scan and reloads
(``reconcile.reload_if_rewritten``). ``force`` skips the check; a worker's submission commit racing the rewrite can
then be lost (it is refused as not found and the round is leased again). ``dry_run`` reports and changes nothing.
"""

from __future__ import annotations

import time

from hubgrpo import layout, runrepo
from hubgrpo.coordinator import reconcile
from hubgrpo.errors import ConfigError, CoordinatorError, NotFound

LIVE_TIMEOUTS = 2  # round timeouts without a write after which a run counts as stopped


def collect(store, keep: int, *, dry_run: bool = False, force: bool = False, now: float | None = None) -> dict:
    """Squash the history of ``store`` keeping the newest ``keep`` version tags; a report of what it did."""
    if keep < 1:
        raise ConfigError(f"--keep {keep}: at least the current version must stay", hint="pass --keep 1 or more")
    head = store.head()
    state = runrepo.read_state(store, head)
    live = live_reason(store, state, head, time.time() if now is None else now)
    if live and not force and not dry_run:
        raise CoordinatorError(
            f"the run looks live: {live}",
            code="live",
            hint="stop the coordinator and the workers and wait, or pass --force if they are "
            "stopped (a live coordinator reloads after gc, but rounds in flight can be lost)",
        )
    shas = reconcile.version_shas(store, state.version, write=not dry_run)
    versions = sorted(shas)
    kept = versions[-keep:]
    if state.version not in kept:
        raise NotFound(
            f"the newest tag (v{versions[-1]}) is newer than state.json's version {state.version}",
            hint="the repo was edited by hand; restore it before reclaiming its history",
        )
    older = [v for v in kept if v != state.version]
    rebuild = {
        layout.version_tag(v): [p for p in store.list_files("", shas[v]) if not p.startswith(layout.SUBMISSIONS + "/")]
        for v in older
    }
    drop = [layout.version_tag(v) for v in versions if v not in kept]
    report = {
        "kept": [layout.version_tag(v) for v in kept],
        "dropped": drop,
        "commits_before": len(store.history()),
        "live": live,
    }
    if dry_run:
        return report
    from hubgrpo.store.squash import squash

    message = reconcile.GC_MESSAGE.format(version=state.version) + f"(history squashed, {keep} versions kept)"
    refs = squash(store, message=message, head_tags=[layout.version_tag(state.version)], rebuild=rebuild, drop=drop)
    report.update(refs=refs, commits_after=len(store.history()))
    return report


def live_reason(store, state, head: str, now: float) -> str | None:
    """Why the run looks live (the newest write is younger than ``LIVE_TIMEOUTS`` round timeouts), or None."""
    window = LIVE_TIMEOUTS * runrepo.read_config(store, head).coordinator.round_timeout_s
    newest = store.history(limit=1)
    writes = {
        "a commit": [c.created_at for c in newest if not c.message.startswith(reconcile.GC_PREFIX)],
        "a merge": [v.created_at for v in state.versions[-1:]],
        "a worker seen": [w.last_seen or 0.0 for w in state.workers.values()],
        "the run's start": [state.started_at],
    }
    what, when = max(((k, max(v)) for k, v in writes.items() if v), key=lambda kv: kv[1])
    age = now - when
    if age >= window:
        return None
    return (
        f"its last write ({what}) was {max(0.0, age):.0f} s ago, within {window:.0f} s "
        f"({LIVE_TIMEOUTS} × coordinator.round_timeout_s)"
    )
