"""The unmodified huggingface_hub client against the local Hub emulator, over real HTTP on 127.0.0.1.

These tests pin the emulator to what the client (huggingface_hub) expects: if one fails after a
huggingface_hub upgrade, the wire protocol changed and HubStore must be re-checked too.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx2
import pytest
from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi, hf_hub_download, snapshot_download
from huggingface_hub.errors import (
    EntryNotFoundError,
    HfHubHTTPError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils.sha import git_hash

from tests.conftest import TEST_TOKEN
from tests.support.hub_emulator import HubEmulator
from tests.support.hub_emulator_api import BUSY_MESSAGE

ROOT = Path(__file__).resolve().parents[2]
STALE = "The branch was updated since you opened this page. Please refresh and try again."


@pytest.fixture
def api(hub_emulator):
    client = HfApi(endpoint=hub_emulator.url, token=TEST_TOKEN)
    client.create_repo("alice/r", exist_ok=True)
    return client


def _add(path: str, data: bytes) -> CommitOperationAdd:
    return CommitOperationAdd(path_in_repo=path, path_or_fileobj=data)


@pytest.mark.timeout(30)
def test_create_repo_twice_whoami_and_delete(hub_emulator):
    client = HfApi(endpoint=hub_emulator.url, token=TEST_TOKEN)
    url = client.create_repo("alice/twice", private=True)
    assert str(url) == f"{hub_emulator.url}/alice/twice" and url.repo_id == "alice/twice"
    assert str(client.create_repo("alice/twice", exist_ok=True)) == str(url)  # read from the 409 body
    with pytest.raises(HfHubHTTPError) as info:
        client.create_repo("alice/twice")
    assert info.value.response.status_code == 409
    assert client.whoami()["name"] == "alice"
    with pytest.raises(HfHubHTTPError) as info:
        HfApi(endpoint=hub_emulator.url, token="hf_bad").whoami()
    assert info.value.response.status_code == 401
    assert client.repo_exists("alice/twice") and client.repo_info("alice/twice").private
    client.delete_repo("alice/twice")
    assert not client.repo_exists("alice/twice")


@pytest.mark.timeout(30)
def test_commits_downloads_and_snapshot(api, hub_emulator, tmp_path):
    first = api.upload_file(path_or_fileobj=b"hello", path_in_repo="a/b.txt", repo_id="alice/r",
                            commit_message="upload")
    info = api.create_commit("alice/r", [_add("README.md", b"---\nlicense: mit\n---\n# card\n"),
                                         _add("c.txt", b"c")], commit_message="card", commit_description="why")
    assert info.oid != first.oid and info.commit_url == f"{hub_emulator.url}/alice/r/commit/{info.oid}"
    with pytest.raises(ValueError, match="Invalid metadata in README.md"):
        api.create_commit("alice/r", [_add("README.md", b"---\n[: bad\n---\n")], commit_message="bad card")
    kw = dict(endpoint=hub_emulator.url, token=TEST_TOKEN, cache_dir=tmp_path)
    at_sha = hf_hub_download("alice/r", "a/b.txt", revision=info.oid, **kw)
    assert Path(at_sha).read_bytes() == b"hello" and info.oid in at_sha
    assert Path(hf_hub_download("alice/r", "c.txt", **kw)).read_bytes() == b"c"
    assert (tmp_path / "models--alice--r" / "refs" / "main").read_text() == info.oid
    snap = Path(snapshot_download("alice/r", **kw))
    assert snap.name == info.oid
    assert sorted(str(p.relative_to(snap)) for p in snap.rglob("*") if p.is_file()) == \
        [".gitattributes", "README.md", "a/b.txt", "c.txt"]
    assert api.list_repo_files("alice/r") == [".gitattributes", "README.md", "a/b.txt", "c.txt"]
    api.create_commit("alice/r", [CommitOperationDelete("a/")], commit_message="rm folder")
    assert api.list_repo_files("alice/r") == [".gitattributes", "README.md", "c.txt"]
    assert api.file_exists("alice/r", "c.txt") and not api.file_exists("alice/r", "a/b.txt")


@pytest.mark.timeout(30)
def test_unchanged_files_make_no_commit(api):
    first = api.create_commit("alice/r", [_add("x", b"1")], commit_message="x")
    again = api.create_commit("alice/r", [_add("x", b"1")], commit_message="same")  # preupload's oid matches
    assert again.oid == first.oid and len(api.list_repo_commits("alice/r")) == 2


@pytest.mark.timeout(30)
def test_refs_commits_tags_and_branches(tmp_path):
    with HubEmulator({TEST_TOKEN: "alice"}, commits_page_size=2, tree_page_size=3) as emu:
        client = HfApi(endpoint=emu.url, token=TEST_TOKEN)
        client.create_repo("alice/r")
        shas = [client.create_commit("alice/r", [_add(f"d/{i}.txt", b"%d" % i)], commit_message=f"c{i}",
                                     commit_description=f"body {i}").oid for i in range(4)]
        commits = client.list_repo_commits("alice/r")  # 5 commits over 3 pages
        assert [c.commit_id for c in commits[:4]] == shas[::-1] and commits[-1].title == "initial commit"
        assert commits[0].authors == ["alice"] and commits[0].message == "body 3" and commits[0].title == "c3"
        assert len(client.list_repo_files("alice/r")) == 5  # tree over 3 pages
        client.create_tag("alice/r", tag="v1", revision=shas[1])
        client.create_tag("alice/r", tag="v1", revision=shas[2], exist_ok=True)
        with pytest.raises(HfHubHTTPError) as info:
            client.create_tag("alice/r", tag="v1", revision=shas[2])
        assert info.value.response.status_code == 409
        client.create_branch("alice/r", branch="dev", revision=shas[0])
        refs = client.list_repo_refs("alice/r")
        assert {b.name: b.target_commit for b in refs.branches} == {"main": shas[3], "dev": shas[0]}
        assert [(t.name, t.target_commit) for t in refs.tags] == [("v1", shas[1])]
        assert client.list_repo_files("alice/r", revision="v1") == [".gitattributes", "d/0.txt", "d/1.txt"]
        path = hf_hub_download("alice/r", "d/1.txt", revision="v1", endpoint=emu.url, token=TEST_TOKEN,
                               cache_dir=tmp_path)
        assert Path(path).read_bytes() == b"1"
        client.delete_tag("alice/r", tag="v1")
        client.delete_branch("alice/r", branch="dev")
        assert client.list_repo_refs("alice/r").tags == []
        info = client.get_paths_info("alice/r", ["d", "d/2.txt", "nope"])
        assert [i.path for i in info] == ["d", "d/2.txt"]


@pytest.mark.timeout(30)
def test_stale_parent_commit_is_412(api):
    h1 = api.create_commit("alice/r", [_add("s", b"1")], commit_message="one").oid
    api.create_commit("alice/r", [_add("s", b"2")], commit_message="two", parent_commit=h1)
    with pytest.raises(HfHubHTTPError, match="branch was updated") as info:
        api.create_commit("alice/r", [_add("s", b"3")], commit_message="stale", parent_commit=h1)
    assert info.value.response.status_code == 412 and info.value.server_message == STALE


@pytest.mark.timeout(30)
def test_409_while_another_commit_is_applied(api, hub_emulator):
    hub_emulator.set_latency(1.5)
    done = []
    slow = threading.Thread(target=lambda: done.append(
        api.create_commit("alice/r", [_add("slow", b"s")], commit_message="slow")))
    slow.start()
    lock = hub_emulator.state.repos[("model", "alice/r")].commit_lock
    deadline = time.monotonic() + 10
    while not lock.locked() and time.monotonic() < deadline:  # the slow commit is being applied
        time.sleep(0.005)
    with pytest.raises(HfHubHTTPError) as info:
        api.create_commit("alice/r", [_add("fast", b"f")], commit_message="fast")
    slow.join(10)
    assert info.value.response.status_code == 409 and info.value.server_message == BUSY_MESSAGE
    assert done and api.list_repo_commits("alice/r")[0].title == "slow"
    assert hub_emulator.stats["busy_409"] == 1


@pytest.mark.timeout(30)
def test_not_found_errors_are_the_clients_types(api, hub_emulator, tmp_path):
    sha = api.create_commit("alice/r", [_add("a.txt", b"a")], commit_message="a").oid
    kw = dict(endpoint=hub_emulator.url, token=TEST_TOKEN, cache_dir=tmp_path)
    with pytest.raises(EntryNotFoundError):
        hf_hub_download("alice/r", "missing.txt", revision=sha, **kw)
    assert (tmp_path / "models--alice--r" / ".no_exist" / sha / "missing.txt").exists()  # X-Repo-Commit on 404
    with pytest.raises(RevisionNotFoundError):
        hf_hub_download("alice/r", "a.txt", revision="no-such-branch", **kw)
    with pytest.raises(RevisionNotFoundError):
        api.list_repo_commits("alice/r", revision="f" * 40)
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download("alice/none", "a.txt", **kw)
    with pytest.raises(RepositoryNotFoundError):
        api.repo_info("alice/none")
    with pytest.raises(EntryNotFoundError):
        api.create_commit("alice/r", [CommitOperationDelete("nope.txt")], commit_message="rm")


@pytest.mark.timeout(30)
def test_403_writing_to_someone_elses_namespace():
    with HubEmulator({"tok-a": "alice", "tok-b": "bob"}) as emu:
        alice, bob = HfApi(endpoint=emu.url, token="tok-a"), HfApi(endpoint=emu.url, token="tok-b")
        bob.create_repo("bob/public")
        bob.create_repo("bob/secret", private=True)
        for attempt in (lambda: alice.create_repo("bob/mine"),
                        lambda: alice.create_commit("bob/public", [_add("x", b"x")], commit_message="intrude"),
                        lambda: alice.create_tag("bob/public", tag="t")):
            with pytest.raises(HfHubHTTPError) as info:
                attempt()
            assert info.value.response.status_code == 403
        assert alice.list_repo_files("bob/public") == [".gitattributes"]  # reading a public repo is fine
        with pytest.raises(RepositoryNotFoundError):
            alice.list_repo_files("bob/secret")


@pytest.mark.timeout(30)
def test_resolve_headers_range_and_head_errors(api, hub_emulator):
    sha = api.create_commit("alice/r", [_add("dir/f.bin", bytes(range(100)))], commit_message="f").oid
    auth = {"authorization": f"Bearer {TEST_TOKEN}"}
    with httpx2.Client(base_url=hub_emulator.url, headers=auth) as http:
        head = http.head("/alice/r/resolve/main/dir/f.bin")
        assert head.status_code == 200 and head.content == b""
        assert head.headers["X-Repo-Commit"] == sha and head.headers["Content-Length"] == "100"
        assert head.headers["ETag"] == f'"{git_hash(bytes(range(100)))}"'
        part = http.get(f"/alice/r/resolve/{sha}/dir/f.bin", headers={"Range": "bytes=10-19"})
        assert part.status_code == 206 and part.content == bytes(range(10, 20))
        assert part.headers["Content-Range"] == "bytes 10-19/100"
        miss = http.head("/alice/r/resolve/main/nope")
        assert miss.status_code == 404 and miss.content == b"" and miss.headers["X-Error-Code"] == "EntryNotFound"
        assert http.head("/alice/r/resolve/zzz/dir/f.bin").headers["X-Error-Code"] == "RevisionNotFound"
        assert http.head("/alice/none/resolve/main/x").headers["X-Error-Code"] == "RepoNotFound"


@pytest.mark.timeout(30)
def test_injected_faults_as_the_client_sees_them(api, hub_emulator):
    hub_emulator.set_faults(ratelimit_reset_s=3, timeout_s=0.05)
    expected = {"429": 429, "409": 409, "500": 500, "lost-500": 500}
    for kind, status in expected.items():
        hub_emulator.fail_next(kind)
        with pytest.raises(HfHubHTTPError) as info:
            api.create_commit("alice/r", [_add(f"{kind}.txt", b"x")], commit_message=kind)
        assert info.value.response.status_code == status
        if kind == "429":
            assert info.value.response.headers["RateLimit"] == '"api";r=0;t=3'
    for kind in ("timeout", "lost-reset"):
        hub_emulator.fail_next(kind)
        with pytest.raises(httpx2.TransportError):
            api.create_commit("alice/r", [_add(f"{kind}.txt", b"x")], commit_message=kind)
    titles = [c.title for c in api.list_repo_commits("alice/r")]
    assert titles == ["lost-reset", "lost-500", "initial commit"]  # only "lost" faults apply the commit
    assert hub_emulator.stats["faults"] == {"429": 1, "409": 1, "500": 1, "lost": 2, "timeout": 1}


@pytest.mark.timeout(60)
def test_runs_as_a_subprocess_and_keeps_data(tmp_path):
    def serve():
        proc = subprocess.Popen([sys.executable, "-m", "tests.support.hub_emulator", "--port", "0", "--data",
                                 str(tmp_path / "data"), "--user", "tok=carol"], cwd=ROOT, stdout=subprocess.PIPE,
                                text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        return proc, proc.stdout.readline().strip()

    proc, url = serve()
    try:
        client = HfApi(endpoint=url, token="tok")
        client.create_repo("carol/kept")
        sha = client.create_commit("carol/kept", [_add("k.txt", b"kept")], commit_message="keep").oid
        client.create_tag("carol/kept", tag="v0", revision=sha)
    finally:
        proc.terminate()
        proc.wait(10)
    proc, url = serve()
    try:
        client = HfApi(endpoint=url, token="tok")
        assert client.list_repo_refs("carol/kept").tags[0].target_commit == sha
        path = hf_hub_download("carol/kept", "k.txt", revision=sha, endpoint=url, token="tok", cache_dir=tmp_path)
        assert Path(path).read_bytes() == b"kept"
    finally:
        proc.terminate()
        proc.wait(10)
