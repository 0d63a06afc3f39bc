"""Rewriting a store's history to reclaim its storage (``hubgrpo gc``), for both backends.

``squash(store, message=…, head_tags=…, rebuild=…, drop=…)``:

1. the main branch becomes ONE commit holding the head's files (no parent); the ``head_tags`` point at it;
2. every tag of ``rebuild`` (tag → repo paths) gets a new commit, a child of that one off the branch, holding
   exactly those paths as they were at the tag, and the tag points at it;
3. the tags of ``drop`` are deleted (other tags are left as they are);
4. what no branch or tag reaches any more is reclaimed: a ``LocalStore`` deletes the commits, objects and
   snapshots; on the Hub, ``HfApi.super_squash_history`` rewrites the branch, a scratch branch carries the
   rebuilt commits, and the LFS files no remaining tree references are deleted for good
   (``list_lfs_files`` / ``permanently_delete_lfs_files``; regular files the Hub collects itself).

A ``LocalStore`` does it under its lock, switching tags and head with atomic writes. On the Hub it is a sequence
of calls (``squash_hub``) in which every kept tag always names a commit holding its files — a tag on the move has a
temporary stand-in, which ``restore_tags`` turns back into the tag after a crash — and a rerun after a failure
anywhere finishes the job. Readers holding an old revision lose it: stop every writer first.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping, Sequence

from hubgrpo.errors import StoreError
from hubgrpo.store.squash_hub import SCRATCH_BRANCH, TEMP_PREFIX  # noqa: F401 (re-exported)


def squash(
    store, *, message: str, head_tags: Sequence[str], rebuild: Mapping[str, Sequence[str]], drop: Sequence[str]
) -> dict[str, str]:
    """Rewrite ``store`` as described above; returns {"main": sha, tag: sha, …} of the new refs."""
    from hubgrpo.store.hub import HubStore
    from hubgrpo.store.local import LocalStore

    if isinstance(store, LocalStore):
        return _squash_local(store, message, head_tags, rebuild, drop)
    if isinstance(store, HubStore):
        from hubgrpo.store.squash_hub import squash_hub

        return squash_hub(store, message, head_tags, rebuild, drop)
    if store.location.startswith("s3://"):  # hubgrpo.store.s3_gc: tags never move there
        from hubgrpo.store.s3_gc import squash as squash_s3

        return squash_s3(store, message=message, head_tags=head_tags, rebuild=rebuild, drop=drop)
    raise StoreError(
        f"{type(store).__name__} ({store.location}) cannot rewrite its history",
        hint="hubgrpo gc works on local run folders and Hub repos",
    )


# ------------------------------------------------------------------------------------------------ local


def _squash_local(store, message, head_tags, rebuild, drop) -> dict[str, str]:
    with store._locked():
        head, tags = store.head(), store.tags()
        main = store._write_commit(dict(store._tree_at(head)), None, message)
        new = {"main": main, **{t: main for t in head_tags}}
        for tag, paths in rebuild.items():
            tree = store._tree_at(tags[tag])
            new[tag] = store._write_commit({p: tree[p] for p in paths if p in tree}, main, f"{message} ({tag})")
        tags = {t: s for t, s in tags.items() if t not in drop}
        tags.update({t: s for t, s in new.items() if t != "main"})
        store._atomic_write(store.meta / "tags.json", json.dumps(tags, indent=1, sort_keys=True).encode())
        store._write_head(main)
        store._atomic_write(store.meta / "CHECKOUT", main.encode())  # same files at the root
        _reclaim_local(store, {main, *tags.values()})
    return new


def _reclaim_local(store, refs: set[str]) -> None:
    """Delete every commit, object and snapshot that no ref reaches (under the store's lock)."""
    commits, objects = set(), set()
    for ref in refs:
        sha: str | None = ref
        while sha and sha not in commits:
            commits.add(sha)
            rec = store._commit(sha)
            objects.add(rec["tree"])
            objects.update(store._tree_at(sha).values())
            sha = rec["parents"][0] if rec["parents"] else None
    for f in (store.meta / "commits").glob("*.json"):
        if f.stem not in commits:
            f.unlink()
    for f in (store.meta / "objects").glob("*/*"):
        if f.name not in objects:
            f.unlink()
    for d in (store.meta / "snapshots").iterdir():
        if d.name not in commits:
            shutil.rmtree(d, ignore_errors=True)
    with store._cache_lock:
        store._commits.clear()
        store._trees.clear()


# ------------------------------------------------------------------------------------------------ tags


def restore_tags(store, tags: dict[str, str] | None = None, *, write: bool = True) -> dict[str, str]:
    """The tags of ``store`` with every tag a crashed ``gc`` left missing re-created (``write``) from its temporary
    stand-in ``hubgrpo-gc.<tag>`` (``squash_hub``, step 4); without ``write`` only the returned view has them."""
    tags = dict(store.tags() if tags is None else tags)
    for temp, sha in sorted(tags.items()):
        name = temp[len(TEMP_PREFIX) :]
        if temp.startswith(TEMP_PREFIX) and name and name not in tags:
            if write:
                store.tag(name, sha, exist_ok=True)
            tags[name] = sha
    return tags
