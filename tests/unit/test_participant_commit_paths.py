"""A participant's commit id never names a folder on the coordinator (found while fixing the worker's side of
issue 35): the coordinator copied a submission into ``work/submissions/<sub>-<commit[:12]>``, so a submit with the
commit ``sha256:../../../../`` made a folder ``<sub>-..`` on the first try, and on the second the copy "found" the
coordinator's own folders through it, checked them, and deleted them."""

from __future__ import annotations

import pytest

from hubgrpo import layout
from hubgrpo.coordinator.core import Coordinator
from hubgrpo.coordinator.repo_init import init_repo
from hubgrpo.errors import HubGrpoError
from hubgrpo.store.inboxes import open_inbox
from hubgrpo.store.local import LocalStore
from tests.support.coord_helpers import FakeClock, make_config, submission_record, write_adapter, write_rollouts


@pytest.mark.timeout(60)
@pytest.mark.parametrize("inbox", ["inbox", "repo"])
def test_a_path_shaped_commit_never_reaches_the_coordinators_folders(tmp_path, inbox):
    overrides = {"hub.submissions": str(tmp_path / "inbox")} if inbox == "inbox" else {}
    store, clock = LocalStore(tmp_path / "repo"), FakeClock()
    init_repo(store, make_config(**overrides), write_adapter(tmp_path / "v0", seed=0), clock=clock)
    work = tmp_path / "home" / "coord" / "work"
    c = Coordinator(store, b"secret", clock=clock, workdir=work)
    for kept in (work / "state.keep", tmp_path / "home" / "coord" / "notes" / "keep.txt"):  # its and its owner's
        kept.parent.mkdir(parents=True, exist_ok=True)
        kept.write_text("keep")
    mine = {p.relative_to(tmp_path) for p in (tmp_path / "home").rglob("*")}
    lease = c.lease("w1")
    sub_id = layout.submission_id(lease.worker, lease.lease_id)
    folder = write_adapter(tmp_path / "round", seed=3, b_scale=0.01)
    write_rollouts(folder, lease)
    (folder / layout.SUBMISSION_FILE).write_bytes(submission_record(lease).to_json())
    if inbox == "inbox":
        inbox = open_inbox(str(tmp_path / "inbox"))
        for name in layout.SUBMISSION_FILES:
            inbox.put(layout.submission_path(lease.base_version, sub_id, name), folder / name)
        commit = "sha256:../../../../"
    else:
        store.commit({layout.submission_path(lease.base_version, sub_id, n): folder / n
                      for n in layout.SUBMISSION_FILES}, message="round")
        commit = "../../../../"
    for _ in range(2):
        with pytest.raises(HubGrpoError):
            c.submit(lease, commit)
    left = {p.relative_to(tmp_path) for p in (tmp_path / "home").rglob("*")}
    assert mine <= left, f"deleted: {sorted(map(str, mine - left))}"
