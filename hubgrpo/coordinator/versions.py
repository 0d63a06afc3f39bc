"""The coordinator's recent versions on its own disk, by version and adapter id: what the ``adapter`` route serves
(workers download the version they leased, and rebasing rounds the newer ones, without a commit of the run repo)
and what a checkpoint commits.

A version's folder (``<root>/<version>-<adapter id>/``) holds ``adapter_model.safetensors`` and
``adapter_config.json`` exactly as rendered once by the merge; its id is ``layout.adapter_id`` of those bytes, so a
worker checks what it downloaded. Folders appear by an atomic rename (never half-written) and the oldest leave once
no lease may be based on them any more (``evict``). A checkpointed version that left is read again from its tag.
"""

from __future__ import annotations

import shutil
import threading
import uuid
from pathlib import Path

from hubgrpo import layout

FILES = (layout.ADAPTER_WEIGHTS, layout.ADAPTER_CONFIG)


class VersionCache:
    """Folders of recent versions under ``root`` (the coordinator's workdir); thread-safe."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._dirs: dict[int, tuple[str, Path]] = {}  # version → (adapter id, folder)

    def put(self, version: int, files: dict[str, bytes | Path]) -> str:
        """Keep ``files`` (the two adapter files: bytes or paths) as ``version``; returns its adapter id."""
        data = {name: files[name] if isinstance(files[name], bytes) else Path(files[name]).read_bytes()
                for name in FILES}
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

    def evict(self, keep: set[int], below: int) -> int:
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
