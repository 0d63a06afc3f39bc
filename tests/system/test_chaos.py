"""Chaos suite: a run survives injected Hub faults, a SIGKILLed worker and two coordinator crashes, merging every
admitted submission exactly once; hostile submissions and bad configs are refused with their reasons.

The first test is end to end (tiny model, 3 worker subprocesses, Hub emulator on 127.0.0.1, coordinator in a
subprocess restarted on the same port). The others are fast: synthetic adapters, a live in-process coordinator.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from hubgrpo import layout, runrepo
from hubgrpo.coordinator.repo_init import init_repo
from hubgrpo.cli.main import main
from hubgrpo.errors import InvalidSubmission
from tests.support.chaos_helpers import (answered_at, audit, chaos_env, kill, start_coordinator, start_worker, wait_for,
                                 wait_for_line)
from tests.conftest import TEST_TOKEN
from tests.support.space_support import wait_for_checkpoint, wait_for_version

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "configs" / "tiny.yaml"
REPO = "alice/chaos"
CHAOS_CFG = ["rounds.steps=2", "rounds.versions=3", "merge.quorum=2", "params.per_device_train_batch_size=8",
             "coordinator.lease_timeout_s=8", "coordinator.heartbeat_interval_s=1", "coordinator.round_timeout_s=60",
             "coordinator.checkpoint_every_s=0"]
FAULT_KINDS = ("429", "409", "500", "timeout", "lost")
# Forced on top of the random 10 %, so that every kind happens at least once. All of them are queued at version 1:
# versions 2 and 3 still need >= 6 commits then, while by the time version 2 is seen the run may be one merge from
# its end (a queue left unconsumed made this test fail on 2 busy cores).
FORCED = {1: ("timeout", "500", "409", "lost"), 2: ()}


# ---------------------------------------------------------------------------------------------- end to end


def _setup_run(tmp_path):
    from hubgrpo.config import load_config
    from hubgrpo.cli.embedded import ensure_repo
    from hubgrpo.store.hub import HubStore
    from tests.support.hub_emulator import HubEmulator

    emu = HubEmulator(users={TEST_TOKEN: "alice"}).start()
    store = HubStore(REPO, token=TEST_TOKEN, endpoint=emu.url, retry_base_s=0.2)
    ensure_repo(store, load_config(TINY, overrides=CHAOS_CFG))
    emu.set_faults(0.10, FAULT_KINDS, seed=11, paths=("commit",), ratelimit_reset_s=1, timeout_s=0.3)
    return emu, store


def _chaos_schedule(tmp_path, emu, store, counts: dict) -> None:
    """Start 3 workers and a coordinator; kill+restart a worker mid-round and the coordinator twice."""
    from hubgrpo.worker.client import CoordinatorClient
    from hubgrpo.space.api import free_port

    env, port = chaos_env(emu.url, TEST_TOKEN), free_port()
    url, logs = f"http://127.0.0.1:{port}", tmp_path / "logs"
    logs.mkdir()
    client = CoordinatorClient(url, retries=0, timeout=10)
    procs = counts["procs"]

    def coordinator():
        procs["coord"] = start_coordinator(REPO, port, env, tmp_path / "coord-work", logs / "coordinator.log")

    coordinator()
    for i in range(3):
        procs[f"w{i}"] = start_worker(REPO, url, f"w{i}", env, logs / f"w{i}.log")
    wait_for_line(logs / "w0.log", r"w0 v\d+ step 1/2", 150)  # inside its first round, a step before its push
    emu.fail_next("lost")
    emu.fail_next("429")
    kill(procs["w0"])  # mid-round: its lease expires, its prompts go back; the same name comes back
    counts["kills"] += 1
    procs["w0"] = start_worker(REPO, url, "w0", env, logs / "w0.log")
    counts["restarts"] += 1
    for target in (1, 2):
        wait_for(lambda: client.status()["version"] >= target, 240, f"version {target}")
        if target == 2:  # second crash while a submission waits (rediscovered from the repo on restart)
            try:
                wait_for(lambda: client.status()["pending"] or client.status()["finished"], 60, "a pending one")
            except AssertionError:
                pass
        for kind in FORCED[target]:  # on top of the random 10 %: every kind at least once
            emu.fail_next(kind)
        kill(procs["coord"])
        counts["kills"] += 1
        coordinator()
        counts["restarts"] += 1
    wait_for(lambda: runrepo.read_state(store).finished, 300, "the run to finish", poll=1.0)
    for name in ("w0", "w1", "w2"):  # workers leave by themselves once leases answer 'finished'
        try:
            procs[name].wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass  # killed in the test's finally


def _assert_loads_with_peft(store, tmp_path) -> None:
    from peft import PeftModel

    from hubgrpo.worker.models import load_model

    folder = runrepo.adapter_at(store, store.tags()[layout.version_tag(3)], tmp_path / "final")
    model, _ = load_model("builtin:tiny", device="cpu")
    peft_model = PeftModel.from_pretrained(model, str(folder))
    assert any("lora_B" in n for n, _ in peft_model.named_parameters())


@pytest.mark.timeout(480)
def test_chaos_run_reaches_target_and_merges_everything_once(tmp_path):
    emu, store = _setup_run(tmp_path)
    counts = {"kills": 0, "restarts": 0, "procs": {}}
    try:
        try:
            _chaos_schedule(tmp_path, emu, store, counts)
        finally:
            for p in counts["procs"].values():
                kill(p)
            stats = emu.stats
            emu.set_faults(0.0)
        _check_run(store, stats, counts, tmp_path / "logs")
        _assert_loads_with_peft(store, tmp_path)
    finally:
        emu.stop()


def _check_run(store, stats: dict, counts: dict, logs: Path) -> None:
    """Print the chaos counts, then assert: target reached, every admitted submission merged exactly once."""
    a = audit(store)
    previous_at = a["state"].versions[-2].created_at
    late = {s for s, t in answered_at(logs).items() if t >= previous_at}  # the coordinator heard of it after that
    report = {"faults": stats["faults"], "requests": stats["requests"], "commits_applied": stats["commits_applied"],
              "kills": counts["kills"], "restarts": counts["restarts"], "admitted": a["in_repo"] - a["refused"],
              "in_repo": a["in_repo"], "merged": a["merged"], "refused": a["refused"],
              "refused_codes": a["refused_codes"], "lost": len(a["lost"]), "lost_before_prev": len(a["lost_before_prev"]),
              "sub_commits": sum(a["sub_commits"].values()), "ver_commits": a["ver_commits"]}
    print("CHAOS", json.dumps(report, sort_keys=True))
    assert a["version"] == 3 and a["finished"]
    assert set(stats["faults"]) == set(FAULT_KINDS), stats  # every kind of fault really happened
    assert counts["kills"] == 3 and counts["restarts"] == 3
    assert len(a["merged_ids"]) == len(set(a["merged_ids"])) >= 4  # merged exactly once, quorum 2 x >=2 versions
    # at most one checkpoint commit per version, the final one among them (checkpoint_every_s 0 is "after every
    # merge", from the checkpoint thread: a version merged while the previous checkpoint commits is skipped)
    assert a["ver_commits"].get(3) == 1 and set(a["ver_commits"]) <= {1, 2, 3}, a["ver_commits"]
    assert set(a["ver_commits"].values()) == {1}, a["ver_commits"]
    assert a["sub_commits"] and set(a["sub_commits"].values()) == {1}, a["sub_commits"]  # no commit duplicated
    assert a["in_repo"] == len(a["sub_commits"])
    # "lost" (brief): in the repo, neither merged nor refused, older than the last merge. A round pushed while the
    # final merge was being computed is left pending when the run finishes, so only rounds older than the
    # previous merge must be none (they had a whole round, a coordinator restart included, to be merged) — unless
    # the coordinator first heard of it after the previous merge, so that only the final merge could take it: one
    # committed while a restarted coordinator was starting (after its startup scan) and submitted, after the
    # client's backoff, once the others had finished the run (seen on CI: a 6 s run, answered 0.2 s after the end).
    assert not set(a["lost_before_prev"]) - late, (a["lost_before_prev"], sorted(late))


# ---------------------------------------------------------------------------------------------- fast, no model


BAD_CONFIGS = {
    "unknown_key": "base_model: builtin:tiny\nrounds: {steps: 2, no_such_field: 1}\n",
    "bad_type": "base_model: builtin:tiny\nrounds: {steps: many}\n",
    "negative": "base_model: builtin:tiny\ncoordinator: {lease_timeout_s: -5}\n",
    "bad_method": "base_model: builtin:tiny\nmerge: {method: average_everything}\n",
    "not_a_mapping": "- just\n- a list\n",
    "bad_yaml": "base_model: [unclosed\n",
    "missing_env": "base_model: ${HUBGRPO_CHAOS_UNSET_VAR}\n",
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", sorted(BAD_CONFIGS))
def test_malformed_config_is_a_config_error(name, tmp_path, capsys):
    path = tmp_path / f"{name}.yaml"
    path.write_text(BAD_CONFIGS[name])
    assert main(["config", "validate", str(path)]) == 2  # ConfigError.exit_code
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err) > 20, err


@pytest.mark.timeout(60)
def test_good_config_validates(capsys):
    assert main(["config", "validate", str(TINY)]) == 0
    assert "ok" in capsys.readouterr().out


SKIP_HOSTILE = {  # cannot travel through a store as such (symlinks, folders), or not hostile under this config
    "symlink_config", "symlink_weights", "nested_dir", "weights_is_dir", "targets", "huge_norm"}


@pytest.fixture
def live(tmp_path):
    """A coordinator on a LocalStore run repo with synthetic adapters, served on 127.0.0.1; yields (store, client)."""
    from hubgrpo.worker.client import CoordinatorClient
    from hubgrpo.coordinator.core import Coordinator
    from hubgrpo.space.api import serve
    from hubgrpo.store.local import LocalStore
    from tests.support.coord_helpers import make_config, write_adapter

    cfg = make_config(**{"rounds.versions": 100, "merge.quorum": 2, "coordinator.commit_budget_per_hour": 10000})
    store = LocalStore(tmp_path / "repo")
    init_repo(store, cfg, write_adapter(tmp_path / "v0", seed=0, b_scale=0.0))
    coord = Coordinator(store, b"chaos", workdir=tmp_path / "work")
    app, url = serve(coord, port=0, tick_interval=5.0)
    client = CoordinatorClient(url, transport="http", retries=2, timeout=30)
    try:
        yield store, client
    finally:
        client.close()
        app.close()


def _honest(store, client, tmp_path, seed: int) -> dict:
    from tests.support.coord_helpers import push_submission

    lease = client.lease(f"honest{seed % 2}")
    return client.submit(lease, push_submission(store, lease, tmp_path / "honest", seed=seed, b_scale=0.05))


def _hostile(store, client, tmp_path, name: str, mutate, seed: int) -> InvalidSubmission:
    from tests.support.coord_helpers import push_submission

    lease = client.lease(f"evil-{name.replace('_', '-')}"[:60])
    commit = push_submission(store, lease, tmp_path / "hostile", seed=seed, b_scale=0.05, mutate=mutate)
    with pytest.raises(InvalidSubmission) as exc:
        client.submit(lease, commit)
    return exc.value


def _reshape(d_in: int, d_out: int):
    """A worker on another base model: same module names, other hidden size."""
    def mutate(folder: Path) -> None:
        w = load_file(str(folder / layout.ADAPTER_WEIGHTS))
        w = {k: torch.randn(v.shape[0], d_in) if "lora_A" in k else torch.randn(d_out, v.shape[1]) for k, v in w.items()}
        save_file(w, str(folder / layout.ADAPTER_WEIGHTS))
    return mutate


def _rename_modules(folder: Path) -> None:
    """A worker on another architecture: its LoRA targets are named differently."""
    w = load_file(str(folder / layout.ADAPTER_WEIGHTS))
    save_file({k.replace("self_attn.q_proj", "attn.c_attn"): v for k, v in w.items()},
              str(folder / layout.ADAPTER_WEIGHTS))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("variant,mutate,codes", [("shapes", _reshape(32, 32), {"shape"}),
                                                  ("keys", _rename_modules, {"missing_keys", "extra_keys"})])
def test_worker_on_wrong_base_model_is_refused_run_unaffected(live, tmp_path, variant, mutate, codes):
    store, client = live
    err = _hostile(store, client, tmp_path, f"wrongbase-{variant}", mutate, seed=3)
    assert err.code in codes, (err.code, err.message)
    assert _honest(store, client, tmp_path, 1)["status"] == "admitted"
    assert _honest(store, client, tmp_path, 2)["merge_due"]
    status = wait_for_version(client, 1)
    assert status["version"] == 1 and [r["code"] for r in status["refusals"]] == [err.code]


@pytest.mark.timeout(180)
def test_flood_of_hostile_submissions_interleaved_with_honest_ones(live, tmp_path):
    from tests.support.hostile_folders import HOSTILE

    store, client = live
    hostile = {k: v for k, v in sorted(HOSTILE.items()) if k not in SKIP_HOSTILE}
    assert len(hostile) >= 30
    got, honest_merged = {}, 0
    for i, (name, (mutate, code)) in enumerate(hostile.items()):
        got[name] = (_hostile(store, client, tmp_path, name, mutate, seed=100 + i).code, code)
        if i % 5 == 4:  # two honest rounds after every five hostile ones: one version each time
            _honest(store, client, tmp_path, 2 * i)
            if _honest(store, client, tmp_path, 2 * i + 1)["merge_due"]:
                honest_merged += 1
                wait_for_checkpoint(client, honest_merged)  # the next rounds read their base from its tag
    wrong = {n: g for n, g in got.items() if g[0] != g[1]}
    assert not wrong, wrong  # every hostile submission refused with its own reason
    status = client.status()
    assert status["version"] == honest_merged == len(hostile) // 5
    state = runrepo.read_state(store)
    assert all(m.worker.startswith("honest") for v in state.versions for m in v.merged)
    refusals = status["refusals"]  # persisted ones + those since the last checkpoint
    assert len(refusals) == len(hostile) and all(r["worker"].startswith("evil") for r in refusals)
    assert all(r["message"] for r in refusals)


# ---------------------------------------------------------------------------------------------- 429 storm


STORM_S = 20  # the Hub answers 429 (asking for this wait) to every commit this long


@pytest.mark.timeout(240)
def test_heartbeats_stay_fast_while_the_hub_answers_429_to_every_commit(tmp_path):
    """Every commit answered 429 with a 20-s wait for 20 s, while a merge is due: the merge makes its version
    live without the Hub; its checkpoint commit waits (outside the API lock); heartbeats and status calls from 4
    workers keep answering in well under a second."""
    import statistics
    import threading
    import time

    from hubgrpo.coordinator.core import Coordinator
    from hubgrpo.space.api import serve
    from hubgrpo.store.hub import HubStore
    from hubgrpo.worker.client import CoordinatorClient
    from tests.support.coord_helpers import make_config, push_submission, write_adapter
    from tests.support.hub_emulator import HubEmulator

    emu = HubEmulator(users={TEST_TOKEN: "alice"}).start()
    store = HubStore("alice/storm", token=TEST_TOKEN, endpoint=emu.url, retry_base_s=0.05, cache_dir=tmp_path / "hf")
    init_repo(store, make_config(**{"merge.quorum": 2, "coordinator.checkpoint_every_s": 0}),  # due at the merge
              write_adapter(tmp_path / "v0", seed=0))
    coord = Coordinator(store, b"storm-secret", workdir=tmp_path / "coord")
    app, url = serve(coord, tick_interval=0.1)
    client = CoordinatorClient(url, retries=0, timeout=10)
    try:
        a, b = client.lease("a"), client.lease("b")
        beating = [client.lease(f"hb{i}") for i in range(4)]  # 4 more workers, training through the storm
        sha_a, sha_b = (push_submission(store, lease, tmp_path, seed=i) for i, lease in enumerate((a, b), 1))
        client.submit(a, sha_a)
        emu.set_faults(1.0, ("429",), paths=("commit",), ratelimit_reset_s=STORM_S)  # every commit 429
        storm_started = time.time()
        assert client.submit(b, sha_b)["merge_due"]  # the merge's checkpoint commit now meets the storm
        latencies, stop = [], threading.Event()

        def beat(lease) -> None:
            while not stop.is_set():
                t0 = time.perf_counter()
                lease = client.heartbeat(lease)
                client.status()
                latencies.append(time.perf_counter() - t0)
                time.sleep(0.2)

        threads = [threading.Thread(target=beat, args=(lease,)) for lease in beating]
        for t in threads:
            t.start()
        time.sleep(STORM_S - (time.time() - storm_started))
        stats_in_storm = emu.stats["faults"].get("429", 0)
        status = client.status()
        assert status["version"] == 1, "the merge needs no commit: its version is live during the storm"
        assert status["checkpoint"]["version"] == 0 and "v000001" not in store.tags(), "committed in the storm"
        emu.set_faults(0.0)
        stop.set()
        for t in threads:
            t.join(10)
        wait_for_checkpoint(client, 1, timeout=90)  # the checkpoint lands after the storm
        assert runrepo.read_state(store, store.tags()["v000001"]).version == 1
        latencies.sort()
        p99 = latencies[int(0.99 * (len(latencies) - 1))]
        print(f"\n429 storm: {stats_in_storm} commits answered 429; {len(latencies)} heartbeat+status calls, "
              f"median {statistics.median(latencies) * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms")
        assert stats_in_storm >= 1 and len(latencies) > 200
        assert p99 < 3.0  # one process serves ~1000 calls beside the storm; a call held by a 429 wait takes 60 s
    finally:
        client.close()
        app.close()
        emu.stop()


@pytest.mark.timeout(120)
def test_a_due_merge_goes_live_while_a_checkpoint_waits_out_a_429(tmp_path):
    """Versions are off the commit path: while the checkpoint of version 1 waits out the Hub's 429 (20 s), the
    rounds of version 2 (their commits made before the storm) are merged at once and version 2 is live."""
    from hubgrpo.coordinator.core import Coordinator
    from hubgrpo.space.api import serve
    from hubgrpo.store.hub import HubStore
    from hubgrpo.worker.client import CoordinatorClient
    from tests.support.coord_helpers import make_config, push_submission, write_adapter
    from tests.support.hub_emulator import HubEmulator

    emu = HubEmulator(users={TEST_TOKEN: "alice"}).start()
    store = HubStore("alice/stall", token=TEST_TOKEN, endpoint=emu.url, retry_base_s=0.05, cache_dir=tmp_path / "hf")
    init_repo(store, make_config(**{"merge.quorum": 2, "merge.max_staleness": 2, "coordinator.checkpoint_every_s": 0}),
              write_adapter(tmp_path / "v0", seed=0))
    app, url = serve(Coordinator(store, b"stall-secret", workdir=tmp_path / "coord"), tick_interval=0.1)
    client = CoordinatorClient(url, retries=0, timeout=10)
    try:
        leases = [client.lease(name) for name in ("a", "b", "c", "d")]
        shas = [push_submission(store, lease, tmp_path, seed=i) for i, lease in enumerate(leases, 1)]
        client.submit(leases[0], shas[0])
        emu.set_faults(1.0, ("429",), paths=("commit",), ratelimit_reset_s=20)  # every commit: 429, retry in 20 s
        client.submit(leases[1], shas[1])  # version 1: live at once, its checkpoint meets the storm
        wait_for(lambda: client.status()["version"] >= 1 and emu.stats["faults"].get("429"), 10,
                 "version 1 live and its checkpoint answered 429", poll=0.05)
        for lease, sha in zip(leases[2:], shas[2:]):  # stale by one: admitted, and the quorum of version 2
            client.submit(client.heartbeat(lease), sha)
        wait_for(lambda: client.status()["version"] >= 2, 15, "version 2 live while the checkpoint of version 1 "
                 "waits out the 429 (the storm lasts the whole test)", poll=0.05)
        assert client.status()["checkpoint"]["version"] == 0 and "v000001" not in store.tags()
    finally:
        emu.set_faults(0.0)
        client.close()
        app.close()
        emu.stop()
