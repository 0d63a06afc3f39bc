"""``hubgrpo gc``: reclaim a run repo's history, keeping the newest versions loadable by their tags.

A run adds one commit per round and per version; submission folders leave the head with later merges
(``coordinator.keep_submissions``) but stay in the history, and so does every version's adapter. ``collect(store,
keep)`` rewrites the history (``hubgrpo.store.squash``): the main branch becomes one commit holding the head (the
current version's tag points at it), each of the other ``keep - 1`` newest version tags is re-created on a commit
holding that version's root files (adapter, config, state.json, model card, outer momentum), every older version tag
is deleted, and what nothing reaches any more is reclaimed (on the Hub: the LFS files too). ``PeftModel``
loads every kept version by its tag as before; older versions are gone for good.

Stop the coordinator and the workers first (a live coordinator holds commit ids that no longer exist), and start
the coordinator again after; a worker's submission commit racing the rewrite can be lost (it is then refused as
not found and the round is leased again). ``dry_run`` reports what would happen and changes nothing.
"""

from __future__ import annotations

from hubgrpo import layout, runrepo
from hubgrpo.errors import ConfigError, NotFound


def collect(store, keep: int, *, dry_run: bool = False) -> dict:
    """Squash the history of ``store`` keeping the newest ``keep`` version tags; a report of what it did."""
    if keep < 1:
        raise ConfigError(f"--keep {keep}: at least the current version must stay", hint="pass --keep 1 or more")
    head = store.head()
    state = runrepo.read_state(store, head)
    shas = runrepo.version_shas(store)
    if state.version not in shas:
        raise NotFound(f"version {state.version} (state.json) has no tag yet",
                       hint="start the coordinator once (it tags it), stop it, then run gc")
    versions = sorted(shas)
    kept = versions[-keep:]
    if state.version not in kept:
        raise NotFound(f"the newest tag (v{versions[-1]}) is newer than state.json's version {state.version}",
                       hint="the repo was edited by hand; restore it before reclaiming its history")
    older = [v for v in kept if v != state.version]
    rebuild = {layout.version_tag(v): [p for p in store.list_files("", shas[v])
                                       if not p.startswith(layout.SUBMISSIONS + "/")] for v in older}
    drop = [layout.version_tag(v) for v in versions if v not in kept]
    report = {"kept": [layout.version_tag(v) for v in kept], "dropped": drop,
              "commits_before": len(store.history())}
    if dry_run:
        return report
    from hubgrpo.store.squash import squash

    refs = squash(store, message=f"hubgrpo gc: version {state.version} (history squashed, {keep} versions kept)",
                  head_tags=[layout.version_tag(state.version)], rebuild=rebuild, drop=drop)
    report.update(refs=refs, commits_after=len(store.history()))
    return report
