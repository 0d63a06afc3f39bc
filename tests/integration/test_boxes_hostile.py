"""Submission inboxes on a real S3 server (moto, over HTTP, through a counting proxy) against hostile contents and a
backend that does not keep its promises: junk records are read once, not at every scan; a backend that ignores
conditional writes is refused before anything relies on it; upload URLs bound what they let a worker write; inbox
objects of finished rounds are deleted like in-repo folders."""

from __future__ import annotations

import json
import re

import pytest

from hubgrpo import layout
from hubgrpo.coordinator.core import Coordinator
from hubgrpo.coordinator.repo_init import init_repo
from hubgrpo.errors import StoreError
from hubgrpo.store.local import LocalStore
from tests.support.coord_helpers import FakeClock, make_config, submission_record, write_adapter
from tests.support.s3_faults import Fault, proxy  # noqa: F401  (a fixture)

SECRET = b"test-secret"
JUNK_MB = 8


def _coordinator(tmp_path, inbox: str, clock=None, **overrides) -> Coordinator:
    cfg = make_config(**{"hub.submissions": inbox, **overrides})
    store = LocalStore(tmp_path / "repo")
    clock = clock or FakeClock()
    if not store.exists():
        init_repo(store, cfg, write_adapter(tmp_path / "v0", seed=0, b_scale=0.0), clock=clock)
    return Coordinator(store, SECRET, clock=clock, workdir=tmp_path / "work")


def _gets(proxy, start: int) -> tuple[int, int]:
    """(GET requests of inbox records, bytes they served) since ``proxy.answered[start]``."""
    got = [n for m, path, status, n in proxy.answered[start:] if m == "GET" and "/submissions/" in path
           and "list-type" not in path]
    return len(got), sum(got)


@pytest.mark.timeout(240)
def test_junk_records_in_an_s3_inbox_are_downloaded_once_not_at_every_scan(tmp_path, s3_bucket_url, proxy,
                                                                         monkeypatch):
    from hubgrpo.store.inboxes import open_inbox

    inbox = f"{s3_bucket_url}/subs"
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    c = _coordinator(tmp_path, inbox)
    objects = open_inbox(inbox)
    junk = (b"\x00not json" * (JUNK_MB << 17))[:JUNK_MB << 20]
    for i in range(20):  # unreadable records of 8 MiB (the largest record a scan reads): 160 MiB
        objects.put(layout.submission_path(0, f"junk{i}-l{i}", layout.SUBMISSION_FILE), junk)
    foreign = c.lease("victim")  # records that claim another round's lease: ignored, never admitted
    for i in range(2):
        objects.put(layout.submission_path(0, f"thief{i}-x{i}", layout.SUBMISSION_FILE),
                    submission_record(foreign).to_json())
    objects.put(layout.submission_path(0, "huge-h1", layout.SUBMISSION_FILE), b"{" * ((JUNK_MB << 20) + 1))
    per_scan = []
    for _ in range(3):
        start = len(proxy.answered)
        for prepared in c.scan():
            c.accept_quietly(prepared)
        per_scan.append(_gets(proxy, start))
    start = len(proxy.answered)
    restarted = Coordinator(c.store, SECRET, clock=c.clock, workdir=tmp_path / "work2")  # its first scan
    for prepared in restarted.scan():
        restarted.accept_quietly(prepared)
    after_restart = _gets(proxy, start)
    print(f"GETs and bytes per scan: {per_scan}; a restarted coordinator, two scans: {after_restart}")
    assert per_scan[0][0] == 22  # 20 junk + 2 foreign records, each read once
    assert not [p for m, p, *_ in proxy.answered if m == "GET" and "huge-h1" in p]  # over 8 MiB: never fetched
    assert per_scan[1:] == [(0, 0), (0, 0)]  # nothing downloaded twice
    assert after_restart[0] <= 22 and after_restart == per_scan[0]  # at most once more after a restart


@pytest.mark.timeout(120)
def test_an_s3_inbox_that_ignores_conditional_writes_is_refused_at_start(tmp_path, s3_bucket_url, proxy, monkeypatch):
    inbox = f"{s3_bucket_url}/subs"
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    proxy.add(Fault("PUT", r"/subs/", strip_conditions=True, times=10**6))
    with pytest.raises(StoreError) as err:
        _coordinator(tmp_path, inbox)
    assert err.value.code == "no_conditional_writes"
    assert "If-None-Match" in err.value.message and "overwrite" in err.value.message
    assert "MinIO" in err.value.hint or "AWS S3" in err.value.hint
    assert not [p for m, p, *_ in proxy.answered if m == "PUT" and re.search(r"/subs/submissions/", p)]


@pytest.mark.timeout(120)
def test_an_s3_run_repo_on_a_backend_without_conditional_writes_is_refused(tmp_path, s3_bucket_url, proxy):
    from hubgrpo.store.s3 import S3Store

    direct = S3Store(f"{s3_bucket_url}/repo", cache_dir=tmp_path / "direct")
    direct.create()
    base = direct.commit({"a.txt": b"0"}, message="base")
    proxy.add(Fault("PUT", r"/repo/", strip_conditions=True, times=10**6))
    lying = S3Store(f"{s3_bucket_url}/repo", endpoint_url=proxy.url, cache_dir=tmp_path / "lying")
    assert lying.read("a.txt") == b"0"  # reading needs no compare-and-swap
    with pytest.raises(StoreError) as err:
        lying.commit({"a.txt": b"1"}, message="would race", parent=base)
    assert err.value.code == "no_conditional_writes" and "compare-and-swap" in err.value.message
    assert direct.head() == base and direct.read("a.txt") == b"0"
    with pytest.raises(StoreError):
        lying.tag("v000001", base)
    assert "v000001" not in direct.tags()


@pytest.mark.timeout(120)
def test_the_conditional_write_probe_runs_once_per_store(tmp_path, s3_bucket_url, proxy):
    from hubgrpo.store.s3 import S3Store

    store = S3Store(f"{s3_bucket_url}/repo", endpoint_url=proxy.url, cache_dir=tmp_path / "c")
    store.create()
    for i in range(3):
        store.commit({"a.txt": str(i).encode()}, message=f"c{i}")
    probes = [p for m, p, *_ in proxy.answered if m == "PUT" and "probe" in p]
    assert len(probes) == 2  # two PUTs of one probe object, for three commits
    assert not [k for k, _ in store.objects.list("") if "probe" in k]  # and it was deleted


@pytest.mark.timeout(240)
def test_upload_urls_bound_what_a_worker_can_write(tmp_path, s3_bucket_url):
    """Leases over HTTP carry presigned POST forms whose policy caps each file (content-length-range): a worker's
    round goes in and is admitted, one byte over the cap is refused by the store (400 EntityTooLarge) and
    nothing is written."""
    import httpx

    from hubgrpo.coordinator.admission import submission_limit
    from hubgrpo.errors import StoreError as DeliveryError
    from hubgrpo.space.api import serve
    from hubgrpo.store.inboxes import open_inbox
    from hubgrpo.worker.client import CoordinatorClient
    from hubgrpo.worker.delivery import deliver
    from tests.support.coord_helpers import round_folder

    inbox = f"{s3_bucket_url}/subs"
    c = _coordinator(tmp_path, inbox)
    app, url = serve(c)
    try:
        client = CoordinatorClient(url, retries=1)
        lease = client.lease("w0")
        limit = submission_limit(c, lease)
        caps = {}
        for name, upload in lease.uploads.items():
            base, fields = _post_fields(upload)
            assert base.startswith("http://127.0.0.1:") and "key" in fields and "x-amz-signature" in fields
            ranges = [cond for cond in _policy(fields)["conditions"] if isinstance(cond, list)
                      and cond[0] == "content-length-range"]
            assert len(ranges) == 1 and ranges[0][1] == 1
            caps[name] = ranges[0][2]
        assert caps[layout.ADAPTER_WEIGHTS] == limit and caps[layout.SUBMISSION_FILE] <= min(limit, 8 << 20)
        base, fields = _post_fields(lease.uploads[layout.ADAPTER_WEIGHTS])
        over = httpx.post(base, data=fields, files={"file": ("x", b"\0" * (limit + 1))})
        assert over.status_code == 400 and "EntityTooLarge" in over.text
        assert open_inbox(inbox).list(layout.SUBMISSIONS) == []  # nothing written
        big = round_folder(c.store, lease, tmp_path, seed=1, mutate=lambda f: (f / layout.ROLLOUTS_FILE).write_bytes(
            b"\0" * (limit + 1)))
        with pytest.raises(DeliveryError) as err:
            deliver(inbox, lease, big)
        assert "larger than" in err.value.message and layout.ROLLOUTS_FILE in err.value.message
        lease = client.lease("w1")
        token = deliver(inbox, lease, round_folder(c.store, lease, tmp_path, seed=2))
        assert client.submit(lease, token)["status"] == "admitted"
    finally:
        app.close()


@pytest.fixture(scope="module")
def moto_as_is():
    """moto's own S3 server: presigned POST policies are not enforced there."""
    from tests.support.s3_server import S3Server

    server = S3Server(bounded_posts=False).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.timeout(120)
def test_a_backend_that_does_not_bound_posts_gets_write_once_put_urls(tmp_path, moto_as_is, monkeypatch, caplog):
    """moto 5.2 ignores a POST policy's content-length-range (the probe's 2-byte file under a 1-byte cap is
    stored): the coordinator then hands out presigned PUT URLs, write-once, and says why."""
    import uuid

    import httpx

    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_as_is.url)
    inbox = f"s3://test-{uuid.uuid4().hex[:20]}/subs"
    with caplog.at_level("WARNING", logger="hubgrpo"):
        c = _coordinator(tmp_path, inbox)
    assert "content-length-range" in caplog.text
    urls = c.with_uploads(c.lease("w0")).uploads
    assert sorted(urls) == sorted(layout.SUBMISSION_FILES) and not any("#" in u for u in urls.values())
    first = httpx.put(urls[layout.ADAPTER_WEIGHTS], content=b"once", headers={"If-None-Match": "*"})
    again = httpx.put(urls[layout.ADAPTER_WEIGHTS], content=b"twice", headers={"If-None-Match": "*"})
    assert first.status_code == 200 and again.status_code == 412


def _policy(fields: dict) -> dict:
    import base64

    return json.loads(base64.b64decode(fields["policy"]))


def _post_fields(url: str) -> tuple[str, dict]:
    from urllib.parse import parse_qsl

    base, _, fragment = url.partition("#")
    return base, dict(parse_qsl(fragment))


@pytest.mark.timeout(240)
@pytest.mark.parametrize("kind", ["folder", "s3"])
def test_inbox_objects_of_finished_rounds_are_deleted_like_repo_folders(tmp_path, kind, request):
    """keep_submissions 1, max_staleness 1: after four versions the inbox holds only the round merged into the
    current version; the refused round, the merged ones before it and a never-submitted folder are gone."""
    from hubgrpo.store.inboxes import open_inbox
    from hubgrpo.errors import InvalidSubmission
    from hubgrpo.worker.delivery import deliver
    from tests.support.coord_helpers import round_folder

    inbox = str(tmp_path / "inbox") if kind == "folder" else f"{request.getfixturevalue('s3_bucket_url')}/subs"
    c = _coordinator(tmp_path, inbox, **{"merge.quorum": 1, "coordinator.keep_submissions": 1,
                                       "merge.max_staleness": 1})
    objects = open_inbox(inbox)
    objects.put(layout.submission_path(0, "crashed-c1", layout.ADAPTER_WEIGHTS), b"half a round")
    merged = []
    for i in range(4):
        lease = c.lease(f"w{i}")
        if i == 1:  # a refused round: its adapter is not the run's
            bad = deliver(inbox, lease, round_folder(c.store, lease, tmp_path, seed=9, mutate=lambda f: (
                f / layout.ADAPTER_CONFIG).write_text(json.dumps({"r": 99}))))
            with pytest.raises(InvalidSubmission):
                c.submit(lease, bad)
            lease = c.lease(f"w{i}b")
        token = deliver(inbox, lease, round_folder(c.store, lease, tmp_path, seed=i + 1))
        assert c.submit(lease, token)["status"] == "merged"
        merged.append(layout.submission_id(lease.worker, lease.lease_id))
    assert c.state.version == 4
    before = {layout.parse_submission_path(p)[1] for p, _ in objects.list(layout.SUBMISSIONS)}
    assert len(before) == 6  # nothing deleted yet: 4 merged, 1 refused, 1 never submitted
    c.scan()
    left = {layout.parse_submission_path(p)[1] for p, _ in objects.list(layout.SUBMISSIONS)}
    assert left == {merged[-1]}
    assert len(objects.list(layout.SUBMISSIONS)) == len(layout.SUBMISSION_FILES)
    if kind == "folder":
        assert sorted(p.name for p in (tmp_path / "inbox" / layout.SUBMISSIONS).iterdir()) == ["000003"]


def test_the_memory_of_judged_records_is_bounded():
    from hubgrpo.coordinator.inbox import Judged

    judged = Judged(limit=3)
    for i in range(5):
        judged.add((f"submissions/000000/j{i}-x/submission.json", 8 << 20, f'"etag{i}"'))
    assert len(judged) == 3 and ("submissions/000000/j0-x/submission.json", 8 << 20, '"etag0"') not in judged
    assert ("submissions/000000/j4-x/submission.json", 8 << 20, '"etag4"') in judged
