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

Not atomic, and readers holding an old revision lose it: stop every writer first, and rerun it after a failure.
"""

from __future__ import annotations

import json
import shutil
from typing import Mapping, Sequence

from hubgrpo.errors import StoreError

SCRATCH_BRANCH = "hubgrpo-gc"


def squash(store, *, message: str, head_tags: Sequence[str], rebuild: Mapping[str, Sequence[str]],
           drop: Sequence[str]) -> dict[str, str]:
    """Rewrite ``store`` as described above; returns {"main": sha, tag: sha, …} of the new refs."""
    from hubgrpo.store.hub import HubStore
    from hubgrpo.store.local import LocalStore

    if isinstance(store, LocalStore):
        return _squash_local(store, message, head_tags, rebuild, drop)
    if isinstance(store, HubStore):
        return _squash_hub(store, message, head_tags, rebuild, drop)
    if store.location.startswith("s3://"):  # hubgrpo.store.s3_gc: tags never move there
        from hubgrpo.store.s3_gc import squash as squash_s3

        return squash_s3(store, message=message, head_tags=head_tags, rebuild=rebuild, drop=drop)
    raise StoreError(f"{type(store).__name__} ({store.location}) cannot rewrite its history",
                     hint="hubgrpo gc works on local run folders and Hub repos")


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
    for sha in refs:
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


# ------------------------------------------------------------------------------------------------ Hub


def _squash_hub(store, message, head_tags, rebuild, drop) -> dict[str, str]:
    from huggingface_hub.errors import HfHubHTTPError

    from hubgrpo.store.hub import HUB_ERRORS, map_error

    api, kw = store.api, {"repo_type": store.repo_type, "token": store.token}
    try:
        tags = store.tags()
        files = {tag: {p: store.local_path(p, tags[tag]) for p in paths} for tag, paths in rebuild.items()}
        api.super_squash_history(store.repo_id, branch="main", commit_message=message, **kw)
        main = store.head()
        new = {"main": main, **{t: main for t in head_tags}}
        new.update(_rebuild_hub(store, main, files, message))
        for tag in [t for t in new if t != "main"] + [t for t in drop if t not in new]:
            try:
                api.delete_tag(store.repo_id, tag=tag, **kw)
            except HfHubHTTPError as e:  # a tag that is not there (a rerun after a failure) is fine
                if getattr(e.response, "status_code", None) != 404:
                    raise
            if tag in new:
                api.create_tag(store.repo_id, tag=tag, revision=new[tag], **kw)
        api.delete_branch(store.repo_id, branch=SCRATCH_BRANCH, **kw)
        _delete_dead_lfs(store, set(new.values()) | set(store.tags().values()))
    except HUB_ERRORS as e:
        raise map_error(e, what="gc (history rewrite)", repo=store.location) from None
    return new


def _rebuild_hub(store, main: str, files: dict, message: str) -> dict[str, str]:
    """One commit per rebuilt tag on a scratch branch started at ``main``, each holding exactly its files."""
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete

    api, kw = store.api, {"repo_type": store.repo_type, "token": store.token}
    api.create_branch(store.repo_id, branch=SCRATCH_BRANCH, revision=main, exist_ok=True, **kw)
    present = set(store.list_files("", main))
    out = {}
    for tag, local in files.items():
        ops = [CommitOperationDelete(path_in_repo=p) for p in sorted(present - set(local))]
        ops += [CommitOperationAdd(path_in_repo=p, path_or_fileobj=str(f)) for p, f in local.items()]
        info = api.create_commit(store.repo_id, ops, commit_message=f"{message} ({tag})", revision=SCRATCH_BRANCH,
                                 **kw)
        out[tag], present = info.oid, set(local)
    return out


def _delete_dead_lfs(store, refs: set[str]) -> int:
    """Permanently delete the stored LFS files no tree of ``refs`` references; returns how many."""
    api, kw = store.api, {"repo_type": store.repo_type, "token": store.token}
    live = set()
    for sha in refs:
        for entry in api.list_repo_tree(store.repo_id, recursive=True, revision=sha, **kw):
            lfs = getattr(entry, "lfs", None)
            if lfs is not None:
                live.add(lfs.sha256)
    dead = [f for f in api.list_lfs_files(store.repo_id, **kw) if f.file_oid not in live]
    if dead:
        api.permanently_delete_lfs_files(store.repo_id, dead, **kw)
    return len(dead)
