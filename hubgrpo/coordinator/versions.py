"""The coordinator's recent versions on its own disk, by version and adapter id: what the ``adapter`` route serves
(workers download the version they leased, and rebasing rounds the newer ones, without a commit of the run repo)
and what a checkpoint commits.

A version's folder (``<root>/<version>-<adapter id>/``) holds ``adapter_model.safetensors`` and
``adapter_config.json`` exactly as rendered once by the merge; its id is ``layout.adapter_id`` of those bytes, so a
worker checks what it downloaded. Folders appear by an atomic rename (never half-written) and the oldest leave once
no lease may be based on them any more (``evict``). A checkpointed version that left is read again from its tag.
``VersionsMixin`` is the coordinator's side: its lineage of ids, the adapters it reads, what the route serves.
"""

from __future__ import annotations

import shutil
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, cast

from hubgrpo import layout, runrepo
from hubgrpo.coordinator import admission, checkpoint, workdir
from hubgrpo.errors import CoordinatorError, InvalidSubmission, MergeError, NotFound, RateLimited, StoreUnavailable

if TYPE_CHECKING:
    from hubgrpo.config import Config
    from hubgrpo.coordinator.checkpoint import Checkpoint
    from hubgrpo.coordinator.core import Coordinator
    from hubgrpo.layout import RunState
    from hubgrpo.store.base import Store

FILES = (layout.ADAPTER_WEIGHTS, layout.ADAPTER_CONFIG)


class VersionCache:
    """Folders of recent versions in this process's own folder under ``root`` (``hubgrpo.coordinator.workdir``:
    folders that coordinators now gone left there are deleted first); thread-safe."""

    def __init__(self, root: Path):
        self.cleared = workdir.clear_dead(Path(root))  # what coordinators that are gone left there
        self.root, self._owner = workdir.own_folder(Path(root))  # this process's own, locked while it lives
        self._lock = threading.Lock()
        self._dirs: dict[int, tuple[str, Path]] = {}  # version → (adapter id, folder)

    def close(self) -> None:
        """At the coordinator's end: its folder goes (nothing reads a gone process's versions: a restart starts
        from the last checkpoint, as it would from a killed one), then its lock. Also a ``.new-`` folder that could
        not be locked, which no later coordinator would delete."""
        shutil.rmtree(self.root, ignore_errors=True)
        if self._owner is not None:
            workdir.release(self.root, self._owner)
            self._owner = None

    def put(self, version: int, files: dict[str, bytes | Path]) -> str:
        """Keep ``files`` (the two adapter files: bytes or paths) as ``version``; returns its adapter id."""
        data = {name: _blob(files[name]) for name in FILES}
        aid = layout.adapter_id(data[layout.ADAPTER_WEIGHTS], data[layout.ADAPTER_CONFIG])
        dest = self.root / f"{int(version)}-{aid}"
        if not dest.is_dir():
            tmp = self.root / f".tmp-{uuid.uuid4().hex}"
            tmp.mkdir()
            for name, blob in data.items():
                (tmp / name).write_bytes(blob)
            try:
                tmp.rename(dest)
            except OSError:  # another thread put the same version first: same bytes
                shutil.rmtree(tmp, ignore_errors=True)
        with self._lock:
            old = self._dirs.get(int(version))
            self._dirs[int(version)] = (aid, dest)
        if old is not None and old[1] != dest:  # the version was made again (after a reload): the old one is gone
            shutil.rmtree(old[1], ignore_errors=True)
        return aid

    def get(self, version: int, aid: str) -> Path | None:
        """The folder of ``version`` if it is here with id ``aid``."""
        with self._lock:
            found = self._dirs.get(int(version))
        if found is None or found[0] != aid or not found[1].is_dir():
            return None
        return found[1]

    def path(self, version: int) -> Path | None:
        """The folder of ``version`` whatever its id (the coordinator's own reads)."""
        with self._lock:
            found = self._dirs.get(int(version))
        return found[1] if found is not None and found[1].is_dir() else None

    def evict(self, keep: set[int | None], below: int) -> int:
        """Remove the versions older than ``below`` that are not in ``keep``; how many left."""
        with self._lock:
            gone = [(v, d) for v, (_, d) in self._dirs.items() if v < below and v not in keep]
            for v, _ in gone:
                del self._dirs[v]
        for _, d in gone:
            shutil.rmtree(d, ignore_errors=True)
        return len(gone)

    def forget_after(self, version: int) -> None:
        """Drop every version newer than ``version`` (a reload from an older checkpoint: they are lost)."""
        with self._lock:
            gone = [(v, d) for v, (_, d) in self._dirs.items() if v > version]
            for v, _ in gone:
                del self._dirs[v]
        for _, d in gone:
            shutil.rmtree(d, ignore_errors=True)

    def versions(self) -> list[int]:
        with self._lock:
            return sorted(self._dirs)


class AdapterCache:
    """The global adapters in memory, by version (thread-safe): what admission and merges read most. One read per
    version at a time (``get``): concurrent callers (submits checked in parallel) wait for it instead of
    downloading into, and deleting, the same folder."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._adapters: dict[int, object] = {}
        self._loading: dict[int, threading.Lock] = {}  # one read per version at a time

    def get(self, version: int, read: Callable[[int], object]):
        """The adapter of ``version``, from memory or ``read(version)`` (which ``put``s it; no lock held)."""
        with self._lock:
            cached = self._adapters.get(version)
            loading = self._loading.setdefault(version, threading.Lock())
        if cached is not None:
            return cached
        with loading:  # only callers that need this very adapter wait (a store read on a miss)
            with self._lock:
                cached = self._adapters.get(version)
            return cached if cached is not None else read(version)

    def put(self, version: int, adapter, *, drop_below: int, keep: int | None = None) -> None:
        """Keep ``adapter`` as ``version``; the versions older than ``drop_below`` leave memory (but ``keep``)."""
        with self._lock:
            self._adapters[version] = adapter
            for old in [v for v in self._adapters if v < drop_below and v != keep]:
                del self._adapters[old]
                self._loading.pop(old, None)

    def retain(self, keep: Callable[[int], bool]) -> None:
        """Forget every version for which ``keep(version)`` is False."""
        with self._lock:
            self._adapters = {v: a for v, a in self._adapters.items() if keep(v)}

    def clear(self) -> None:
        with self._lock:
            self._adapters.clear()

    def __contains__(self, version: object) -> bool:
        return version in self._adapters

    def __len__(self) -> int:
        return len(self._adapters)


def _blob(value: bytes | Path) -> bytes:
    """A file's bytes, given as bytes or as the path of a file."""
    return value if isinstance(value, bytes) else Path(value).read_bytes()


class VersionsMixin:
    """The coordinator's versions by number and adapter id (``Coordinator`` inherits it): its lineage as loaded
    from the repo, the adapters it reads (memory, the version cache, a checkpoint's tag), what the ``adapter``
    route serves, and what leaves the cache."""

    state: RunState
    cfg: Config
    store: Store
    scratch: Path
    clock: Callable[[], float]
    versions: VersionCache
    adapters: AdapterCache
    ids: dict[int, str]
    shas: dict[int, str]
    checkpoint: Checkpoint
    checkpointing: int | None

    def _coordinator(self) -> Coordinator:
        """``self`` as the ``Coordinator`` that inherits this mixin (for the functions that take one)."""
        return cast("Coordinator", self)

    def _adopt_lineage(self, repo: dict) -> None:
        """The adapter ids of the versions a loaded state.json knows, the checkpoint's adapter in the version cache
        (its id computed from the committed bytes), and the checkpoint itself; versions newer than it are gone."""
        version, now = self.state.version, self.clock()
        self.versions.forget_after(version)
        self.ids = {r.version: r.adapter_id for r in self.state.versions if r.adapter_id and r.version < version}
        self.ids[version] = self.versions.put(
            version, {n: repo["adapter"] / n for n in (layout.ADAPTER_WEIGHTS, layout.ADAPTER_CONFIG)}
        )
        shutil.rmtree(repo["download"], ignore_errors=True)  # the version cache holds its copy
        at = repo.get("head_at")
        self.checkpoint = checkpoint.Checkpoint(
            version=version, sha=repo["head"], at=min(at, now) if at is not None else now
        )

    def global_adapter(self):
        """The adapter of the current version (``adapter``)."""
        return self.adapter(self.state.version)

    def adapter(self, version: int):
        """The global adapter of ``version`` (in memory, ``adapters``; a miss reads the version cache or its tag —
        a store read: call without the lock). A read that fails is ``CoordinatorError("unavailable")``: the
        coordinator's own problem, which a worker waits out (not a verdict on its round)."""
        return self.adapters.get(version, self._read_adapter)

    def _read_adapter(self, version: int):
        from hubgrpo.merge import load_adapter_dir

        try:
            adapter = load_adapter_dir(self._version_folder(version))
        except (MergeError, StoreUnavailable, RateLimited) as e:
            raise CoordinatorError(
                f"the coordinator could not read version {version}'s adapter: {e.message}",
                code="unavailable",
                hint="submit again in a few seconds",
            ) from e
        self.adapters.put(
            version, adapter, drop_below=self.state.version - admission.staleness_limit(self._coordinator())
        )
        return adapter

    def _version_folder(self, version: int) -> Path:
        """The folder of ``version`` in the version cache, read from its checkpoint's tag when it left the cache
        (a store read); a version that was never checkpointed and is not in the cache was lost with a restart:
        rounds based on it are stale."""
        folder = self.versions.path(version)
        if folder is not None:
            return folder
        sha = self.shas.get(version)
        if sha is None:
            raise InvalidSubmission(
                "stale",
                f"version {version} is not available any more: it was merged after "
                f"the last checkpoint (v{self.checkpoint.version}) by a coordinator that "
                "restarted since",
                hint="lease again and train on the current version",
            )
        download = self.scratch / uuid.uuid4().hex  # a folder of its own per call: two threads reading the same
        fetched = runrepo.adapter_at(self.store, sha, download)  # evicted version never share one
        try:
            self.versions.put(version, {n: fetched / n for n in (layout.ADAPTER_WEIGHTS, layout.ADAPTER_CONFIG)})
        finally:
            shutil.rmtree(download, ignore_errors=True)
        folder = self.versions.path(version)
        assert folder is not None, "put() just stored it"
        return folder

    def loadable(self, version: int) -> bool:
        """Whether ``version``'s adapter can still be read: in the version cache, or at its checkpoint's tag."""
        return version in self.ids and (self.versions.path(version) is not None or version in self.shas)

    def serves(self, version: int) -> bool:
        """Whether the adapter route serves ``version``: one a lease may still be based on, or the last checkpoint
        (older ones are at their tags; a caller never makes the coordinator fetch and keep them)."""
        return (
            version == self.checkpoint.version or version >= self.state.version - self.cfg.merge.lease_age_limit() - 2
        )

    def version_dir(self, version: int, adapter_id: str) -> Path:
        """The folder (adapter_model.safetensors, adapter_config.json) of ``version`` with id ``adapter_id``: what
        the ``adapter`` route serves (a store read when only its checkpoint has it; call without the lock).
        ``NotFound`` for a version this coordinator does not have under that id."""
        if not isinstance(version, int) or self.ids.get(version) != adapter_id or not self.serves(version):
            raise NotFound(
                f"version {version} with adapter id {str(adapter_id)[:40]!r} is not a version of this "
                f"run's coordinator (now at v{self.state.version})",
                hint="lease again: the coordinator restarted, or the version is too old",
            )
        folder = self.versions.get(version, adapter_id)
        if folder is None:
            try:
                self._version_folder(version)
            except InvalidSubmission as e:
                raise NotFound(e.message, hint=e.hint) from None
            folder = self.versions.get(version, adapter_id)
        if folder is None:
            raise NotFound(f"version {version}'s adapter changed since it was leased", hint="lease again")
        return folder

    def checkpoints_inline(self) -> bool:
        """Whether every version is checkpointed right after its merge, in the merge's thread: commits are free
        (no hourly quota) and the interval is 0. Elsewhere the checkpoint thread takes the newest version when due
        (a 429 never holds a merge; versions merged meanwhile are not committed on their own)."""
        return checkpoint.interval_s(self._coordinator()) == 0 and not checkpoint.quota_bound(self.store)

    def evict_versions(self) -> None:
        """Versions no lease may be based on any more leave the version cache (the checkpoint stays)."""
        keep = self.cfg.merge.lease_age_limit() + 2
        self.versions.evict({self.checkpoint.version, self.checkpointing}, self.state.version - keep)
