"""Reclaiming an ``s3://`` run repo's history (``hubgrpo gc``; ``hubgrpo.store.squash`` dispatches here).

``squash(store, message=…, head_tags=…, rebuild=…, drop=…)``, with the layout of ``hubgrpo.store.s3``:

1. main becomes ONE commit: a new manifest holding the head's tree, without a parent, swapped in with ``IfMatch``
   (a head that moved meanwhile — a coordinator or a worker still writing — stops gc: ``CommitConflict``);
2. the tags of ``drop`` are deleted;
3. every commit manifest other than main's and the remaining tags' is deleted, then every blob none of those trees
   references — except objects younger than ``GRACE_S``: a commit in flight uploads its blobs before its manifest
   and swaps the head last, and its blobs must not go before it lands (git's prune expiry, for the same reason).

Tags never move on S3 (``S3Store`` caches them for good), so a kept version keeps the commit it was tagged on, with
the submission folders it held then (``coordinator.keep_submissions`` bounds them), and ``rebuild`` is not needed:
no reader anywhere ever holds a tag that points at a deleted commit. The head's tags (``head_tags``) keep pointing
at the old head's commit, whose tree main's new commit repeats.

Every step can fail and be run again: the new main is only swapped in whole, a tag is deleted only when it is
dropped, and nothing a kept ref reaches is ever deleted; a rerun skips step 1 when main already has no parent.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Mapping, Sequence

from hubgrpo.errors import CommitConflict, StoreError
from hubgrpo.store import manifest

log = logging.getLogger("hubgrpo.store")
GRACE_S = 3600.0  # unreachable objects younger than this stay for a later gc
COMMITS, BLOBS = "commits/", "blobs/"


def squash(
    store, *, message: str, head_tags: Sequence[str], rebuild: Mapping[str, Sequence[str]], drop: Sequence[str]
) -> dict[str, str]:
    """Rewrite the S3 run repo ``store`` as described above; {"main": sha, tag: sha, …} of the refs kept."""
    from hubgrpo.store.s3 import TAGS

    started = time.time()
    store._check_writes()  # the swap below is a compare-and-swap only where conditional writes work
    main = _one_commit(store, message)
    if drop:
        store.objects.delete([TAGS + tag for tag in drop])
        with store._lock:
            for tag in drop:
                store._tags.pop(tag, None)
    tags = store.tags()
    missing = [t for t in (*head_tags, *rebuild) if t not in tags]
    if missing:
        raise StoreError(f"{store.location}: tag {missing[0]} is missing", hint="restore it, then run gc again")
    deleted, young = _reclaim(store, {main, *tags.values()}, started - GRACE_S)
    if young:
        log.warning(
            "%s: %d unreachable objects are younger than %.0f s and stay; run gc again later to reclaim them",
            store.location,
            young,
            GRACE_S,
        )
    log.info("%s: deleted %d objects", store.location, deleted)
    return {"main": main, **{t: tags[t] for t in (*head_tags, *rebuild)}}


def _one_commit(store, message: str) -> str:
    """Main as one commit without a parent (the head itself when it already is one)."""
    head, etag = store._read_head()
    if head is None:
        raise StoreError(f"{store.location} has no commit: nothing to reclaim", hint="check the repo's location")
    info, tree = store._load(head)
    if not info.parents:
        return head
    sha, data = manifest.encode(tree, None, message, str(uuid.uuid4()), time.time())
    store._create(f"{COMMITS}{sha}.json", data, same_if_exists=True)
    if not store._swap(sha, head, etag):
        raise CommitConflict(
            f"{store.location}: the head moved while gc ran (a coordinator or a worker is "
            "writing); nothing was deleted",
            hint="stop the coordinator and every worker, then run gc again",
        )
    return sha


def _reclaim(store, keep: set[str], cutoff: float) -> tuple[int, int]:
    """Delete the commit manifests not in ``keep`` and the blobs their trees do not reference, if older than
    ``cutoff``; (objects deleted, unreachable objects left because they are younger)."""
    live = {blob for sha in keep for blob, _ in store._tree(sha).values()}
    commits, young_commits = _unreachable(store, COMMITS, {f"{sha}.json" for sha in keep}, cutoff)
    blobs, young_blobs = _unreachable(store, BLOBS, live, cutoff)
    store.objects.delete(commits)  # manifests first: a blob goes only once no manifest names it
    store.objects.delete(blobs)
    return len(commits) + len(blobs), young_commits + young_blobs


def _unreachable(store, prefix: str, alive: set[str], cutoff: float) -> tuple[list[str], int]:
    """(keys under ``prefix`` whose names are not ``alive`` and that are older than ``cutoff``, how many younger)."""
    old, young = [], 0
    for key, _, _, modified in store.objects.entries(prefix):
        if key[len(prefix) :] in alive:
            continue
        if modified < cutoff:
            old.append(key)
        else:
            young += 1
    return old, young
