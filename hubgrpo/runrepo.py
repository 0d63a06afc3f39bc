"""Reading a run repo through a Store: its config, its state, the version tags, the adapter at a version, one
submission folder; and the local cache root.

The one module below both roles that reads a run: the worker, the coordinator, the Space and the CLI all use it.
Writing a run (the initial commit, merge commits) is the coordinator's (``hubgrpo.coordinator``); paths come
from ``layout``. No torch, no gradio.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

from hubgrpo import layout
from hubgrpo.config import Config, loads
from hubgrpo.config.legacy import with_former_defaults
from hubgrpo.errors import InvalidPath, NotFound
from hubgrpo.layout import RunState
from hubgrpo.store.base import Store
from hubgrpo.store.cache import evict


def cache_root() -> Path:
    """hubgrpo's local cache: ``$HUBGRPO_CACHE`` or ``~/.cache/hubgrpo`` (models, adapters, logs, secrets)."""
    return Path(os.environ.get("HUBGRPO_CACHE") or Path.home() / ".cache" / "hubgrpo").expanduser()


def read_config(store: Store, revision: str | None = None) -> Config:
    """The resolved config stored in the repo, never expanded: whoever can write the repo wrote it, so a
    ``${HUBGRPO_SECRET}`` there stays that text instead of reading this process's environment (secrets are never
    stored; a reward kwarg's placeholder is filled only by its runner: ``hubgrpo.task.rewards.fill_kwargs``)."""
    try:
        text = store.read(layout.CONFIG_FILE, revision).decode()
    except NotFound:
        raise NotFound(
            f"{store.location} has no {layout.CONFIG_FILE}: it is not a hubgrpo run repo",
            hint="create it with `hubgrpo init CONFIG --repo REPO`",
        ) from None
    # a key added since with another default than it behaved as then keeps its run's behaviour
    return loads(with_former_defaults(text), source=f"{store.location}/{layout.CONFIG_FILE}", expand=False)


def read_state(store: Store, revision: str | None = None) -> RunState:
    try:
        data = store.read(layout.STATE_FILE, revision)
    except NotFound:
        raise NotFound(
            f"{store.location} has no {layout.STATE_FILE}: it is not a hubgrpo run repo",
            hint="create it with `hubgrpo init CONFIG --repo REPO`",
        ) from None
    if revision is not None:  # one state.json per merge: a long run's cache would grow with every version
        evict(store, [layout.STATE_FILE], revision)
    return RunState.from_json(data)


def version_shas(store: Store) -> dict[int, str]:
    """version number → commit sha, from the vNNNNNN tags."""
    out = {}
    for name, sha in store.tags().items():
        v = layout.parse_tag(name)
        if v is not None:
            out[v] = sha
    return out


def fetch_dir(store: Store, files: dict[str, str], revision: str | None, dest: Path) -> Path:
    """Copy repo files (repo path → local file name) at ``revision`` (a commit id: ``layout.check_commit_id``) into
    ``dest`` (cached per revision); the store's own cached copies are then evicted (``hubgrpo.store.cache``):
    ``dest`` is the one copy kept."""
    revision = layout.check_commit_id(revision)  # (None, an empty repo's head, is refused here)
    if dest.is_dir():  # only ever created by the atomic rename below, so it is complete
        os.utime(dest)  # most recently used (``prune_revisions``)
        return dest
    tmp = dest.with_name(dest.name + f".tmp-{uuid.uuid4().hex[:8]}")
    tmp.mkdir(parents=True, exist_ok=True)
    try:
        for repo_path, name in files.items():
            _copy(store, repo_path, revision, tmp / name)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    evict(store, list(files), revision)
    try:
        tmp.rename(dest)
    except OSError:  # another process won the race: use its copy
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _copy(store: Store, repo_path: str, revision: str, target: Path, tries: int = 3) -> None:
    """Copy one cached file; a cached copy evicted meanwhile by another reader is fetched again."""
    for attempt in range(tries):
        try:
            shutil.copyfile(store.local_path(repo_path, revision), target)
            return
        except FileNotFoundError:
            if attempt == tries - 1:
                raise


def inside(path: Path, root: Path) -> bool:
    """Whether ``path`` (resolved: through '..' and every symlink) lies inside ``root`` (resolved)."""
    return Path(os.path.realpath(path)).is_relative_to(os.path.realpath(root))


def remove_tree(path: Path, root: Path) -> None:
    """Delete the folder ``path``, which must lie inside ``root`` and not be a symlink (``InvalidPath`` otherwise:
    nothing outside a cache root is ever deleted, whatever named the folder). Missing: nothing to do."""
    if path.is_symlink():
        raise InvalidPath(f"refusing to delete {path}: it is a symlink", hint="hubgrpo only deletes what it made")
    if not inside(path, root):
        raise InvalidPath(
            f"refusing to delete {path}: it is outside {root}", hint="hubgrpo only deletes inside its own cache folders"
        )
    shutil.rmtree(path, ignore_errors=True)  # rmtree never follows the symlinks inside the tree


def prune_revisions(
    parent: Path, keep: int, *, root: Path | None = None, protect: frozenset[str] = frozenset()
) -> None:
    """Delete all but the ``keep`` most recently used revision folders under ``parent`` (``fetch_dir``'s cache),
    which must lie inside ``root`` (default ``parent`` itself), and never those named in ``protect`` (in use);
    symlinks are never followed nor deleted."""
    root = parent if root is None else root
    if not inside(parent, root):
        raise InvalidPath(
            f"refusing to prune {parent}: it is outside {root}",
            hint="hubgrpo only deletes inside its own cache folders",
        )
    if not parent.is_dir():
        return
    folders = sorted(
        (p for p in parent.iterdir() if not p.is_symlink() and p.is_dir() and ".tmp-" not in p.name),
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    for old in folders[keep:]:
        if old.name not in protect:
            remove_tree(old, parent)


def adapter_at(store: Store, revision: str, cache: Path | None = None) -> Path:
    """A local PEFT folder with the global adapter at ``revision`` (a commit id: it names the cached folder)."""
    layout.check_commit_id(revision)
    cache = cache or cache_root() / "adapters"
    key = "".join(c if c.isalnum() else "_" for c in f"{store.location}")[-80:]
    files = {f: f for f in layout.ADAPTER_FILES}
    return fetch_dir(store, files, revision, cache / key / revision)


def submission_at(
    store: Store, base_version: int, sub_id: str, revision: str, dest: Path, *, sizes: dict[str, int] | None = None
) -> Path:
    """Copy one submission folder at ``revision`` into ``dest`` (every file in it, for admission checks).
    ``sizes``: the folder's listing ({repo path: size}, ``Store.file_sizes``) the caller already checked."""
    prefix = layout.submission_dir(base_version, sub_id)
    names = sorted(sizes) if sizes is not None else store.list_files(prefix, revision)
    if not names:
        raise NotFound(
            f"no submission at {prefix} in {store.location} at revision {revision[:12]}",
            hint="push the submission commit before calling submit",
        )
    files = {p: p[len(prefix) + 1 :].replace("/", "__") for p in names}
    return fetch_dir(store, files, revision, dest)
