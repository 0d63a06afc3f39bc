"""The versions a simulation's rounds train from, as a worker gets them: from the coordinator, not the run repo.

A worker downloads the version it leased (``Coordinator.version_dir``: what the ``adapter`` route serves, no
commit) when it leases, and, rebasing, the newer ones as they appear. The simulation trains each round only when
it is delivered, later in real time, and by then the coordinator may have let the version leave its cache. So
every version is **pinned** when it is published: its two files hard-linked (copied where links fail) into the
simulation's own folder, and let go once no round still in flight can need it (older than every such round's
base and than the current version).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from hubgrpo import layout

if TYPE_CHECKING:
    from hubgrpo.coordinator.core import Coordinator

FILES = (layout.ADAPTER_WEIGHTS, layout.ADAPTER_CONFIG)


class PinnedVersions:
    """version → a folder of its adapter that stays until ``release`` lets it go."""

    def __init__(self, coord: Coordinator, root: Path):
        self.coord, self.root = coord, Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.dirs: dict[int, Path] = {}

    def pin(self, version: int) -> Path:
        """The folder of ``version`` (its adapter id from the coordinator's lineage), pinned."""
        if version in self.dirs:
            return self.dirs[version]
        src = self.coord.version_dir(version, self.coord.ids[version])
        dest = self.root / f"v{version:06d}"
        dest.mkdir(parents=True, exist_ok=True)
        for name in FILES:
            try:
                os.link(src / name, dest / name)
            except OSError:  # another filesystem, or no hard links: a copy
                shutil.copyfile(src / name, dest / name)
        self.dirs[version] = dest
        return dest

    def get(self, version: int) -> Path:
        return self.dirs.get(version) or self.pin(version)

    def release(self, oldest_needed: int) -> None:
        """Let go of every version older than ``oldest_needed``."""
        for v in [v for v in self.dirs if v < oldest_needed]:
            shutil.rmtree(self.dirs.pop(v), ignore_errors=True)
