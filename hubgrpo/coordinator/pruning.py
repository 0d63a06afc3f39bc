"""Bounded storage: which submission folders leave the head of the run repo with a merge commit.

``coordinator.keep_submissions`` = K (default 2): a merge commit producing version N also deletes, from the head,
the folders ``submissions/<base>/<id>/`` of

- submissions merged into a version older than the last K (version ≤ N − K);
- refused submissions, once their refusal is older than the last K versions;
- folders nobody submitted (a crashed worker, junk) whose base version is so old that they could never be
  admitted again (lease older than ``merge.lease_age_limit()`` versions: ``merge.max_staleness``, the most
  ``merge.staleness_per_worker`` can raise it to, or ``merge.max_lease_age`` with ``merge.rebase``) and older
  than the last K versions.

The history keeps every deleted folder until it is reclaimed (``hubgrpo gc``). ``None`` keeps everything.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hubgrpo import layout
from hubgrpo.layout import RunState

if TYPE_CHECKING:
    from hubgrpo.config import Config
    from hubgrpo.store.base import Store


def merge_deletes(store: Store, cfg: Config, state: RunState, head: str | None) -> list[str]:
    """The folder deletes of the commit writing ``state`` on top of ``head`` (``coordinator.keep_submissions``)."""
    return deletes(store, head, state, cfg.coordinator.keep_submissions, cfg.merge.lease_age_limit())


def deletes(store, head: str | None, state: RunState, keep: int | None, max_age: int) -> list[str]:
    """Folder deletes (ending in '/') for the merge commit that writes ``state`` on top of ``head`` (a store
    read: call without the coordinator's lock)."""
    if keep is None:
        return []
    folders = set()
    for path in store.list_files(layout.SUBMISSIONS, head):
        parts = path.split("/")
        if len(parts) >= 4 and parts[1].isdigit():  # submissions/<base>/<id>/…, whatever is inside
            folders.add((parts[1], parts[2]))
    return [f"{layout.SUBMISSIONS}/{base}/{sub_id}/" for base, sub_id in doomed(folders, state, keep, max_age)]


def doomed(folders, state: RunState, keep: int, max_age: int) -> list[tuple[str, str]]:
    """The (base, submission id) folders, of ``folders``, that go with the version of ``state`` (the rule above;
    the same for folders in a submissions inbox, ``hubgrpo.coordinator.inbox``)."""
    oldest_kept = state.version - keep + 1  # folders tied to this version or newer stay
    tied = {r.submission_id: r.version for r in state.refused}
    tied.update({m.submission_id: v.version for v in state.versions for m in v.merged})
    out = []
    for base, sub_id in sorted(folders):
        version = tied.get(sub_id)
        hopeless = version is None and state.version - int(base) > max_age and int(base) < oldest_kept
        if (version is not None and version < oldest_kept) or hopeless:
            out.append((base, sub_id))
    return out
