"""The history rewrite of ``hubgrpo.store.squash`` on the Hub, in steps that may each fail and be run again.

At every instant each tag to keep names a commit holding its files, and a rerun after a failure anywhere ends
where one clean run ends:

1. the files of each rebuilt tag are downloaded at the tag's commit (reads only);
2. ``main`` is super-squashed into one commit, unless its head already has no parent (a rerun). The tags still
   name the old commits, which the Hub keeps while a ref reaches them;
3. a scratch branch (one left by an earlier failure is deleted first) gets one commit per rebuilt tag, a child of
   the squashed root holding exactly that tag's files;
4. each tag moves to its new commit through a temporary tag ``hubgrpo-gc.<tag>`` created first: a tag is deleted
   only while the temporary one already names its replacement (``squash.restore_tags`` re-creates a tag found
   missing beside its temporary one; a coordinator does that when it starts, and gc before it plans);
5. the dropped tags, the temporary tags and the scratch branch are deleted;
6. the LFS files that no branch or tag references any more are deleted for good.

Every call goes through ``HubStore._run``: 5xx, 429, 409 (busy) and dropped connections are retried with backoff,
and a call whose answer was lost is recognised by what it left (the root commit, a ref, a commit's marker on the
scratch branch), so nothing is done twice.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping, Sequence

from hubgrpo.errors import StoreError
from hubgrpo.store.base import MARKER_PREFIX

log = logging.getLogger("hubgrpo.gc")

SCRATCH_BRANCH = "hubgrpo-gc"
TEMP_PREFIX = "hubgrpo-gc."  # + the tag it stands in for while that tag moves
CHAIN = 50  # commits a writer may add on top of the squashed root while gc runs (stop the writers first)


def squash_hub(
    store, message: str, head_tags: Sequence[str], rebuild: Mapping[str, Sequence[str]], drop: Sequence[str]
) -> dict[str, str]:
    """Steps 1–6 above on a ``HubStore``; returns {"main": root sha, tag: sha, …} of the new refs."""
    refs = refs_of(store)
    files = {tag: {p: store.local_path(p, refs["tags"][tag]) for p in paths} for tag, paths in rebuild.items()}
    main = _squash_main(store, message)
    new = {"main": main, **{t: main for t in head_tags}}
    new.update(_rebuild(store, main, files, message, stale=SCRATCH_BRANCH in refs["branches"]))
    tags = dict(refs["tags"])
    for tag in [t for t in new if t != "main"]:
        _move_tag(store, tag, new[tag], tags)
    left = refs_of(store)
    gone = sorted(t for t in left["tags"] if t in drop or t.startswith(TEMP_PREFIX))
    for tag in gone:
        delete_ref(store, "tag", tag)
    if SCRATCH_BRANCH in left["branches"]:
        delete_ref(store, "branch", SCRATCH_BRANCH)
    foreign = sorted(b for b in left["branches"] if b not in ("main", SCRATCH_BRANCH)) + sorted(left["pulls"])
    if foreign:  # their older commits may hold files no ref's tree shows: deleting those would break them
        log.warning(
            "gc kept every LFS file: the repo has branches or pull requests gc does not rewrite (%s); "
            "delete them first to reclaim the storage",
            ", ".join(foreign)[:300],
        )
        return new
    _delete_dead_lfs(store, {left["branches"]["main"]} | {s for t, s in left["tags"].items() if t not in gone})
    return new


# ------------------------------------------------------------------------------------------------ refs


def _kw(store) -> dict:
    return {"repo_type": store.repo_type, "token": store.token}


def refs_of(store) -> dict[str, dict[str, str]]:
    """{"branches": {name: sha}, "tags": {name: sha}, "pulls": {ref: sha}} in one call."""

    def read(_uncertain: bool) -> dict:
        refs = store.api.list_repo_refs(store.repo_id, include_pull_requests=True, **_kw(store))
        return {
            "branches": {b.name: b.target_commit for b in refs.branches},
            "tags": {t.name: t.target_commit for t in refs.tags},
            "pulls": {p.ref: p.target_commit for p in refs.pull_requests or []},
        }

    return store._run("list refs", read)


def delete_ref(store, kind: str, name: str) -> None:
    """Delete tag or branch ``name``; one that is not there (a lost answer, a rerun) is fine."""
    from huggingface_hub.errors import HfHubHTTPError

    def attempt(_uncertain: bool) -> None:
        fn = store.api.delete_tag if kind == "tag" else store.api.delete_branch
        try:
            fn(store.repo_id, **{kind: name}, **_kw(store))
        except HfHubHTTPError as e:
            if getattr(e.response, "status_code", None) != 404:
                raise

    store._run(f"delete {kind} {name}", attempt)


def ensure_ref(store, kind: str, name: str, target: str) -> None:
    """Create tag or branch ``name`` at ``target``. A 409 is 'busy' (retried) while the ref is missing, done when it
    already names ``target``, and an error when it names another commit; a lost answer is recognised the same way."""
    from huggingface_hub.errors import HfHubHTTPError

    def now() -> str | None:
        return refs_of(store)["tags" if kind == "tag" else "branches"].get(name)

    def attempt(_uncertain: bool) -> None:
        try:
            if kind == "tag":
                store.api.create_tag(store.repo_id, tag=name, revision=target, **_kw(store))
            else:
                store.api.create_branch(store.repo_id, branch=name, revision=target, **_kw(store))
        except HfHubHTTPError as e:
            if getattr(e.response, "status_code", None) != 409:
                raise
            held = now()
            if held is None:
                raise  # the repo was busy: retried
            if held != target:
                raise StoreError(
                    f"{kind} {name} on {store.location} names {held[:12]}, not {target[:12]}",
                    hint="another writer changed the repo during gc: stop it and run gc again",
                ) from None

    store._run(f"create {kind} {name}", attempt, recover=lambda: True if now() == target else None)


def _move_tag(store, tag: str, target: str, tags: dict[str, str]) -> None:
    """Point ``tag`` at ``target`` without a moment in which the version has no tag naming its files."""
    if tags.get(tag) == target:
        return
    temp = TEMP_PREFIX + tag
    if tags.get(temp) != target:
        if temp in tags:  # from an earlier try (``tag`` exists: restore_tags re-created it before gc planned)
            delete_ref(store, "tag", temp)
        ensure_ref(store, "tag", temp, target)
    if tag in tags:
        delete_ref(store, "tag", tag)
    ensure_ref(store, "tag", tag, target)
    tags[tag] = tags[temp] = target


# ------------------------------------------------------------------------------------------------ commits


def _root_head(store, depth: int = 1) -> str | None:
    """The root commit of main when it lies within ``depth`` commits of the head, else None."""
    chain = store.history(limit=depth)
    return chain[-1].sha if chain and not chain[-1].parents else None


def _squash_main(store, message: str) -> str:
    """Squash main into one commit (unless it is one already); the root's sha."""
    root = _root_head(store)
    if root is not None:
        return root
    store._run(
        "super-squash main",
        lambda _u: store.api.super_squash_history(store.repo_id, branch="main", commit_message=message, **_kw(store)),
        recover=lambda: _root_head(store),
    )
    root = _root_head(store, CHAIN)
    if root is None:
        raise StoreError(
            f"gc on {store.location}: more than {CHAIN} commits landed on main while it was squashed",
            hint="stop the coordinator and the workers, then run gc again",
        )
    return root


def _rebuild(store, root: str, files: dict, message: str, *, stale: bool) -> dict[str, str]:
    """One commit per rebuilt tag on a fresh scratch branch started at ``root``, each holding exactly its files."""
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete

    if stale:  # left by an earlier failure: its commits are reachable from tags where they matter
        delete_ref(store, "branch", SCRATCH_BRANCH)
    if not files:
        return {}
    ensure_ref(store, "branch", SCRATCH_BRANCH, root)
    present, parent, out = set(store.list_files("", root)), root, {}
    for tag, local in files.items():

        def ops(local=local, present=present) -> list:
            return [CommitOperationDelete(path_in_repo=p) for p in sorted(present - set(local))] + [
                CommitOperationAdd(path_in_repo=p, path_or_fileobj=str(f)) for p, f in local.items()
            ]

        out[tag] = parent = _scratch_commit(store, ops, f"{message} ({tag})", parent)
        present = set(local)
    return out


def _scratch_commit(store, ops, message: str, parent: str) -> str:
    """A commit on the scratch branch on top of ``parent`` (compare-and-swap); a lost answer is recognised by the
    commit's marker at the branch's head."""
    marker = f"{MARKER_PREFIX}{uuid.uuid4()}"

    def attempt(_uncertain: bool) -> str:
        return store.api.create_commit(
            store.repo_id,
            ops(),
            commit_message=message,
            commit_description=marker,
            revision=SCRATCH_BRANCH,
            parent_commit=parent,
            **_kw(store),
        ).oid

    def recover() -> str | None:
        top = store.api.list_repo_commits(store.repo_id, revision=SCRATCH_BRANCH, **_kw(store))[0]
        return top.commit_id if marker in (top.message or "").splitlines() else None

    return store._run(f"commit {message!r} on {SCRATCH_BRANCH}", attempt, recover=recover, guard_conflicts=True)


def _delete_dead_lfs(store, refs: set[str]) -> int:
    """Permanently delete the stored LFS files that no commit of ``refs`` (every branch and tag left) references;
    returns how many."""
    live: set[str] = set()
    for sha in sorted(refs):
        entries = store._run(
            f"list {sha[:12]}",
            lambda _u, sha=sha: list(
                store.api.list_repo_tree(store.repo_id, recursive=True, revision=sha, **_kw(store))
            ),
        )
        live.update(e.lfs.sha256 for e in entries if getattr(e, "lfs", None) is not None)

    def attempt(_uncertain: bool) -> int:  # listed again on each try: a retry deletes only what is still there
        dead = [f for f in store.api.list_lfs_files(store.repo_id, **_kw(store)) if f.file_oid not in live]
        if dead:
            store.api.permanently_delete_lfs_files(store.repo_id, dead, **_kw(store))
        return len(dead)

    return store._run("delete unreferenced LFS files", attempt)
