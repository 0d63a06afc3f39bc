"""Workers on rented machines: ``hubgrpo launch`` / ``hubgrpo jobs`` against the Hub emulator's Jobs API (each job
runs as a real local process), and the wheel a deployed Space publishes, installed into a fresh venv."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

from hubgrpo import __version__, layout, runrepo
from hubgrpo.launch.jobs import RUN_LABEL, install_command, run_label
from tests.support.chaos_helpers import wait_for
from tests.conftest import TEST_TOKEN

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "configs" / "tiny.yaml"
EXE = Path(sys.executable).with_name("hubgrpo")
RUN_CFG = ["rounds.steps=2", "rounds.versions=1000", "merge.quorum=1", "params.per_device_train_batch_size=8",
           "coordinator.heartbeat_interval_s=2"]


def _cli(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """The installed ``hubgrpo`` command, as users run it."""
    return subprocess.run([str(EXE), *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def _tiny_run(emu, repo: str, overrides: list[str] = RUN_CFG):
    from hubgrpo.cli.embedded import ensure_repo
    from hubgrpo.config import load_config
    from hubgrpo.store.hub import HubStore

    store = HubStore(repo, token=TEST_TOKEN, endpoint=emu.url, retry_base_s=0.2)
    ensure_repo(store, load_config(TINY, overrides=overrides))
    return store


@pytest.mark.timeout(60)
def test_dry_run_prints_the_specs_and_the_token_goes_only_as_a_secret():
    token = "hf_secret_dry_run_token"
    r = _cli("launch", "--repo", "alice/run1", "--coordinator", "alice/run1-space", "--workers", "2",
             "--flavor", "a10g-small", "--dry-run", "--json", env={"HF_TOKEN": token})
    assert r.returncode == 0, r.stderr
    specs = json.loads(r.stdout)
    assert len(specs) == 2 and len({s["name"] for s in specs}) == 2
    for s in specs:
        assert s["secrets"] == ["HF_TOKEN"] and s["flavor"] == "a10g-small" and s["timeout"] == "2h"
        assert s["labels"] == {RUN_LABEL: run_label("alice/run1"), "hubgrpo-worker": s["name"]}
        assert s["command"][:2] == ["bash", "-c"] and "cuda" in s["image"]
        assert f"wheels/hubgrpo-{__version__}-py3-none-any.whl" in s["command"][2]
        assert f"exec hubgrpo worker --repo alice/run1 --coordinator alice/run1-space --name {s['name']}" \
            in s["command"][2]
    assert token not in r.stdout + r.stderr
    human = _cli("launch", "--repo", "alice/run1", "--coordinator", "alice/run1-space", "--dry-run",
                 "--flavor", "cpu-basic", env={"HF_TOKEN": token})
    assert human.returncode == 0 and "python:3.12 on cpu-basic" in human.stdout and token not in human.stdout
    bad = _cli("launch", "--repo", "alice/run1", "--coordinator", "https://coord.example", "--dry-run")
    assert bad.returncode == 2 and "--install space needs the coordinator as a Space id" in bad.stderr
    local = _cli("launch", "--repo", "./runs/x", "--coordinator", "alice/s", "--dry-run")
    assert local.returncode == 2 and "not a Hub repo id" in local.stderr
    assert run_label("alice/run.1") != run_label("alice/run-1")  # sanitised, yet distinct
    for flag in ("--pipeline", "--no-pipeline"):  # a participant's choice over the run config's worker.pipeline
        r = _cli("launch", "--repo", "alice/run1", "--coordinator", "alice/run1-space", "--dry-run", "--json", flag)
        assert r.returncode == 0 and all(f" {flag}" in s["command"][2] for s in json.loads(r.stdout)), r.stderr
    assert "pipeline" not in json.loads(_cli("launch", "--repo", "alice/run1", "--coordinator", "alice/run1-space",
                                             "--dry-run", "--json").stdout)[0]["command"][2]


@pytest.mark.timeout(420)
def test_launch_starts_jobs_whose_workers_merge_versions_then_jobs_stop_cancels_them(hub_emulator, tmp_path,
                                                                                   monkeypatch):
    """launch → 2 HF Jobs (local processes on the emulator) → versions merged → jobs ls/logs → jobs stop."""
    from hubgrpo.coordinator.core import Coordinator
    from hubgrpo.space.api import serve
    from huggingface_hub import HfApi

    emu, repo = hub_emulator, "alice/jobsrun"
    # state.json in the repo moves at checkpoints: one per version here, not one per 120 s (the Hub's default)
    store = _tiny_run(emu, repo, [*RUN_CFG, "coordinator.checkpoint_every_versions=1"])
    app, url = serve(Coordinator(store, b"jobs-secret", workdir=tmp_path / "coord"), tick_interval=0.2)
    env = {"HF_TOKEN": TEST_TOKEN, "HF_ENDPOINT": emu.url, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # what the jobs' processes inherit from the emulator
    try:
        t0 = time.time()
        r = _cli("launch", "--repo", repo, "--coordinator", url, "--workers", "2", "--flavor", "cpu-basic",
                 "--install", "none", "--prefix", "w", env=env)
        assert r.returncode == 0, r.stderr
        t_launched = time.time()
        assert r.stdout.count("RUNNING") == 2 and "hubgrpo jobs stop --repo alice/jobsrun" in r.stdout
        jobs = list(emu.api.jobs.jobs.values())
        assert len(jobs) == 2 and all(j.spec["secrets"] == {"HF_TOKEN": TEST_TOKEN} for j in jobs)
        assert all(TEST_TOKEN not in json.dumps([j.spec["command"], j.spec["environment"], j.spec["labels"]])
                   for j in jobs)
        assert all(j.spec["environment"]["HF_ENDPOINT"] == emu.url for j in jobs)
        wait_for(lambda: runrepo.read_state(store).version >= 1, 300, "a first version merged by the jobs' workers",
              poll=0.2)
        t_first = time.time()
        wait_for(lambda: runrepo.read_state(store).version >= 2, 300, "2 versions merged by the jobs' workers")
        t_versions = time.time()
        state = runrepo.read_state(store)
        names = {j.spec["labels"]["hubgrpo-worker"] for j in jobs}
        assert {m.worker for v in state.versions for m in v.merged} <= names
        ls = _cli("jobs", "ls", "--repo", repo, "--json", env=env)
        rows = json.loads(ls.stdout)
        assert ls.returncode == 0 and {r["worker"] for r in rows} == names and {r["stage"] for r in rows} == {"RUNNING"}
        name = sorted(names)[0]
        logs = _cli("jobs", "logs", "--repo", repo, "--worker", name, env=env)
        assert logs.returncode == 0 and name in logs.stdout and TEST_TOKEN not in logs.stdout
        stop = _cli("jobs", "stop", "--repo", repo, env=env)
        assert stop.returncode == 0 and "cancelled 2 job(s)" in stop.stdout
        wait_for(lambda: all(j.proc.poll() is not None for j in jobs), 30, "the jobs' processes to end")
        t_stop = time.time()
        api = HfApi(endpoint=emu.url, token=TEST_TOKEN)
        assert {j.status.stage for j in api.list_jobs(labels={RUN_LABEL: run_label(repo)}, namespace="alice")} == {"CANCELED"}
        assert _cli("jobs", "stop", "--repo", repo, env=env).stdout.startswith("cancelled 0 job(s)")
        print(f"timeline: launched in {t_launched - t0:.1f} s → version 1 after {t_first - t0:.1f} s → version 2 "
              f"after {t_versions - t0:.1f} s → stopped after {t_stop - t0:.1f} s")
    finally:
        emu.api.jobs.stop_all()
        app.close(verbose=False)


def _fresh_venv(path: Path) -> Path:
    """A new venv that sees this environment's packages (hubgrpo's dependencies) through a folder of links to
    them — every one but hubgrpo itself, so pip finds the dependencies installed and hubgrpo not."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=120)
    pip = path / "bin" / "pip"  # pip itself comes from the linked packages, as in an image that has it
    pip.write_text('#!/bin/sh\nexec "$(dirname "$0")/python" -m pip "$@"\n')
    pip.chmod(0o755)
    site = Path(subprocess.check_output([str(path / "bin" / "python"), "-c",
                                         "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                        text=True).strip())
    deps = path / "deps"
    deps.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if "hubgrpo" not in entry.name.lower() and entry.suffix != ".pth":
            (deps / entry.name).symlink_to(entry)
    (site / "hubgrpo-deps.pth").write_text(f"{deps}\n")
    return path / "bin"


@pytest.mark.timeout(420)
def test_the_wheel_a_space_publishes_installs_anywhere_and_runs_a_worker(hub_emulator, tmp_path, monkeypatch):
    """deploy → wheels/hubgrpo-<v>.whl in the Space → the install line `hubgrpo launch` gives each job, run in a
    fresh venv → `hubgrpo --version` and one worker round from that install."""
    from hubgrpo.cli.main import main
    from hubgrpo.coordinator.core import Coordinator
    from hubgrpo.space.api import serve
    from hubgrpo.worker.client import CoordinatorClient

    emu = hub_emulator
    monkeypatch.setenv("HF_TOKEN", TEST_TOKEN)
    monkeypatch.setenv("HF_ENDPOINT", emu.url)
    monkeypatch.setenv("HUBGRPO_SECRET", "wheel-secret")
    store = _tiny_run(emu, "alice/wheelrun")
    assert main(["space", "deploy", "--repo", "alice/wheelrun", "--space", "alice/wheel-space"]) == 0
    from huggingface_hub import HfApi

    from hubgrpo.cli.launch_cmd import _check_wheel
    from hubgrpo.errors import ConfigError

    api = HfApi(endpoint=emu.url, token=TEST_TOKEN)
    _check_wheel(api, "alice/wheel-space")  # what `hubgrpo launch --install space` checks before starting jobs
    api.create_repo("alice/bare-space", repo_type="space", space_sdk="gradio")  # deployed by something else
    with pytest.raises(ConfigError, match="does not publish"):
        _check_wheel(api, "alice/bare-space")
    bindir = _fresh_venv(tmp_path / "venv")
    t0 = time.time()
    line = install_command("space", coordinator="alice/wheel-space", endpoint=emu.url)  # private Space: token
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}", "PIP_NO_INDEX": "1",
           "OMP_NUM_THREADS": "1"}
    run = {"env": env, "cwd": str(tmp_path), "capture_output": True, "text": True}  # not this checkout's folder
    done = subprocess.run(["bash", "-c", line + "true"], timeout=300, **run)
    install_s = time.time() - t0
    assert done.returncode == 0, done.stderr[-2000:]
    where = subprocess.run([str(bindir / "python"), "-c", "import hubgrpo; print(hubgrpo.__file__)"], **run).stdout
    assert where.startswith(str(tmp_path / "venv")), where  # imported from the wheel, not from this checkout
    version = subprocess.run([str(bindir / "hubgrpo"), "--version"], **run)
    assert version.returncode == 0 and version.stdout.strip() == f"hubgrpo {__version__}"
    coord = Coordinator(store, b"wheel-secret", workdir=tmp_path / "coord")
    app, url = serve(coord, tick_interval=0.2)
    try:
        w = subprocess.run([str(bindir / "hubgrpo"), "worker", "--repo", "alice/wheelrun", "--coordinator", url,
                            "--name", "fresh", "--max-rounds", "1", "--threads", "1"], timeout=300, **run)
        assert w.returncode == 0, w.stderr[-2000:]
        client = CoordinatorClient(url, retries=1)  # on the Hub, the merged version is live before its checkpoint
        wait_for(lambda: client.status()["version"] >= 1, 60, "the fresh install's round merged")
        assert client.status()["versions"][1]["contributors"] == ["fresh"]
        assert coord.flush() and runrepo.read_state(store).version == 1  # the checkpoint
        assert [m.worker for m in runrepo.read_state(store).versions[1].merged] == ["fresh"]
    finally:
        app.close(verbose=False)
    print(f"wheel install into a fresh venv: {install_s:.1f} s")
    assert layout.wheel_name(__version__) in line


@pytest.mark.timeout(420)
def test_run_with_the_hf_jobs_backend_runs_its_workers_as_jobs(hub_emulator, tmp_path, monkeypatch):
    """`hubgrpo run CONFIG` with backend hf-jobs (AutoTrain-style): the repo on the Hub, workers as jobs, the run
    watched to its end, no job left running."""
    from hubgrpo.coordinator.core import Coordinator
    from hubgrpo.space.api import serve

    emu, repo = hub_emulator, "alice/backendrun"
    store = _tiny_run(emu, repo, [*RUN_CFG, "rounds.versions=2"])  # the coordinator below needs the repo first
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    app, url = serve(Coordinator(store, b"backend-secret", workdir=tmp_path / "coord"), tick_interval=0.2)
    try:
        sets = ["backend=hf-jobs", "backend_options.workers=2", "backend_options.flavor=cpu-basic",
                "backend_options.install=none", f"backend_options.coordinator={url}", *RUN_CFG, "rounds.versions=2"]
        r = _cli("run", str(TINY), "--repo", repo, *[x for s in sets for x in ("--set", s)], timeout=400,
                 env={"HF_TOKEN": TEST_TOKEN, "HF_ENDPOINT": emu.url})
        assert r.returncode == 0, r.stderr[-3000:]
        assert "2 HF Jobs (cpu-basic)" in r.stdout and runrepo.read_state(store).version >= 2
        jobs = list(emu.api.jobs.jobs.values())
        assert len(jobs) == 2 and all(j.spec["labels"][RUN_LABEL] == run_label(repo) for j in jobs)
        wait_for(lambda: all(j.proc.poll() is not None for j in jobs), 30, "the jobs to end")
        assert {j.stage for j in jobs} <= {"COMPLETED", "CANCELED"}
        assert TEST_TOKEN not in r.stdout + r.stderr
    finally:
        emu.api.jobs.stop_all()
        app.close(verbose=False)
