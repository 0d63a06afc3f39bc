"""Who may call a coordinator whose run repo has no Hub owner (issue 35, defect 9): a run repo on S3 (the moto
server on 127.0.0.1) or a local folder. Such a coordinator must name its users (``coordinator.allowed_users``) to
have auth at all, and its evaluators (``coordinator.evaluators``) to take held-out scores from anyone: being
allowed to train never makes a worker an evaluator. Without auth it serves a loopback address only."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from hubgrpo.coordinator.core import Coordinator
from hubgrpo.coordinator.repo_init import init_repo
from hubgrpo.errors import ConfigError, Refused
from hubgrpo.space.api import serve
from hubgrpo.space.app import serve_space
from hubgrpo.space.auth import make_auth
from hubgrpo.store.local import LocalStore
from hubgrpo.worker.client import CoordinatorClient
from tests.support.coord_helpers import make_config
from tests.support.space_support import ALICE, BOB, SECRET, start_emulator, write_adapter


def s3_run(url: str, tmp_path, **overrides):
    from hubgrpo.store.s3 import S3Store

    store = S3Store(url, cache_dir=tmp_path / "s3-cache", retry_base_s=0.05)
    store.create(exist_ok=True)
    init_repo(store, make_config(**overrides), write_adapter(tmp_path / "v0", seed=0))
    return store


@pytest.mark.timeout(120)
def test_a_worker_in_allowed_users_cannot_record_held_out_scores_on_an_s3_run(s3_bucket_url, tmp_path):
    emu = start_emulator()
    store = s3_run(f"{s3_bucket_url}/run", tmp_path, **{"coordinator.allowed_users": "[alice, bob]"})
    coord = Coordinator(store, SECRET, workdir=tmp_path / "coord")
    app, url = serve_space(coord, auth=make_auth(coord, endpoint=emu.url), batch_wait_s=0.1, tick_interval=0.2)
    try:
        for token, name in ((BOB, "bob"), (ALICE, "alice")):
            client = CoordinatorClient(url, token=token, retries=0)
            assert client.lease(f"{name}-box").user == name  # allowed to train ...
            with pytest.raises(Refused) as e:
                client.record_eval(0, 1.0, 4)  # ... but no one may score a run without a Hub owner by default
            assert e.value.code == "auth" and "coordinator.evaluators" in e.value.hint
            client.close()
        assert CoordinatorClient(url).status()["versions"][0].get("eval_reward") is None  # nothing recorded
    finally:
        app.hubgrpo_uploads.close()
        app.close(verbose=False)
        emu.stop()
    coord.cfg.coordinator.evaluators = ["alice"]  # named explicitly: alice may score, bob still may not
    auth = make_auth(coord, whoami=lambda t: {"name": {ALICE: "alice", BOB: "bob"}[t], "orgs": []})
    assert auth.evaluator(ALICE) == "alice"
    with pytest.raises(Refused, match="record held-out scores"):
        auth.evaluator(BOB)


def cli(*args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    """``hubgrpo ARGS`` in a subprocess; one that is still serving after ``timeout`` seconds fails the test."""
    try:
        return subprocess.run([sys.executable, "-m", "hubgrpo.cli", *args], capture_output=True, text=True,
                              timeout=timeout, env=None)
    except subprocess.TimeoutExpired:
        pytest.fail(f"`hubgrpo {' '.join(args)}` was still serving after {timeout:.0f} s")


@pytest.mark.timeout(240)
def test_an_ownerless_run_without_allowed_users_is_served_on_loopback_only(s3_bucket_url, tmp_path, monkeypatch):
    monkeypatch.setenv("HUBGRPO_SECRET", "owner-test-secret")
    s3_run(f"{s3_bucket_url}/open", tmp_path)
    local = LocalStore(tmp_path / "local")
    init_repo(local, make_config(), write_adapter(tmp_path / "local-v0", seed=0))
    for args in (["space", "--repo", f"{s3_bucket_url}/open"], ["coordinator", "--repo", str(tmp_path / "local")]):
        r = cli(*args, "--host", "0.0.0.0", "--port", "0", "--quiet")
        assert r.returncode != 0, r.stdout[-2000:]
        assert "0.0.0.0 without auth" in r.stderr and "coordinator.allowed_users" in r.stderr, r.stderr[-2000:]
    coord = Coordinator(local, SECRET, workdir=tmp_path / "coord")
    with pytest.raises(ConfigError, match="without auth"):
        serve(coord, host="0.0.0.0")
    app, url = serve(coord, host="127.0.0.1")  # loopback: a trusted local run, as `hubgrpo run` serves it
    try:
        assert CoordinatorClient(url).lease("w").user is None
    finally:
        app.close(verbose=False)


@pytest.mark.timeout(180)
def test_hubgrpo_coordinator_beyond_loopback_authenticates_for_the_repo_owner(tmp_path):
    """``hubgrpo coordinator --host 0.0.0.0`` on a Hub run repo serves with auth (its owner), not open."""
    import os
    import socket

    from tests.support.space_support import make_run

    emu = start_emulator()
    make_run(emu, tmp_path, "exposed")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, HF_ENDPOINT=emu.url, HF_TOKEN=ALICE, HUBGRPO_SECRET="exposed-secret")
    log = tmp_path / "coordinator.log"
    proc = subprocess.Popen([sys.executable, "-m", "hubgrpo.cli", "coordinator", "--repo", "alice/exposed", "--host",
                             "0.0.0.0", "--port", str(port), "--quiet"], env=env, stdout=open(log, "wb"),
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while "auth on" not in log.read_text(errors="replace"):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.2)
        url = f"http://127.0.0.1:{port}"
        with pytest.raises(Refused, match="no token"):
            CoordinatorClient(url, retries=0).lease("anonymous")
        assert CoordinatorClient(url, token=ALICE).lease("alice-box").user == "alice"
    finally:
        from tests.support.visitor_attacks import stop

        stop(proc)
        emu.stop()
