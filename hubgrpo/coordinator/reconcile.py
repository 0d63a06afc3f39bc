"""Version tags after a crash, and a coordinator's reload after ``hubgrpo gc`` rewrote the history under it.

``version_shas(store, version)``: the version tags as a coordinator (or gc) starting on the repo needs them. A tag
that a crashed gc left missing beside its temporary stand-in is re-created (``squash.restore_tags``); when
``state.json``'s version still has no tag, the commit that holds it is found in the history and tagged: the merge
commit (``hubgrpo: version N (…)``, a coordinator that died between its commit and its tag) or the squashed root
of a gc (``hubgrpo gc: version N (…)``), checked by reading its ``state.json``.

``reload_if_rewritten(c)``: gc moves or deletes the tags a running coordinator holds, and the commits they
named are gone. The coordinator compares its tags with the repo's at each scan (one listing of the refs) and, when
one moved or vanished, reloads state, tags and head from the repo: new leases then name commits that exist, and a
worker whose lease names a deleted commit gives it back and leases again.
"""

from __future__ import annotations

import logging
import shutil
from typing import TYPE_CHECKING

from hubgrpo import layout, runrepo
from hubgrpo.errors import NotFound

if TYPE_CHECKING:
    from hubgrpo.coordinator.core import Coordinator

log = logging.getLogger("hubgrpo.coordinator")
MERGE_MESSAGE = "hubgrpo: version {version} "
GC_PREFIX = "hubgrpo gc: "  # every commit message of `hubgrpo gc`
GC_MESSAGE = GC_PREFIX + "version {version} "
HISTORY_DEPTH = 200


def version_shas(store, version: int, *, write: bool = True) -> dict[int, str]:
    """version → commit sha from the ``vNNNNNN`` tags, repaired as described above (``write=False``: the repairs
    are in the answer only; nothing is tagged)."""
    from hubgrpo.store.squash import restore_tags

    tags = restore_tags(store, write=write)
    shas = {v: sha for v, sha in ((layout.parse_tag(n), s) for n, s in tags.items()) if v is not None}
    if version not in shas:
        shas[version] = tag_version(store, version, write=write)
    return shas


def tag_version(store, version: int, *, write: bool = True) -> str:
    """Find the commit holding ``version`` in the recent history of main and tag it (``write``); its sha."""
    merge, gc = MERGE_MESSAGE.format(version=version), GC_MESSAGE.format(version=version)
    for c in store.history(limit=HISTORY_DEPTH):
        found = c.message.startswith(merge) or (
            c.message.startswith(gc) and runrepo.read_state(store, c.sha).version == version
        )
        if found:
            if write:
                store.tag(layout.version_tag(version), c.sha, exist_ok=True)
            return c.sha
    raise NotFound(
        f"state.json says version {version} but no commit or tag for it was found",
        hint="the run repo was edited by hand; restore state.json from the last tagged version",
    )


def rewritten(held: dict[int, str], store) -> bool:
    """Whether a version tag of ``held`` now names another commit, or is gone (one listing of the tags)."""
    now = runrepo.version_shas(store)
    return any(now.get(v) != sha for v, sha in held.items())


def reload_if_rewritten(c: Coordinator) -> bool:
    """Reload ``c`` from the repo when its tags were rewritten (store reads without ``c.lock``, the reload under
    it). A merge adopted meanwhile wins: the next scan looks again. True when it reloaded."""
    with c.lock:
        held, version = dict(c.shas), c.state.version
    if not rewritten(held, c.store):
        return False
    repo = c.read_repo()
    with c.lock:
        if c.state.version != version or c.merging is not None or repo["state"].version == c.checkpoint.version:
            shutil.rmtree(repo["download"], ignore_errors=True)  # not adopted: the version cache has its copy
        if c.state.version != version or c.merging is not None:
            return False
        moved = sorted(v for v, sha in held.items() if repo["shas"].get(v) != sha)
        if repo["state"].version == c.checkpoint.version:  # gc kept the checkpoint: only commits and tags moved
            log.warning(
                "the run repo's history was rewritten (hubgrpo gc?): versions %s moved or left; the "
                "versions since the checkpoint stay live",
                moved,
            )
            c.shas, c.head = repo["shas"], repo["head"]
            c.checkpoint.sha = repo["head"]
            return True
        log.warning(
            "the run repo's history was rewritten (hubgrpo gc?): versions %s moved or left; reloading "
            "state, tags and head from the repo",
            moved,
        )
        c.apply_repo(repo)
    return True
