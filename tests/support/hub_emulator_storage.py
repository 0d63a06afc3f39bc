"""Storage on the local Hub emulator: what a repo occupies, super-squash, LFS files and their permanent deletion.

The Hub keeps two kinds of content. Regular (git) objects are reclaimed once no branch or tag reaches them. LFS
objects (here: files matching the ``.gitattributes`` patterns, ``*.safetensors`` …, whatever their upload mode) stay
stored even when nothing references them, until they are deleted for good (``permanently_delete_lfs_files``). The
emulator follows that model (``usage``), so a test can show what a history rewrite really frees.

Routes (huggingface_hub 2.4 ``hf_api.py``), under ``/api/{type}s/{ns}/{name}/``:

- ``POST super-squash/{branch}`` with ``{"message"}``: the branch becomes one commit holding its head's tree (no
  parent); tags keep pointing where they pointed. Owner only; 404 RevisionNotFound for an unknown branch, 400 for a
  tag name.
- ``GET lfs-files`` (paginated with ``Link``): ``[{"fileOid": sha256, "oid": git blob id, "filename", "size",
  "pushedAt", "ref"}]`` for every LFS object stored for the repo.
- ``POST lfs-files/batch`` with ``{"deletions": {"sha": [...], "rewriteHistory": bool}}``: the objects are deleted
  for good. The emulator does not rewrite history: while a commit still points at a deleted object its bytes stay
  (as a regular object); callers should delete only what no ref reaches.
"""

from __future__ import annotations

import fnmatch
import hashlib
import time
from typing import Callable

from tests.support.hub_emulator_state import GITATTRIBUTES, HubError, HubState, Repo, iso

LFS_PATTERNS = [line.split()[0] for line in GITATTRIBUTES.decode().splitlines() if line.strip()]


def is_lfs(path: str) -> bool:
    """Whether the Hub stores ``path`` with LFS (its name matches a ``.gitattributes`` pattern)."""
    name = path.rsplit("/", 1)[-1]
    return any(fnmatch.fnmatch(name, p) for p in LFS_PATTERNS)


def sha256(state: HubState, oid: str) -> str:
    if oid not in state.sha256:
        state.sha256[oid] = hashlib.sha256(state.blobs[oid]).hexdigest()
    return state.sha256[oid]


def lfs_info(state: HubState):
    """``lfs_of(path, oid)`` for tree entries: the LFS pointer info of an LFS file, else None."""
    def lfs_of(path: str, oid: str) -> dict | None:
        if not is_lfs(path) or oid not in state.blobs:
            return None
        return {"oid": sha256(state, oid), "size": len(state.blobs[oid]), "pointerSize": 134}
    return lfs_of


def register_lfs(state: HubState, repo: Repo, old: dict, new: dict) -> None:
    """Record the LFS objects a commit added (``old`` → ``new`` tree)."""
    added = False
    for path, oid in new.items():
        if old.get(path) != oid and is_lfs(path) and oid in state.blobs and sha256(state, oid) not in repo.lfs:
            repo.lfs[sha256(state, oid)] = {"oid": oid, "filename": path, "size": len(state.blobs[oid]),
                                            "pushedAt": time.time()}
            added = True
    if added:
        state._log({"op": "lfs", "type": repo.repo_type, "id": repo.repo_id, "lfs": repo.lfs})


def reachable(repo: Repo) -> set[str]:
    """Commits some branch or tag reaches."""
    seen: set[str] = set()
    for sha in list(repo.branches.values()) + list(repo.tags.values()):
        c = repo.commits.get(sha)
        while c is not None and c.sha not in seen:
            seen.add(c.sha)
            c = repo.commits.get(c.parent) if c.parent else None
    return seen


def collect_garbage(state: HubState) -> None:
    """Drop commits no ref reaches, and blobs that neither a remaining commit nor an LFS record holds."""
    live: set[str] = set()
    for repo in state.repos.values():
        keep = reachable(repo)
        gone = [s for s in repo.commits if s not in keep]
        for s in gone:
            del repo.commits[s]
        if gone:
            state._log({"op": "drop", "type": repo.repo_type, "id": repo.repo_id, "commits": gone})
        for c in repo.commits.values():
            live.update(c.tree.values())
        live.update(e["oid"] for e in repo.lfs.values())
    for oid in [o for o in state.blobs if o not in live]:
        del state.blobs[oid]
        if state.data_dir:
            (state.data_dir / "blobs" / oid).unlink(missing_ok=True)


def usage(state: HubState, repo: Repo) -> dict:
    """Bytes a repo occupies: ``head`` (files of main), ``git`` (regular objects some ref reaches), ``lfs`` (LFS
    objects stored, referenced or not), ``total`` = git + lfs, and the number of commits kept."""
    with state.lock:
        head = repo.commits.get(repo.branches.get("main", ""))
        commits = [repo.commits[s] for s in reachable(repo)]
        git = {oid for c in commits for p, oid in c.tree.items() if not is_lfs(p)}
        lfs = repo.lfs
        out = {"head": sum(len(state.blobs.get(o, b"")) for o in (head.tree.values() if head else [])),
               "git": sum(len(state.blobs.get(o, b"")) for o in git), "lfs": sum(e["size"] for e in lfs.values()),
               "commits": len(commits)}
    out["total"] = out["git"] + out["lfs"]
    return out


def route(api, req, t: str, rid: str, rest: list[str]) -> tuple[str, Callable] | None:
    """(endpoint name, thunk) for a storage route, else None."""
    m, op = req.method, rest[0] if rest else ""
    if m == "POST" and op == "super-squash" and len(rest) == 2:
        return "super-squash", lambda: squash(api, req, t, rid, rest[1])
    if m == "GET" and op == "lfs-files" and len(rest) == 1:
        return "lfs-files", lambda: list_lfs(api, req, t, rid)
    if m == "POST" and op == "lfs-files" and rest[1:] == ["batch"]:
        return "lfs-files-batch", lambda: delete_lfs(api, req, t, rid)
    return None


def squash(api, req, t: str, rid: str, branch: str):
    """The branch → one parentless commit with its head's tree; then what no ref reaches is collected."""
    from tests.support.hub_emulator_api import json_resp

    message = req.json().get("message") or f"Super-squash branch '{branch}'"
    state = api.state
    with state.lock:
        repo = api._repo(req, t, rid, write=True)
        if branch in repo.tags:
            raise HubError(400, "You cannot squash history on tags")
        head = repo.commits.get(repo.branches.get(branch, ""))
        if head is None:
            raise HubError(404, f"Invalid rev id: {branch}", code="RevisionNotFound")
        del repo.branches[branch]  # the new commit has no parent
        state._add_commit(repo, branch, dict(head.tree), message, "", req.user)
        collect_garbage(state)
    return json_resp({})


def list_lfs(api, req, t: str, rid: str):
    with api.state.lock:
        repo = api._repo(req, t, rid)
        items = [{"fileOid": sha, "oid": e["oid"], "filename": e["filename"], "size": e["size"],
                  "pushedAt": iso(e["pushedAt"]), "ref": None} for sha, e in sorted(repo.lfs.items())]
    return api._page(req, items, int(req.arg("cursor", "0") or 0), 100, "cursor")


def delete_lfs(api, req, t: str, rid: str):
    from tests.support.hub_emulator_api import json_resp

    shas = (req.json().get("deletions") or {}).get("sha") or []
    if not isinstance(shas, list):
        raise HubError(400, "deletions.sha must be a list of sha256")
    with api.state.lock:
        repo = api._repo(req, t, rid, write=True)
        for sha in shas:
            repo.lfs.pop(str(sha), None)
        api.state._log({"op": "lfs", "type": repo.repo_type, "id": repo.repo_id, "lfs": repo.lfs})
        collect_garbage(api.state)
    return json_resp({})


