"""The Gradio Space end to end: the app on 127.0.0.1, the Hub emulator as the bucket (HubStore), synthetic
adapters, simulated workers over both client transports, auth + rate limit, batched uploads, restart, deploy."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from safetensors.torch import load_file, save_file

from hubgrpo import layout, runrepo
from hubgrpo.coordinator.repo_init import init_repo
from hubgrpo.space.auth import HubAuth, RateLimiter, allowed_for, make_auth, request_token
from hubgrpo.cli.main import main
from hubgrpo.errors import InvalidSubmission, Refused
from hubgrpo.space.app import serve_space
from hubgrpo.space.upload import decode_files
from hubgrpo.space.view import SMOOTHED, TRAINING, snapshot
from hubgrpo.store.hub import HubStore
from hubgrpo.store.local import LocalStore
from hubgrpo.worker.loop import Worker
from tests.support.coord_helpers import FakeClock, make_config, submission_record, write_rollouts
from tests.support.space_support import (ALICE, BOB, MALLORY, SimWorker, make_run, new_coordinator, run_versions,
                                      start_emulator, submission_folder, wait_for_checkpoint, wait_for_version,
                                      write_adapter)

PUBLIC_API = {"lease", "heartbeat", "release", "submit", "verdict", "status", "record_eval", "record_verdict",
              "round_files", "upload"}


@pytest.fixture(scope="module")
def emu():
    emulator = start_emulator()
    yield emulator
    emulator.stop()


@pytest.fixture
def launch():
    """launch(coord, **kw) -> (app, url): the Space app with auth from the run config; closed after the test."""
    apps = []

    def start(coord, **kw):
        kw = {"auth": make_auth(coord), "batch_wait_s": 0.1, "tick_interval": 0.2, **kw}
        app, url = serve_space(coord, **kw)
        apps.append(app)
        return app, url

    yield start
    for app in apps:
        app.hubgrpo_uploads.close()
        app.close(verbose=False)


class FakeEngine:
    """A RoundEngine stand-in: 'trains' by writing a synthetic adapter and submission.json."""

    def __init__(self, reward: float):
        self.reward = reward

    def run_round(self, adapter_dir, lease, out, on_step=None, rebase=None):
        from safetensors.torch import load_file

        base = load_file(Path(adapter_dir) / layout.ADAPTER_WEIGHTS)  # trained from the leased version
        write_adapter(out, seed=lease.seed % 1000, b_scale=0.1)
        delta = load_file(out / layout.ADAPTER_WEIGHTS)
        moved = {k: base[k] + delta[k] if "lora_B" in k else base[k] for k in base}
        save_file(moved, str(out / layout.ADAPTER_WEIGHTS))
        sub = submission_record(lease, self.reward)
        write_rollouts(out, lease, reward=self.reward)
        (out / layout.SUBMISSION_FILE).write_bytes(sub.to_json())
        return sub


@pytest.mark.timeout(60)
def test_two_workers_two_versions_through_the_space(emu, tmp_path, launch):
    """alice commits herself (raw HTTP); bob's real Worker uploads through the Space (gradio_client)."""
    store = make_run(emu, tmp_path, "e2e", **{"hub.private": "false"})
    coord = new_coordinator(store, tmp_path)
    app, url = launch(coord)
    alice = SimWorker(url, "alice-box", ALICE, tmp_path, store=HubStore("alice/e2e", token=ALICE, endpoint=emu.url,
                                                                        cache_dir=tmp_path / "alice-cache"))
    bob_client = SimWorker(url, "bob-box", BOB, tmp_path, transport="gradio").client
    bob = Worker(HubStore("alice/e2e", token=BOB, endpoint=emu.url, cache_dir=tmp_path / "bob-cache"), bob_client,
                 name="bob-box", engine=FakeEngine(0.5), max_rounds=1, workdir=tmp_path / "bob", progress=False,
                 upload_via="coordinator")
    answers = []
    for v in range(2):
        answers.append(alice.finish(alice.lease(), reward=0.2 + 0.1 * v))
        bob.results = []
        answers += bob.run()
        wait_for_version(bob_client, v + 1)  # the merge runs in the server's tick thread, off the submit path
    wait_for_checkpoint(bob_client, 2)  # ... and its checkpoint in another, just after
    assert [a["status"] for a in answers] == ["admitted"] * 4
    assert [a["merge_due"] for a in answers] == [False, True] * 2
    assert all(a["batch"] == 1 and len(a["commit"]) == 40 for a in answers[1::2])
    state = runrepo.read_state(store)
    assert state.version == 2 and state.finished and len(set(state.merged_ids)) == 4
    assert {w: s.user for w, s in state.workers.items()} == {"alice/alice-box": "alice", "bob/bob-box": "bob"}
    snap = snapshot(coord)
    assert [r[0] for r in snap["leaderboard"]] == ["alice-box", "bob-box"]  # equal credited samples: by name
    assert snap["versions"][0][-1] == f"[{coord.shas[2][:10]}]({emu.url}/alice/e2e/commit/{coord.shas[2]})"
    reward = snap["reward"]
    assert list(snap["workers"]["worker"]) == ["alice-box", "bob-box"] * 2
    assert list(reward[reward["series"] == TRAINING]["version"]) == [1, 2]
    assert list(reward[reward["series"] == SMOOTHED]["version"]) == [1, 2]  # a short run: drawn as it is
    assert "secret: null" in snap["config"] and "finished" in snap["summary"]
    gc = bob_client._transport._client()
    assert set(gc.view_api(print_info=False, return_format="dict")["named_endpoints"]) == {f"/{n}" for n in PUBLIC_API}
    assert SimWorker(url, "anon", None, tmp_path).client.status()["version"] == 2  # status stays public
    alice.close()
    bob_client.close()


@pytest.mark.timeout(60)
def test_tokens_are_checked_and_never_logged(emu, tmp_path, launch, caplog):
    caplog.set_level(logging.DEBUG, logger="hubgrpo")
    store = make_run(emu, tmp_path, "auth")
    coord = new_coordinator(store, tmp_path)
    app, url = launch(coord)
    refusals = {}
    for who, token in (("nobody", None), ("mallory", MALLORY), ("forger", "hf_not_a_real_token")):
        with pytest.raises(Refused) as ei:
            SimWorker(url, who, token, tmp_path).lease()
        refusals[who] = ei.value
    assert all(e.code == "auth" for e in refusals.values())
    assert "no token" in refusals["nobody"].message and "HF_TOKEN" in refusals["nobody"].hint
    assert "'mallory' may not work" in refusals["mallory"].message and "allowed_users" in refusals["mallory"].hint
    assert "does not recognise" in refusals["forger"].message
    bob = SimWorker(url, "bob-box", BOB, tmp_path)
    lease = bob.lease()  # allowed through his org
    assert lease.user == "bob" and bob.client.heartbeat(lease).user == "bob"
    with pytest.raises(Refused, match="another user"):
        SimWorker(url, "alice-box", ALICE, tmp_path).client.heartbeat(lease)
    auth = app.hubgrpo_ticker.api.auth
    assert auth.lookups == 4  # mallory, forger, bob, alice: one whoami each, then cached
    assert not any(t in caplog.text for t in (ALICE, BOB, MALLORY, "hf_not_a_real_token"))


def test_rate_limit_token_bucket_with_injected_clock():
    clock = FakeClock(1000.0)
    limiter = RateLimiter(3, clock=clock)
    assert [limiter.take("bob") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limiter.take("bob") == pytest.approx(20.0) and limiter.take("alice") == 0.0
    clock.advance(20.0)
    assert limiter.take("bob") == 0.0
    with pytest.raises(Refused) as ei:
        limiter.check("bob")
    assert ei.value.code == "rate" and ei.value.wait_s == pytest.approx(20.0)
    hook = HubAuth(["bob"], whoami=lambda token: {"name": "bob", "orgs": []}, rate_limit_per_minute=2, clock=clock)
    assert hook("hf_test_bob_t1") == hook("hf_test_bob_t1") == "bob" and hook.lookups == 1
    with pytest.raises(Refused, match="calls per minute"):
        hook("hf_test_bob_t1")


def test_token_sources_and_auth_off_for_a_local_repo(tmp_path):
    bearer = SimpleNamespace(request=SimpleNamespace(headers={"authorization": "Bearer hf_test_carol"}))
    oauth = SimpleNamespace(headers={}, session={"oauth_info": {"access_token": "hf_oauth"}})
    assert request_token(bearer) == "hf_test_carol" and request_token(oauth) == "hf_oauth"
    assert request_token(None) is None
    calls = []
    hook = HubAuth(["team"], whoami=lambda t: calls.append(t) or {"name": "carol", "orgs": [{"name": "Team"}]})
    assert hook(None, bearer) == "carol" and calls == ["hf_test_carol"]  # admitted through her org (any case)
    store = LocalStore(tmp_path / "local")
    init_repo(store, make_config(), write_adapter(tmp_path / "v0", seed=0))
    coord = new_coordinator(store, tmp_path)
    assert allowed_for(coord) == [] and make_auth(coord) is None  # local repo, no allowed_users: auth off
    coord.cfg.coordinator.allowed_users = ["alice"]
    assert isinstance(make_auth(coord), HubAuth)


@pytest.mark.timeout(60)
def test_rate_limit_refusal_reaches_the_worker(emu, tmp_path, launch):
    store = make_run(emu, tmp_path, "rate", **{"coordinator.rate_limit_per_minute": 3})
    app, url = launch(new_coordinator(store, tmp_path))
    bobs = [SimWorker(url, f"bob-box{i}", BOB, tmp_path, transport="gradio") for i in range(4)]
    for bob in bobs[:3]:  # the rate limit is per user, shared by all of bob's machines
        bob.lease()
    with pytest.raises(Refused) as ei:
        bobs[3].lease()
    assert ei.value.code == "rate" and 0 < ei.value.wait_s <= 20.0
    for bob in bobs:
        bob.close()


@pytest.mark.timeout(60)
def test_uploads_are_checked_then_committed_in_batches(emu, tmp_path, launch):
    store = make_run(emu, tmp_path, "batch")
    coord = new_coordinator(store, tmp_path)
    app, url = launch(coord, batch_size=2, batch_wait_s=30.0)
    workers = [SimWorker(url, f"bob-{i}", BOB, tmp_path, reader=store) for i in range(3)]
    leases = [w.lease() for w in workers]
    before, answers = emu.stats["commits_applied"], {}
    threads = [threading.Thread(target=lambda i=i: answers.setdefault(i, workers[i].finish(leases[i], 0.3)))
               for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert answers[0]["commit"] == answers[1]["commit"] and answers[0]["batch"] == 2
    assert sorted(a["merge_due"] for a in answers.values()) == [False, True]
    wait_for_version(workers[0].client, 1)
    deadline = time.time() + 30  # the checkpoint of version 1 comes from its own thread, just after the merge
    while emu.stats["commits_applied"] - before < 2 and time.time() < deadline:
        time.sleep(0.05)
    assert emu.stats["commits_applied"] - before == 2  # ONE commit for two submissions, plus the checkpoint
    assert sum("via the coordinator" in c.message for c in store.history()) == 1
    bad = submission_folder(leases[2], tmp_path / "bad", seed=9, reward=0.1, mutate=_poison, reader=store)
    with pytest.raises(InvalidSubmission) as ei:
        workers[2].client.upload(leases[2], bad)
    assert ei.value.code == "nonfinite" and emu.stats["commits_applied"] - before == 2  # nothing committed
    assert coord.status()["refusals"][-1]["code"] == "nonfinite"
    assert workers[0].finish(leases[0], 0.3)["status"] == "duplicate"  # a retried upload is not merged twice


def _poison(folder):
    weights = load_file(str(folder / layout.ADAPTER_WEIGHTS))
    next(iter(weights.values()))[0, 0] = float("nan")
    save_file(weights, str(folder / layout.ADAPTER_WEIGHTS))


def test_upload_decoding_refuses_unsafe_names_and_sizes(tmp_path):
    with pytest.raises(InvalidSubmission) as ei:
        decode_files({"../evil.py": "AAAA"}, 10_000)
    assert ei.value.code == "unexpected_file" and not (tmp_path / "evil.py").exists()
    with pytest.raises(InvalidSubmission) as ei:
        decode_files({layout.ADAPTER_WEIGHTS: "A" * 400}, 100)
    assert ei.value.code == "too_large"
    with pytest.raises(InvalidSubmission) as ei:
        decode_files({layout.ADAPTER_CONFIG: "not base64!"}, 100)
    assert ei.value.code == "bad_upload"


@pytest.mark.timeout(60)
def test_restarted_space_resumes_the_run(emu, tmp_path, launch):
    store = make_run(emu, tmp_path, "restart")
    app, url = launch(new_coordinator(store, tmp_path))
    own = HubStore("alice/restart", token=ALICE, endpoint=emu.url, cache_dir=tmp_path / "own")
    alice = SimWorker(url, "alice-box", ALICE, tmp_path, store=own)
    bob = SimWorker(url, "bob-box", BOB, tmp_path, reader=own)
    run_versions([alice, bob], 1)
    wait_for_checkpoint(alice.client, 1)  # (a crash before it would resume from version 0: test_checkpoints.py)
    lease = alice.lease()
    assert alice.finish(lease, 0.6)["status"] == "admitted"  # pending when the Space goes down
    app.hubgrpo_uploads.close()
    app.close(verbose=False)
    coord2 = new_coordinator(store, tmp_path)  # the restarted Space: rebuilt from the repo alone
    assert coord2.state.version == 1 and len(coord2.pending) == 1
    _, url2 = launch(coord2)
    alice2 = SimWorker(url2, "alice-box", ALICE, tmp_path, store=own)
    assert alice2.client.heartbeat(lease).lease_id == lease.lease_id  # leases survive (signed)
    bob2 = SimWorker(url2, "bob-box", BOB, tmp_path, transport="gradio", reader=own)
    assert bob2.finish(bob2.lease(), 0.7)["merge_due"]
    wait_for_checkpoint(bob2.client, 2)
    state = runrepo.read_state(store)
    assert state.version == 2 and state.finished and len(state.merged_ids) == len(set(state.merged_ids)) == 4
    with pytest.raises(Refused, match="finished"):
        alice2.lease()
    for w in (alice, bob, alice2, bob2):
        w.close()


@pytest.mark.timeout(60)
def test_deploy_creates_the_space_with_files_variables_and_secrets(emu, tmp_path, monkeypatch, capsys):
    import gradio
    from huggingface_hub import HfApi

    monkeypatch.setenv("HF_TOKEN", ALICE)
    monkeypatch.setenv("HF_ENDPOINT", emu.url)
    monkeypatch.setenv("HUBGRPO_SECRET", "deploy-secret")
    for _ in range(2):  # deploying again updates the same Space
        assert main(["space", "deploy", "--repo", "alice/run", "--space", "alice/coordinator"]) == 0
    out = capsys.readouterr().out
    assert "alice/coordinator" in out and ALICE not in out and "deploy-secret" not in out
    api = HfApi(endpoint=emu.url, token=ALICE)
    files = set(api.list_repo_files("alice/coordinator", repo_type="space"))
    assert {"app.py", "README.md", "requirements.txt", "hubgrpo/space/app.py", "hubgrpo/space/auth.py",
            "hubgrpo/__init__.py"} <= files and not any("__pycache__" in f for f in files)
    readme = Path(api.hf_hub_download("alice/coordinator", "README.md", repo_type="space")).read_text()
    assert f"sdk_version: {gradio.__version__}" in readme and "hf_oauth: true" in readme
    assert emu.api.space_sdks["alice/coordinator"] == "gradio"
    variables = {k: v.value for k, v in api.get_space_variables("alice/coordinator").items()}
    assert variables == {"HUBGRPO_REPO": "alice/run", "HF_ENDPOINT": emu.url}
    assert set(api.get_space_secrets("alice/coordinator")) == {"HF_TOKEN", "HUBGRPO_SECRET"}
    secrets = emu.api.spaces.data["alice/coordinator"]["secrets"]
    assert secrets["HF_TOKEN"]["value"] == ALICE and secrets["HUBGRPO_SECRET"]["value"] == "deploy-secret"
    monkeypatch.setenv("HF_TOKEN", MALLORY)  # no write access to alice's namespace
    assert main(["space", "deploy", "--repo", "alice/run", "--space", "alice/coordinator"]) != 0
