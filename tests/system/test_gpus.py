"""``hubgrpo worker --gpus``: one worker process per GPU, and ``hubgrpo launch`` asking for it on multi-GPU flavors.

The GPUs are faked at the process boundary only: the parent runs with ``CUDA_VISIBLE_DEVICES=0,1`` (or a fake
``nvidia-smi`` on PATH), and each child is the real ``python -m hubgrpo.cli worker``. A ``sitecustomize`` on the
children's PYTHONPATH (``_hook``) records what each child got — its argv, ``CUDA_VISIBLE_DEVICES``, its parent —
and, for the supervision tests, replaces the child's work with a failure or a wait for a signal.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hubgrpo.launch.jobs import gpu_count, worker_specs
from tests.support.chaos_helpers import wait_for

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "configs" / "tiny.yaml"
# worker.device auto: the machine decides (cpu here, where the GPUs are faked); --gpus passes --device cuda to its
# children over any other device the run names
RUN_CFG = ["rounds.steps=1", "rounds.versions=1000", "merge.quorum=1", "params.per_device_train_batch_size=8",
           "worker.device=auto"]

# GPUS_TEST_MODE: record (then run the real worker), fail1 (the GPU-1 child exits 3 at once, the other exits 0
# after a second), wait (record every forwarded signal, exit 128 + N on it)
HOOK = """\
import json, os, signal, sys, time
if os.environ.get("GPUS_TEST_LOG") and "worker" in sys.argv and "--gpus" not in sys.argv:
    def _note(**extra):
        row = {"argv": sys.argv, "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"), "pid": os.getpid(),
               "ppid": os.getppid(), "parent_env": os.environ.get("HUBGRPO_PARENT_PID"), **extra}
        with open(os.environ["GPUS_TEST_LOG"], "a") as f:
            f.write(json.dumps(row) + "\\n")
    _note()
    _mode = os.environ.get("GPUS_TEST_MODE", "record")
    if _mode == "fail1":
        if os.environ.get("CUDA_VISIBLE_DEVICES") == "1":
            os._exit(3)
        time.sleep(1.5)
        _note(done=True)
        os._exit(0)
    if _mode == "wait":
        def _on(signum, frame):
            _note(signal=signum)
            os._exit(128 + signum)
        signal.signal(signal.SIGINT, _on)
        signal.signal(signal.SIGTERM, _on)
        time.sleep(60)
        os._exit(0)
"""


def _env(tmp_path: Path, mode: str, cvd: str | None) -> dict:
    hook = tmp_path / "hook"
    hook.mkdir(exist_ok=True)
    (hook / "sitecustomize.py").write_text(HOOK)
    env = dict(os.environ, GPUS_TEST_LOG=str(tmp_path / "children.jsonl"), GPUS_TEST_MODE=mode,
               PYTHONPATH=os.pathsep.join([str(hook), str(ROOT), os.environ.get("PYTHONPATH", "")]),
               HUBGRPO_CACHE=str(tmp_path / "cache"), OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    env.pop("CUDA_VISIBLE_DEVICES", None)
    if cvd is not None:
        env["CUDA_VISIBLE_DEVICES"] = cvd
    return env


def _worker_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "hubgrpo.cli", "worker", *args]


def _worker(tmp_path: Path, mode: str, *args: str, cvd: str | None = "0,1", env: dict | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(_worker_cmd(*args), capture_output=True, text=True, timeout=timeout, cwd=str(ROOT),
                          env={**_env(tmp_path, mode, cvd), **(env or {})})


def _children(tmp_path: Path, *, started: bool = False) -> list[dict]:
    """What the children recorded; ``started``: only the row each wrote as it started."""
    log = tmp_path / "children.jsonl"
    rows = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return [r for r in rows if len(r) == 5] if started else rows


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> str:
    """A real run repo (the parent reads its config); the supervision tests' children never reach it."""
    from hubgrpo.cli.embedded import ensure_repo
    from hubgrpo.config import load_config
    from hubgrpo.store.local import LocalStore

    store = LocalStore(tmp_path_factory.mktemp("gpus") / "repo")
    ensure_repo(store, load_config(TINY, overrides=RUN_CFG))
    return str(store.root)


def _name(row: dict) -> str:
    return row["argv"][row["argv"].index("--name") + 1]


@pytest.mark.timeout(300)
def test_two_visible_gpus_run_two_real_workers_each_on_its_own_gpu_and_lease(tmp_path):
    from hubgrpo.cli.embedded import ensure_repo
    from hubgrpo.config import load_config
    from hubgrpo.coordinator.core import Coordinator
    from hubgrpo.space.api import serve
    from hubgrpo.store.local import LocalStore

    store = LocalStore(tmp_path / "repo")
    ensure_repo(store, load_config(TINY, overrides=RUN_CFG))
    coord = Coordinator(store, b"gpus-secret", workdir=tmp_path / "coord")
    app, url = serve(coord, tick_interval=0.2)
    try:
        r = _worker(tmp_path, "record", "--repo", str(store.root), "--coordinator", url, "--name", "box",
                    "--gpus", "all", "--max-rounds", "1", "--threads", "1", "--quiet", timeout=240)
        assert r.returncode == 0, r.stdout + r.stderr
        wait_for(lambda: len(coord.status()["leaderboard"]) == 2, 40, "both rounds merged", poll=0.2)
        board = {row["worker"] for row in coord.status()["leaderboard"]}
    finally:
        app.close(verbose=False)
    rows = _children(tmp_path, started=True)
    assert len(rows) == 2 and {_name(c): c["cvd"] for c in rows} == {"box-gpu0": "0", "box-gpu1": "1"}
    parent = {c["ppid"] for c in rows}
    assert len(parent) == 1 and {c["parent_env"] for c in rows} == {str(parent.pop())}  # orphans stop
    assert "box-gpu0: 1 rounds submitted" in r.stdout and "box-gpu1: 1 rounds submitted" in r.stdout
    assert board == {"box-gpu0", "box-gpu1"}  # each child leased and submitted under its own name


@pytest.mark.timeout(60)
def test_gpus_names_only_the_chosen_gpus_and_nvidia_smi_counts_them(tmp_path, repo):
    """Without CUDA_VISIBLE_DEVICES the GPUs are what `nvidia-smi -L` lists (a fake one on PATH here)."""
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text("#!/bin/sh\n" + "".join(f"echo 'GPU {i}: NVIDIA Fake (UUID: GPU-{i}abc)'\n" for i in range(4)))
    smi.chmod(0o755)
    path = {"PATH": f"{smi.parent}{os.pathsep}{os.environ['PATH']}"}
    r = _worker(tmp_path, "fail1", "--repo", repo, "--coordinator", "http://127.0.0.1:9",
                "--name", "n", "--gpus", "3, 0", cvd=None, env=path)
    assert r.returncode == 0, r.stderr  # the fail1 hook fails only the child on device "1"
    assert sorted((_name(c), c["cvd"]) for c in _children(tmp_path, started=True)) == [("n-gpu0", "0"), ("n-gpu3", "3")]
    # with CUDA_VISIBLE_DEVICES set, its entries win, and the indices count them: index 1 is device "7"
    r = _worker(tmp_path, "fail1", "--repo", repo, "--coordinator", "http://127.0.0.1:9",
                "--name", "m", "--gpus", "1", cvd="5,7", env=path)
    assert r.returncode == 0, r.stderr
    started = [(_name(c), c["cvd"]) for c in _children(tmp_path, started=True)]
    assert [c for c in started if c[0].startswith("m-")] == [("m-gpu1", "7")]


@pytest.mark.timeout(60)
def test_a_failed_child_leaves_the_others_running_and_fails_the_parent(tmp_path, repo):
    r = _worker(tmp_path, "fail1", "--repo", repo, "--coordinator", "http://127.0.0.1:9",
                "--name", "box", "--gpus", "all")
    assert r.returncode == 3, r.stderr
    done = [c for c in _children(tmp_path) if c.get("done")]
    assert [_name(c) for c in done] == ["box-gpu0"]  # it went on to the end after its sibling died
    assert "box-gpu1: exited with status 3; 1 still running" in r.stderr
    assert "1 of 2 workers failed: box-gpu1 (GPU 1): 3" in r.stderr


@pytest.mark.timeout(120)
def test_a_run_that_names_one_gpu_gives_each_child_its_own_as_cuda(tmp_path):
    """A run config with ``worker.device: cuda:1`` would name a GPU that no child sees (each sees one, as cuda:0):
    the children get ``--device cuda``; a ``--device`` other than auto or cuda with ``--gpus``, or no device at
    all, is refused before anything runs."""
    from hubgrpo import layout
    from hubgrpo.cli.embedded import ensure_repo
    from hubgrpo.config import load_config
    from hubgrpo.store.local import LocalStore

    store = LocalStore(tmp_path / "repo")
    ensure_repo(store, load_config(TINY, overrides=RUN_CFG))
    text = re.sub(r"(\n  device: )\S+", r"\1cuda:1", store.read(layout.CONFIG_FILE).decode(), count=1)
    assert "device: cuda:1" in text  # the run's config names a GPU (this CPU has none to build version 0 on)
    store.commit({layout.CONFIG_FILE: text.encode()}, message="the run names GPU 1")
    for i, given in enumerate(([], ["--device", "cuda"])):  # the run's cuda:1, with or without --device cuda
        (tmp_path / str(i)).mkdir()
        _worker(tmp_path / str(i), "fail1", "--repo", str(store.root), "--coordinator", "http://127.0.0.1:9",
                "--name", "box", "--gpus", "all", *given)
        started = _children(tmp_path / str(i), started=True)
        assert len(started) == 2, started
        for child in started:
            argv = child["argv"]
            assert argv[argv.index("--device") + 1] == "cuda", argv
    for device, message in (("cpu", "--device cpu names another"), ("cuda:1", "--device cuda:1 names another"),
                            ("cuda:0,1", "--device 'cuda:0,1' is no device")):
        r = _worker(tmp_path, "record", "--repo", str(store.root), "--gpus", "all", "--device", device)
        assert r.returncode == 2 and message in r.stderr and "hint:" in r.stderr, r.stderr


@pytest.mark.timeout(60)
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_the_parent_forwards_a_signal_to_every_child_and_waits_for_them(tmp_path, repo, signum):
    proc = subprocess.Popen(_worker_cmd("--repo", repo, "--coordinator", "http://127.0.0.1:9",
                                        "--name", "box", "--gpus", "0,1"),
                            env=_env(tmp_path, "wait", "0,1"), cwd=str(ROOT), stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        wait_for(lambda: len(_children(tmp_path, started=True)) == 2, 30, "both children started", poll=0.1)
        time.sleep(2.0)  # their handlers are set right after they record (a loaded machine may lag)
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    got = {_name(c): c["signal"] for c in _children(tmp_path) if "signal" in c}
    assert got == {"box-gpu0": signum, "box-gpu1": signum}, err
    assert proc.returncode == 128 + signum and "2 of 2 workers failed" in err


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("gpus", "cvd", "message"), [
    ("0,0", "0,1", "--gpus '0,0' lists GPU 0 twice"),
    ("x", "0,1", "--gpus 'x': 'x' is not a GPU index"),
    ("2", "0,1", "--gpus '2': GPU 2 is not visible (2 visible: 0, 1)"),
    ("all", "", "no GPU visible (CUDA_VISIBLE_DEVICES='' lists none)"),
    ("0", "-1", "no GPU visible"),
])
def test_bad_gpus_are_refused_with_the_problem_and_the_fix(tmp_path, gpus, cvd, message):
    r = _worker(tmp_path, "record", "--repo", str(tmp_path / "nowhere"), "--gpus", gpus, cvd=cvd)
    assert r.returncode == 2 and message in r.stderr and "hint:" in r.stderr, r.stderr
    assert "nowhere" not in r.stderr  # refused before the repo is read
    assert not _children(tmp_path)
    if message.startswith("no GPU"):
        assert "drop --gpus" in r.stderr


@pytest.mark.timeout(120)
def test_no_gpu_anywhere_is_refused_after_asking_torch(tmp_path):
    """No CUDA_VISIBLE_DEVICES, no nvidia-smi: torch.cuda.device_count() in a subprocess decides (0 on this CPU)."""
    bare = tmp_path / "bin"
    bare.mkdir()
    r = _worker(tmp_path, "record", "--repo", str(tmp_path / "nowhere"), "--gpus", "all", cvd=None,
                env={"PATH": str(bare)})
    assert r.returncode == 2 and "no GPU visible (torch.cuda.device_count() lists none)" in r.stderr, r.stderr


def test_a_multi_gpu_flavor_runs_one_worker_per_gpu_in_each_job():
    assert [gpu_count(f) for f in ("cpu-basic", "cpu-upgrade", "t4-small", "l4x1", "a10g-large", "a100-large",
                                   "h200", "a10g-largex2", "l4x4", "a10g-largex4", "h100x8", "l40sx8")] == \
        [0, 0, 1, 1, 1, 1, 1, 2, 4, 4, 8, 8]
    for flavor, per_gpu in (("a10g-largex2", True), ("h100x8", True), ("l4x1", False), ("t4-small", False),
                            ("cpu-basic", False)):
        for spec in worker_specs("alice/run1", "alice/s", workers=2, flavor=flavor, install="none",
                                 worker_args=["--allow-reward", "m:f"]):
            line = spec.command[-1]
            assert line.startswith(f"exec hubgrpo worker --repo alice/run1 --coordinator alice/s --name {spec.name}")
            assert ("--gpus all" in line) == per_gpu and line.endswith("--allow-reward m:f"), (flavor, line)
