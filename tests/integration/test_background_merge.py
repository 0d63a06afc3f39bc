"""Merges run in the server's tick thread with the API lock released: a slow merge keeps no caller waiting."""

from __future__ import annotations

import threading
import time

import pytest

from hubgrpo import layout, runrepo
from hubgrpo.coordinator.repo_init import init_repo
from hubgrpo.worker.client import CoordinatorClient
from hubgrpo.coordinator.core import Coordinator
from hubgrpo.errors import Refused
from hubgrpo.coordinator.merging import MergePlan
from hubgrpo.space.api import serve
from hubgrpo.space.endpoints import LEASE_HOLD_S, LEASE_RETRY_S
from hubgrpo.store.local import LocalStore
from tests.support.coord_helpers import make_config, push_submission, write_adapter
from tests.support.space_support import wait_for, wait_for_checkpoint, wait_for_version

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def slow_run(tmp_path, monkeypatch):
    """A served real coordinator whose merge compute blocks until the test releases it."""
    gate, started = threading.Event(), threading.Event()
    compute = MergePlan.compute

    def slow_compute(plan):
        started.set()
        assert gate.wait(30), "the test never released the merge"
        return compute(plan)

    monkeypatch.setattr(MergePlan, "compute", slow_compute)

    def start(**overrides):
        return served(tmp_path, apps, **overrides)

    apps: list = []
    yield start, gate, started
    gate.set()
    for app in apps:
        app.close(verbose=False)


def served(tmp_path, apps: list, **overrides):
    """(store, coordinator, client) of a real coordinator served on loopback; its app is appended to ``apps``."""
    store = LocalStore(tmp_path / "repo")
    init_repo(store, make_config(**overrides), write_adapter(tmp_path / "v0", seed=0))
    coord = Coordinator(store, b"secret", workdir=tmp_path / "work")
    app, url = serve(coord, tick_interval=0.2)
    apps.append(app)
    return store, coord, CoordinatorClient(url, retries=1)


def test_submit_answers_before_the_merge_and_the_api_stays_responsive(slow_run, tmp_path):
    start, gate, started = slow_run
    store, coord, client = start(**{"merge.max_staleness": 2, "coordinator.lease_waits_for_merge_s": 0})
    l1, l2, l3 = client.lease("w1"), client.lease("w2"), client.lease("w3")
    assert client.submit(l1, push_submission(store, l1, tmp_path, seed=1))["merge_due"] is False
    t0 = time.time()
    answer = client.submit(l2, push_submission(store, l2, tmp_path, seed=2))
    assert answer["status"] == "admitted" and answer["merge_due"] is True
    assert started.wait(10)  # the tick thread is computing the merge, and will until the gate opens
    assert client.heartbeat(l3).lease_id == l3.lease_id  # not blocked behind the merge
    l4 = client.lease("w4")  # lease_waits_for_merge_s 0: no waiting for the running merge
    assert l4.base_version == 0  # the newest live version: the merge is still computing
    status = client.status()
    assert status["merging"] == 1 and status["version"] == 0 and len(status["pending"]) == 2
    assert time.time() - t0 < 8
    l3 = client.heartbeat(l3)
    third = client.submit(l3, push_submission(store, l3, tmp_path, seed=3))  # admitted during the compute
    assert third["status"] == "admitted"
    gate.set()
    status = wait_for_version(client, 1)
    assert status["merging"] is None and status["pending"] == [third["submission_id"]]  # kept for the next merge
    wait_for_checkpoint(client, 1)  # a local folder: a checkpoint after every version, made by the tick thread
    state = runrepo.read_state(store)
    assert sorted(m.worker for m in state.versions[1].merged) == ["w1", "w2"]
    assert state.workers["w4"].last_seen is not None  # a lease taken during the compute survives the adoption
    l4 = client.heartbeat(l4)
    client.submit(l4, push_submission(store, l4, tmp_path, seed=4))  # stale by one version: admitted, merged
    status = wait_for_checkpoint(client, 2)
    merged = runrepo.read_state(store).versions[2].merged
    assert {m.worker: m.staleness for m in merged} == {"w3": 1, "w4": 1}


def test_the_merge_and_its_checkpoint_render_their_files_with_the_api_lock_released(tmp_path, monkeypatch):
    """The new adapter's files (rendered into the version cache by the merge) and the checkpoint's state.json and
    model card (rendered by the checkpoint commit) are written with the API lock released (the card alone took
    180 ms at 10 versions × 256 rounds, and every call waited behind it): while either renders, a heartbeat and a
    lease answer at once, and the state adopted after each keeps the lease taken meanwhile."""
    from hubgrpo.coordinator import checkpoint, merging

    render, card = merging._render, checkpoint.run_card
    gates = {"adapter": threading.Event(), "card": threading.Event()}
    busy = {"adapter": threading.Event(), "card": threading.Event()}

    def slow_render(c, staged):
        busy["adapter"].set()
        assert gates["adapter"].wait(30), "the test never released the adapter"
        return render(c, staged)

    def slow_card(cfg, state):
        busy["card"].set()
        assert gates["card"].wait(30), "the test never released the card"
        return card(cfg, state)

    monkeypatch.setattr(merging, "_render", slow_render)
    monkeypatch.setattr(checkpoint, "run_card", slow_card)
    apps: list = []
    try:
        store, coord, client = served(tmp_path, apps, **{"coordinator.lease_waits_for_merge_s": 0})
        l1, l2, l3 = client.lease("w1"), client.lease("w2"), client.lease("w3")
        client.submit(l1, push_submission(store, l1, tmp_path, seed=1))
        client.submit(l2, push_submission(store, l2, tmp_path, seed=2))  # quorum 2: the merge is due
        assert busy["adapter"].wait(10)  # the tick thread is rendering version 1's adapter into the version cache
        t0 = time.monotonic()
        assert client.heartbeat(l3).lease_id == l3.lease_id
        l4 = client.lease("w4")
        assert time.monotonic() - t0 < 5 and l4.base_version == 0  # version 1 is not live yet
        assert not busy["card"].is_set()  # no checkpoint while a merge runs
        gates["adapter"].set()
        assert busy["card"].wait(10)  # version 1 is live; the tick thread is rendering its checkpoint's card
        t0 = time.monotonic()
        assert client.heartbeat(l4).lease_id == l4.lease_id
        l5 = client.lease("w5")
        assert time.monotonic() - t0 < 5 and l5.base_version == 1  # leased from the live version
        status = client.status()
        assert status["version"] == 1 and status["checkpoint"]["version"] == 0 and status["version_sha"] is None
        live = coord.state.workers  # the adopted merge: the merged rows, and w4's row from the lease meanwhile
        assert live["w1"].accepted == 1 and live["w2"].accepted == 1 and live["w4"].last_seen
        assert "v000001" not in store.tags()  # not committed yet: the card is still rendering
        gates["card"].set()
        wait_for_checkpoint(client, 1)
        assert sorted(m.worker for m in runrepo.read_state(store).versions[1].merged) == ["w1", "w2"]
        assert store.tags()["v000001"] == coord.shas[1]
        assert coord.state.workers["w5"].last_seen  # the adopted checkpoint keeps the lease taken meanwhile
        assert client.heartbeat(l5).lease_id == l5.lease_id
    finally:
        for gate in gates.values():
            gate.set()
        for app in apps:
            app.close(verbose=False)


def test_a_slow_repo_scan_never_delays_a_merge(tmp_path, monkeypatch):
    """The repo scan runs in its own thread: while a scan pass is stuck (an inbox listing took 10–19 s at 1000
    workers), a quorum still merges at once, and the scan's finds are admitted when it returns."""
    gate, scanning, scan = threading.Event(), threading.Event(), Coordinator.scan

    def slow_scan(self):
        scanning.set()
        assert gate.wait(30), "the test never released the scan"
        return scan(self)

    monkeypatch.setattr(Coordinator, "scan", slow_scan)
    apps: list = []
    try:
        store, coord, client = served(tmp_path, apps, **{"coordinator.scan_interval_s": 0.1})
        assert scanning.wait(10)  # a scan pass is in progress, and stays there until the gate opens
        l1, l2, l3 = client.lease("w1"), client.lease("w2"), client.lease("w3")
        client.submit(l1, push_submission(store, l1, tmp_path, seed=1))
        client.submit(l2, push_submission(store, l2, tmp_path, seed=2))  # quorum 2: due now
        wait_for_version(client, 1, timeout=10)  # merged while the scan is stuck
        push_submission(store, l3, tmp_path, seed=3)  # committed, never submitted: only the scan can find it
        gate.set()
        sub_id = layout.submission_id("w3", l3.lease_id)
        wait_for(lambda: sub_id in client.status()["pending"], 20, "the scanned round")
    finally:
        gate.set()
        for app in apps:
            app.close(verbose=False)


def test_a_lease_waits_for_the_due_merge_and_gets_the_new_version(slow_run, tmp_path):
    start, gate, started = slow_run
    store, coord, client = start()  # lease_waits_for_merge_s: 30 (the default)
    l1, l2 = client.lease("w1"), client.lease("w2")
    client.submit(l1, push_submission(store, l1, tmp_path, seed=1))
    client.submit(l2, push_submission(store, l2, tmp_path, seed=2))
    assert started.wait(10)
    t0 = time.monotonic()
    with pytest.raises(Refused) as e:  # the request is held LEASE_HOLD_S, then told to ask again
        client.lease("w3")
    held = time.monotonic() - t0
    assert e.value.code == "merging" and 0 < e.value.wait_s <= LEASE_RETRY_S
    assert LEASE_HOLD_S - 0.2 <= held < LEASE_HOLD_S + 5
    assert client.status()["merging"] == 1  # heartbeats and status were never blocked meanwhile
    got = {}
    asker = threading.Thread(target=lambda: got.setdefault("lease", client.lease("w3")))
    asker.start()
    asker.join(0.5)
    assert asker.is_alive()  # held: the merge is still running
    gate.set()
    asker.join(20)
    assert got["lease"].base_version == 1


def test_the_merge_wait_is_bounded_per_worker(slow_run, tmp_path):
    start, gate, started = slow_run
    store, coord, client = start(**{"coordinator.lease_waits_for_merge_s": 3})
    l1 = client.lease("w1")
    client.submit(l1, push_submission(store, l1, tmp_path, seed=1))  # quorum 2 not reached: nothing due
    l2 = client.lease("w2")
    client.submit(l2, push_submission(store, l2, tmp_path, seed=2))
    assert started.wait(10)
    with pytest.raises(Refused) as e:  # held 2 s of w3's 3 s
        client.lease("w3")
    assert e.value.code == "merging" and e.value.wait_s <= 1.0
    lease = client.lease("w3")  # held 2 s more: w3's wait is spent, it gets the current version
    assert lease.base_version == 0 and client.status()["merging"] == 1
    gate.set()
    wait_for_version(client, 1)


def test_max_staleness_zero_refuses_leases_while_merging(slow_run, tmp_path):
    start, gate, started = slow_run
    store, coord, client = start(**{"merge.max_staleness": 0, "coordinator.lease_waits_for_merge_s": 0})
    l1, l2 = client.lease("w1"), client.lease("w2")
    client.submit(l1, push_submission(store, l1, tmp_path, seed=1))
    client.submit(l2, push_submission(store, l2, tmp_path, seed=2))
    assert started.wait(10)
    with pytest.raises(Refused) as e:
        client.lease("w1")
    assert e.value.code == "merging" and e.value.wait_s == 0.5
    gate.set()
    wait_for_version(client, 1)
    assert client.lease("w1").base_version == 1


def test_a_failing_merge_keeps_its_submissions_pending(tmp_path, monkeypatch):
    cfg = make_config()
    store = LocalStore(tmp_path / "repo")
    init_repo(store, cfg, write_adapter(tmp_path / "v0", seed=0))
    coord = Coordinator(store, b"secret", workdir=tmp_path / "work")
    compute = MergePlan.compute
    fail = {"left": 1}

    def flaky(plan):
        if fail["left"]:
            fail["left"] -= 1
            raise RuntimeError("out of memory (simulated)")
        return compute(plan)

    monkeypatch.setattr(MergePlan, "compute", flaky)
    app, url = serve(coord, tick_interval=0.2)
    try:
        client = CoordinatorClient(url, retries=1)
        leases = [client.lease(f"w{i}") for i in range(2)]
        for i, lease in enumerate(leases):
            client.submit(lease, push_submission(store, lease, tmp_path, seed=i + 1))
        status = wait_for_version(client, 1)  # the first compute failed; the next tick merged both
        assert fail["left"] == 0 and status["pending"] == [] and len(status["versions"][1]["contributors"]) == 2
    finally:
        app.close(verbose=False)


def test_the_worker_loop_asks_again_after_a_merging_refusal():
    from types import SimpleNamespace

    from hubgrpo.worker.loop import Worker

    answers = [Refused("merging", "a new version is being merged", hint="wait_s=0.7", wait_s=0.7), "the lease"]

    class Client:
        def lease(self, worker, user):
            answer = answers.pop(0)
            if isinstance(answer, Exception):
                raise answer
            return answer

    slept: list[float] = []
    loop = SimpleNamespace(client=Client(), name="w1", user=None, sleep=slept.append)
    assert Worker._lease(loop) == "the lease" and slept == [0.7]


def test_ffa_rounds_are_folded_in_before_the_quorum_and_the_merge_equals_the_full_one(tmp_path, monkeypatch):
    """quorum 3, FFA: the first two submissions are folded into the running sum while the third is awaited; the
    merge at the quorum finishes from the sum (the full merge is not called) and writes the same adapter."""
    import torch

    import hubgrpo.merge
    from hubgrpo import layout
    from hubgrpo.merge import MergeOptions, load_adapter_dir, merge

    cfg = make_config(**{"merge.method": "ffa", "merge.quorum": 3, "rounds.versions": 10,
                         "merge.fleet_outer_lr": "null"})  # outer lr 1: the reference merge below uses it
    store = LocalStore(tmp_path / "repo")
    init_repo(store, cfg, write_adapter(tmp_path / "v0", seed=0, b_scale=0.0))
    coord = Coordinator(store, b"fold-secret", workdir=tmp_path / "coord")
    app, url = serve(coord, tick_interval=0.05)
    client = CoordinatorClient(url, retries=0)
    try:
        leases = [client.lease(f"w{i}") for i in range(3)]
        for i, lease in enumerate(leases[:2]):
            client.submit(lease, push_submission(store, lease, tmp_path, seed=i + 1))
        deadline = time.time() + 10
        while coord.fold is None or len(coord.fold.weights) < 2:
            assert time.time() < deadline, "the first two rounds were never folded in"
            time.sleep(0.05)
        monkeypatch.setattr(hubgrpo.merge, "merge", lambda *a, **k: pytest.fail("the full merge ran"))
        client.submit(leases[2], push_submission(store, leases[2], tmp_path, seed=3))
        wait_for_version(client, 1)
    finally:
        client.close()
        app.close(verbose=False)
    monkeypatch.undo()
    v0 = load_adapter_dir(runrepo.adapter_at(store, coord.shas[0], tmp_path / "a"))
    subs = [load_adapter_dir(runrepo.submission_at(store, 0, layout.submission_id(l.worker, l.lease_id),
                                                   store.head(), tmp_path / f"s{i}")) for i, l in enumerate(leases)]
    full = merge(v0, [(s, v0, 1 / 3) for s in subs], MergeOptions(method="ffa"))
    folded = load_adapter_dir(runrepo.adapter_at(store, coord.shas[1], tmp_path / "b"))
    assert max(float((full.adapter.weights[k] - folded.weights[k]).abs().max()) for k in folded.weights) < 1e-6
    assert any(float(folded.weights[k].abs().max()) > 0 for k in folded.weights if "lora_B" in k)
    assert all(torch.equal(folded.weights[k], v0.weights[k]) for k in folded.weights if "lora_A" in k)
    assert runrepo.read_state(store).versions[1].algorithm == "ffa"


def test_a_served_coordinator_loads_what_admission_needs_before_the_first_round(tmp_path):
    """The reward functions, the prompt data and the current global adapter are loaded when the app is built (with
    torch), not by the first admission while requests are in flight."""
    apps: list = []
    try:
        _, coord, client = served(tmp_path, apps)
        assert coord.reward_check._loaded is not None
        assert coord.state.version in coord.adapters
        assert client.status()["version"] == coord.state.version
    finally:
        for app in apps:
            app.close(verbose=False)


@pytest.mark.parametrize("method", ["svd", "ffa"])
def test_an_idle_coordinator_tick_imports_no_torch(tmp_path, method):
    """The merge thread's first ticks run while Gradio checks that the app answers (3 s budget): importing torch
    there (seconds of CPU under the GIL) made a freshly started coordinator fail to launch."""
    import subprocess
    import sys

    store = LocalStore(tmp_path / "repo")
    init_repo(store, make_config(**{"merge.method": method}), write_adapter(tmp_path / "v0", seed=0))
    code = ("import sys, pathlib; from hubgrpo.coordinator.core import Coordinator; "
            "from hubgrpo.store.local import LocalStore; "
            f"c = Coordinator(LocalStore({str(tmp_path / 'repo')!r}), b's', workdir=pathlib.Path({str(tmp_path)!r})); "
            "c.use_merge_thread(); c.tick(); c.prefold(); c.plan_merge(); print('torch' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "False"


@pytest.mark.parametrize("extra", ["average", "add"])
def test_rounds_beyond_the_quorum_are_averaged_or_each_add_their_step(tmp_path, extra):
    """quorum 1, FFA: three rounds pending when the merge runs (they arrived during the last one) move version 1
    by their mean (``merge.extra_rounds: average``) or by their sum, three steps' worth (``add``)."""
    import torch

    from hubgrpo.merge import load_adapter_dir
    from tests.support.coord_helpers import local_coordinator

    store, c, _ = local_coordinator(tmp_path, **{"merge.method": "ffa", "merge.quorum": 1,
                                                 "merge.extra_rounds": extra,
                                                 "merge.fleet_outer_lr": "null"})  # the mean or sum at outer lr 1
    c.use_merge_thread()  # submit only admits: the three wait for one merge
    leases = [c.lease(f"w{i}") for i in range(3)]
    for i, lease in enumerate(leases):
        assert c.submit(lease, push_submission(store, lease, tmp_path, seed=i + 1))["status"] == "admitted"
    assert c.maybe_merge() and c.state.version == 1 and len(runrepo.read_state(store).versions[1].merged) == 3
    v0 = load_adapter_dir(runrepo.adapter_at(store, c.shas[0], tmp_path / "v0-read"))
    subs = [load_adapter_dir(runrepo.submission_at(store, 0, layout.submission_id(l.worker, l.lease_id),
                                                   store.head(), tmp_path / f"s{i}")) for i, l in enumerate(leases)]
    v1 = load_adapter_dir(runrepo.adapter_at(store, c.shas[1], tmp_path / "v1-read"))
    scale = 1.0 if extra == "add" else 1 / 3
    for key in (k for k in v1.weights if "lora_B" in k):
        expected = v0.weights[key] + scale * sum(s.weights[key] - v0.weights[key] for s in subs)
        assert torch.allclose(v1.weights[key], expected, atol=1e-6), key
        assert float(expected.abs().max()) > 0


def test_added_rounds_count_at_most_one_per_worker(tmp_path):
    """``extra_rounds: add``: three rounds of one worker piled up behind a merge move the version by their mean,
    not by three steps."""
    import torch

    from hubgrpo.merge import load_adapter_dir
    from tests.support.coord_helpers import local_coordinator

    store, c, _ = local_coordinator(tmp_path, **{"merge.method": "ffa", "merge.quorum": 1,
                                                 "merge.extra_rounds": "add"})
    c.use_merge_thread()
    leases = []
    for i in range(3):  # one round after another, each admitted while no merge runs
        leases.append(c.lease("w0"))
        assert c.submit(leases[-1], push_submission(store, leases[-1], tmp_path, seed=i + 1))["status"] == "admitted"
    assert c.maybe_merge() and len(runrepo.read_state(store).versions[1].merged) == 3
    v0 = load_adapter_dir(runrepo.adapter_at(store, c.shas[0], tmp_path / "v0-read"))
    subs = [load_adapter_dir(runrepo.submission_at(store, 0, layout.submission_id(l.worker, l.lease_id),
                                                   store.head(), tmp_path / f"s{i}")) for i, l in enumerate(leases)]
    v1 = load_adapter_dir(runrepo.adapter_at(store, c.shas[1], tmp_path / "v1-read"))
    for key in (k for k in v1.weights if "lora_B" in k):
        mean = v0.weights[key] + sum(s.weights[key] - v0.weights[key] for s in subs) / 3
        assert torch.allclose(v1.weights[key], mean, atol=1e-6), key
