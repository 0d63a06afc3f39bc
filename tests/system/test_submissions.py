"""``hub.submissions``: rounds in an inbox (a local folder, an S3 bucket on loopback) instead of commits of the run repo —
no commit per round, the budget left to merges, presigned uploads for workers without bucket credentials, and
every inbox folder checked as strictly as a repo folder (before anything is read)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import parse_qsl

import httpx
import pytest

from hubgrpo import layout, runrepo
from hubgrpo.coordinator.core import Coordinator
from hubgrpo.coordinator.repo_init import init_repo
from hubgrpo.errors import InvalidSubmission, Refused
from hubgrpo.store.local import LocalStore
from hubgrpo.worker.delivery import deliver
from tests.support.coord_helpers import FakeClock, make_config, round_folder, write_adapter

SECRET = b"test-secret"
ROOT = Path(__file__).resolve().parents[2]


def _setup(tmp_path, inbox: str, **overrides):
    cfg = make_config(**{"hub.submissions": inbox, **overrides})
    store = LocalStore(tmp_path / "repo")
    clock = FakeClock()
    init_repo(store, cfg, write_adapter(tmp_path / "v0", seed=0, b_scale=0.0), clock=clock)
    return store, Coordinator(store, SECRET, clock=clock, workdir=tmp_path / "work"), clock


@pytest.mark.timeout(120)
def test_rounds_in_a_folder_inbox_cost_no_commit(tmp_path):
    inbox = str(tmp_path / "inbox")
    store, c, clock = _setup(tmp_path, inbox, **{"coordinator.commit_budget_per_hour": 3, "merge.quorum": 2})
    leases = [c.lease(f"w{i}") for i in range(3)]  # in the repo, the 2nd lease would be over this budget
    tokens = [deliver(inbox, lease, round_folder(store, lease, tmp_path, seed=i + 1)) for i, lease in enumerate(leases)]
    assert all(t.startswith("sha256:") for t in tokens)
    assert c.submit(leases[0], tokens[0])["status"] == "admitted"
    assert c.submit(leases[1], tokens[1])["status"] == "merged"
    assert [h.message.split(" (")[0] for h in store.history()][:1] == ["hubgrpo: version 1"]
    assert len(store.history()) == 2 and store.list_files(layout.SUBMISSIONS) == []  # init + one merge, no rounds
    assert c.status()["commits_last_hour"] == 2
    clock.advance(c.cfg.coordinator.scan_interval_s + 1)  # the third round was uploaded but never submitted
    c.housekeeping()
    assert layout.submission_id("w2", leases[2].lease_id) in c.pending
    more = [c.lease(f"x{i}") for i in range(4)]  # a round in an inbox costs no commit: the budget refuses no lease
    assert len({lease.lease_id for lease in more}) == 4


@pytest.mark.timeout(120)
def test_hostile_inbox_folders_are_refused(tmp_path):
    from hubgrpo.store.inboxes import open_inbox

    inbox = str(tmp_path / "inbox")
    store, c, _ = _setup(tmp_path, inbox)
    lease = c.lease("extra")  # a worker that writes more than its files
    token = deliver(inbox, lease, round_folder(store, lease, tmp_path, seed=2))
    sub_dir = layout.submission_dir(lease.base_version, layout.submission_id("extra", lease.lease_id))
    open_inbox(inbox).put(f"{sub_dir}/notes.txt", b"hi")
    with pytest.raises(InvalidSubmission) as err:
        c.submit(lease, token)
    assert err.value.code == "unexpected_file"
    lease = c.lease("huge")
    token = deliver(inbox, lease, round_folder(store, lease, tmp_path, seed=3, mutate=lambda f: (
        f / layout.ADAPTER_WEIGHTS).write_bytes(b"\0" * (12 << 20))))
    with pytest.raises(InvalidSubmission) as err:
        c.submit(lease, token)
    assert err.value.code == "too_large" and "nothing was read" in err.value.message
    lease = c.lease("liar")
    deliver(inbox, lease, round_folder(store, lease, tmp_path, seed=4))
    with pytest.raises(InvalidSubmission) as err:
        c.submit(lease, "sha256:" + "0" * 64)  # not the record it uploaded
    assert err.value.code == "bad_commit"
    lease = c.lease("linker")
    sub_dir = Path(inbox) / layout.submission_dir(lease.base_version, layout.submission_id("linker", lease.lease_id))
    folder = round_folder(store, lease, tmp_path, seed=5)
    sub_dir.mkdir(parents=True)
    for name in layout.SUBMISSION_FILES:
        os.symlink(folder / name, sub_dir / name)  # a link is never followed: the folder looks empty
    with pytest.raises(InvalidSubmission) as err:
        c.submit(lease, layout.inbox_token((folder / layout.SUBMISSION_FILE).read_bytes()))
    assert err.value.code == "not_found"
    assert {r.code for r in c.new_refusals} == {"unexpected_file", "too_large", "bad_commit", "not_found"}


@pytest.mark.timeout(60)
def test_uploads_through_the_space_go_to_the_inbox(tmp_path):
    """A worker without write access uploads to the coordinator (`--upload-via coordinator`): with an inbox, the
    checked folder goes into the inbox, not into a batch commit of the run repo."""
    import base64

    from hubgrpo.space.upload import Uploads
    from hubgrpo.store.inboxes import open_inbox

    inbox = str(tmp_path / "inbox")
    store, c, _ = _setup(tmp_path, inbox)
    uploads = Uploads(c, batch_size=1, batch_wait_s=0.0, workdir=tmp_path / "uploads")
    try:
        lease = c.lease("bob")
        folder = round_folder(store, lease, tmp_path, seed=1)
        files = {n: base64.b64encode((folder / n).read_bytes()).decode() for n in layout.SUBMISSION_FILES}
        answer = uploads.handle(lease, files)
    finally:
        uploads.close()
    assert answer["status"] == "admitted" and answer["commit"] == layout.inbox_token(
        (folder / layout.SUBMISSION_FILE).read_bytes())
    assert len(store.history()) == 1 and len(open_inbox(inbox).list(layout.SUBMISSIONS)) == len(layout.SUBMISSION_FILES)


@pytest.mark.timeout(60)
def test_an_upload_whose_check_fails_with_any_error_leaves_no_bytes_behind(tmp_path, monkeypatch):
    """Not only a refused round: whatever error stops a check (here the adapter's read fails) removes the upload's
    folder, so a stream of failing uploads cannot fill the coordinator's disk."""
    import base64

    from hubgrpo.coordinator import admission
    from hubgrpo.space.upload import Uploads

    store = LocalStore(tmp_path / "repo")
    init_repo(store, make_config(), write_adapter(tmp_path / "v0", seed=0, b_scale=0.0), clock=FakeClock())
    c = Coordinator(store, SECRET, workdir=tmp_path / "work")
    uploads = Uploads(c, batch_size=1, batch_wait_s=0.0, workdir=tmp_path / "uploads")
    real = admission.check_local

    def failing(*args, **kwargs):
        real(*args, **kwargs)  # every check passes, then the disk fails
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(admission, "check_local", failing)
    try:
        lease = c.lease("bob")
        folder = round_folder(store, lease, tmp_path, seed=1)
        files = {n: base64.b64encode((folder / n).read_bytes()).decode() for n in layout.SUBMISSION_FILES}
        with pytest.raises(OSError):
            uploads.handle(lease, files)
    finally:
        uploads.close()
    assert list((tmp_path / "uploads").iterdir()) == []


@pytest.mark.timeout(180)
def test_s3_inbox_presigned_uploads_through_the_api(tmp_path, s3_bucket_url):
    """Leases over HTTP carry presigned upload URLs (POST forms capped in size: tests/integration/test_boxes_hostile.py);
    plain HTTP delivers the round; a file over its cap is refused."""
    from hubgrpo.space.api import serve
    from hubgrpo.store.inboxes import open_inbox
    from hubgrpo.worker.client import CoordinatorClient

    inbox = f"{s3_bucket_url}/subs"
    store, c, _ = _setup(tmp_path, inbox)
    app, url = serve(c)
    try:
        client = CoordinatorClient(url, retries=1)
        leases = [client.lease(f"w{i}") for i in range(2)]
        urls = leases[0].uploads
        assert sorted(urls) == sorted(layout.SUBMISSION_FILES) and all("x-amz-signature=" in u for u in urls.values())
        assert all(os.environ["AWS_SECRET_ACCESS_KEY"] not in u for u in urls.values())
        assert "uploads" not in str(c.status()["leases"])
        renewed = client.heartbeat(leases[0])
        assert renewed.uploads and renewed.deadline >= leases[0].deadline
        answers = []
        for i, lease in enumerate(leases):
            folder = round_folder(store, lease, tmp_path, seed=i + 1)
            token = deliver(inbox, lease, folder)
            answers.append(client.submit(lease, token)["status"])
        assert answers == ["admitted", "admitted"]
        action, _, form = urls[layout.SUBMISSION_FILE].partition("#")
        r = httpx.post(action, data=dict(parse_qsl(form)), files={"file": ("x", b"{" * ((8 << 20) + 1))})
        assert r.status_code == 400 and "EntityTooLarge" in r.text  # the record's cap: 8 MiB
        listed = open_inbox(inbox).list(layout.SUBMISSIONS)
        assert len(listed) == 2 * len(layout.SUBMISSION_FILES) and store.list_files(layout.SUBMISSIONS) == []
    finally:
        app.close()


@pytest.mark.timeout(600)
def test_a_run_with_submissions_on_s3_and_workers_without_credentials(tmp_path, s3_bucket_url, hub_emulator,
                                                                      monkeypatch):
    """The run repo on the Hub (emulator), rounds in an S3 bucket (moto): 2 `hubgrpo worker` processes with no AWS
    credentials at all deliver through presigned URLs; the Hub gets checkpoints only (here: the final version)."""
    from hubgrpo.cli.embedded import ensure_repo
    from hubgrpo.config import load_config
    from hubgrpo.space.api import serve
    from hubgrpo.store.inboxes import open_inbox
    from hubgrpo.store.hub import HubStore
    from tests.support.chaos_helpers import wait_for
    from tests.conftest import TEST_TOKEN

    inbox = f"{s3_bucket_url}/subs"
    cfg = load_config(ROOT / "configs" / "tiny.yaml", overrides=[
        "rounds.steps=2", "rounds.versions=2", "merge.quorum=2", "coordinator.heartbeat_interval_s=1",
        "coordinator.checkpoint_every_s=3600", f"hub.submissions={inbox}"])  # no checkpoint mid-run, however slow
    store = HubStore("alice/s3subs", token=TEST_TOKEN, endpoint=hub_emulator.url)
    store.create()
    ensure_repo(store, cfg)
    coord = Coordinator(store, SECRET, workdir=tmp_path / "coord")
    app, url = serve(coord)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(OMP_NUM_THREADS="1", HF_ENDPOINT=hub_emulator.url, HF_TOKEN=TEST_TOKEN,
               HUBGRPO_CACHE=str(tmp_path / "worker-cache"))
    procs = [subprocess.Popen([sys.executable, "-m", "hubgrpo.cli", "worker", "--repo", "alice/s3subs",
                               "--coordinator", url, "--name", f"w{i}", "--threads", "1", "--quiet"],
                              env=env, cwd=str(tmp_path), start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=open(tmp_path / f"w{i}.log", "wb"))
             for i in range(2)]
    try:
        wait_for(lambda: coord.state.finished, 400, "the run to finish")
        wait_for(lambda: runrepo.read_state(store).version == 2, 60, "the final checkpoint")
        for p in procs:
            p.wait(timeout=60)
        assert all(p.returncode == 0 for p in procs), [(tmp_path / f"w{i}.log").read_text()[-2000:] for i in range(2)]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        app.close()
    state = runrepo.read_state(store)
    assert state.version == 2 and len(state.merged_ids) == len(set(state.merged_ids)) >= 4
    messages = [h.message for h in store.history()]
    assert not [m for m in messages if "submission" in m and "version" not in m], messages
    assert sum(m.startswith("hubgrpo: version ") for m in messages) == 1  # version 1 lived at the coordinator only
    rounds = {layout.parse_submission_path(p)[1] for p, _ in open_inbox(inbox).list(layout.SUBMISSIONS)}
    assert set(state.merged_ids) <= rounds and store.list_files(layout.SUBMISSIONS) == []
    from hubgrpo.space.view import leaderboard_rows, version_rows

    status = coord.status()
    rows = version_rows(status, runrepo.version_shas(store), store)
    assert [r[0] for r in rows if f"{hub_emulator.url}/alice/s3subs/commit/" in r[-1]] == [2, 0]  # checkpoints
    assert [r[0] for r in rows if r[-1] == "-"] == [1]  # the Space's version links
    board = leaderboard_rows(status)  # a worker that started late may find every round taken: not both, always
    assert board and {row[0] for row in board} <= {"w0", "w1"}, board
    assert sum(row[2] for row in board) >= len(state.merged_ids), board  # every merged round credited
