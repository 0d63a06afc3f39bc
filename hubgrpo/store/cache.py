"""Forgetting local cached copies of repo files, so that long runs keep their disks bounded.

``HubStore`` reads files through the HF cache (``hf_hub_download``): one blob per file content, and one snapshot
entry per revision. hubgrpo copies what it keeps (adapters, submissions) into its own folders, so the cached copy
is dead weight; ``evict(store, paths, revision)`` removes the snapshot entries and their blobs. A blob shared with
another revision's entry goes too: that entry then dangles, and the next read of it downloads it again (callers
retry a copy whose source vanished, ``runrepo.fetch_dir``). Other stores keep no such cache: nothing to do.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path

log = logging.getLogger(__name__)


def evict(store, paths: Iterable[str], revision: str) -> int:
    """Remove the HF-cache copies of ``paths`` at ``revision`` (a commit sha) of a Hub store; returns the bytes
    freed (0 for a store without an HF cache)."""
    repo_id, repo_type = getattr(store, "repo_id", None), getattr(store, "repo_type", None)
    if repo_id is None or repo_type is None or not hasattr(store, "cache_dir"):
        return 0
    from huggingface_hub import constants, try_to_load_from_cache

    root = Path(os.path.realpath(store.cache_dir or constants.HF_HUB_CACHE))
    freed = 0
    for path in paths:
        try:
            cached = try_to_load_from_cache(
                repo_id, path, cache_dir=store.cache_dir, revision=revision, repo_type=repo_type
            )
        except ValueError:  # not a valid cache query (e.g. an odd revision): nothing cached for it
            continue
        if not isinstance(cached, str):
            continue
        freed += _unlink(Path(cached), root)
    return freed


def _unlink(entry: Path, root: Path) -> int:
    """Delete a snapshot entry and the blob it points to (both inside the cache ``root``: a link out of it is
    left alone); the bytes freed."""
    blob = Path(os.path.realpath(entry))
    if not (blob.is_relative_to(root) and Path(os.path.realpath(entry.parent)).is_relative_to(root)):
        log.warning("not evicting %s: it leads outside the cache %s", entry, root)
        return 0
    size = 0
    try:
        size = blob.stat().st_size
        if blob != entry:
            blob.unlink()
        entry.unlink()
    except FileNotFoundError:  # another thread or process evicted it first
        pass
    except OSError as e:  # best effort: a cache that cannot be trimmed is not an error
        log.debug("could not evict %s: %s", entry, e)
    return size
