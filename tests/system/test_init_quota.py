"""``hubgrpo init`` on a Hub repo fits the config to the Hub's commit quota before anything is created, through
the installed ``hubgrpo`` command against the Hub emulator (its quota on):

- a commit budget above the quota is refused, naming the key, the value, the quota and the fix, and no repo is
  created;
- rounds go through the coordinator (``hub.submissions: coordinator``) unless the config says where they go;
  ``hub.submissions: null`` written out keeps one commit per round in the run repo, with a note of the fleet
  that fits;
- the checkpoint interval is written into the stored config, and raised where checkpoints alone would take more
  than half the budget;
- a local folder takes the config as it is; ``hubgrpo config validate --repo`` says the same as init.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from huggingface_hub import HfApi

from hubgrpo import layout, runrepo
from hubgrpo.config import loads
from hubgrpo.errors import ConfigError
from hubgrpo.store.hub import HubStore
from hubgrpo.store.local import LocalStore
from tests.conftest import TEST_TOKEN

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "configs" / "tiny.yaml"
EXE = Path(sys.executable).with_name("hubgrpo")
MINIMAL = "base_model: builtin:tiny\nproject_name: q\n"
QUOTA = HubStore.hourly_commit_quota  # the Hub's 128 commits an hour per repo


def cli(*args: str, hub=None, cwd: Path | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if hub is not None:
        env.update(HF_ENDPOINT=hub.url, HF_TOKEN=TEST_TOKEN)
    return subprocess.run([str(EXE), *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)


def stored_config(hub, name: str):
    store = HubStore(f"alice/{name}", token=TEST_TOKEN, endpoint=hub.url)
    return runrepo.read_config(store), store.read(layout.CONFIG_FILE).decode()


@pytest.mark.timeout(240)
def test_init_on_hub_routes_rounds_via_coordinator_and_writes_checkpoint_interval(hub_emulator, tmp_path):
    hub_emulator.set_commit_quota(QUOTA)
    done = cli("init", str(TINY), "--repo", "alice/fit", hub=hub_emulator, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "alice/fit is on the Hub (about 128 commits an hour per repo)" in out, out
    assert "changed hub.submissions: unset -> coordinator" in out and "hub.submissions: null" in out, out
    assert "changed coordinator.checkpoint_every_s: unset -> 120" in out, out
    assert out.index("changed") < out.index("initialised")  # said before the repo is made
    cfg, text = stored_config(hub_emulator, "fit")
    assert cfg.hub.submissions == "coordinator"
    assert cfg.coordinator.checkpoint_every_s == 120 and "checkpoint_every_s: 120" in text
    assert cfg.coordinator.commit_budget_per_hour == 60 and cfg.coordinator.checkpoint_interval_s == 120


@pytest.mark.timeout(60)
def test_init_refuses_a_budget_above_the_quota_before_creating_the_repo(hub_emulator, tmp_path):
    done = cli("init", str(TINY), "--repo", "alice/over", "--set", "coordinator.commit_budget_per_hour=500",
               hub=hub_emulator, cwd=tmp_path)
    assert done.returncode == 2, (done.stdout, done.stderr[-3000:])
    err = done.stderr
    assert "coordinator.commit_budget_per_hour is 500" in err and "quota of about 128" in err, err
    assert "--set coordinator.commit_budget_per_hour=N with N <= 128" in err, err
    assert not HfApi(endpoint=hub_emulator.url, token=TEST_TOKEN).repo_exists("alice/over")


@pytest.mark.timeout(240)
def test_init_raises_a_short_checkpoint_interval_and_notes_the_fleet_for_rounds_in_the_repo(hub_emulator, tmp_path):
    done = cli("init", str(TINY), "--repo", "alice/inrepo", "--set", "coordinator.checkpoint_every_s=10",
               "--set", "hub.submissions=null", hub=hub_emulator, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "changed coordinator.checkpoint_every_s: 10 -> 120" in out and "every 10 s (up to 360 commits an hour)" in out, out
    assert "hub.submissions: unset" not in out  # the user's explicit choice is kept ...
    assert "one commit per round in the run repo" in out and "leaves 30 rounds an hour" in out, out  # ... noted
    assert "7 workers with 15-min rounds" in out, out
    cfg, _ = stored_config(hub_emulator, "inrepo")
    assert cfg.hub.submissions is None and cfg.coordinator.checkpoint_every_s == 120


@pytest.mark.timeout(240)
def test_init_in_a_local_folder_keeps_the_config_as_it_is(tmp_path):
    done = cli("init", str(TINY), "--repo", str(tmp_path / "local"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "changed" not in done.stdout and "on the Hub" not in done.stdout, done.stdout
    cfg = runrepo.read_config(LocalStore(tmp_path / "local"))
    assert cfg.hub.submissions is None and cfg.coordinator.checkpoint_every_s is None


@pytest.mark.timeout(60)
def test_config_validate_says_what_init_changes_on_the_hub_and_fails_what_it_refuses(tmp_path):
    warned = cli("config", "validate", str(TINY), "--repo", "alice/run", cwd=tmp_path)
    assert warned.returncode == 0, warned.stderr
    assert "warning: on the Hub, `hubgrpo init` changes hub.submissions: unset -> coordinator" in warned.stderr
    assert "changes coordinator.checkpoint_every_s: unset -> 120" in warned.stderr, warned.stderr
    local = cli("config", "validate", str(TINY), "--repo", str(tmp_path / "here"), cwd=tmp_path)
    assert local.returncode == 0 and "warning" not in local.stderr, local.stderr
    over = cli("config", "validate", str(TINY), "--repo", "alice/run", "--set",
               "coordinator.commit_budget_per_hour=129", cwd=tmp_path)
    assert over.returncode == 2 and "coordinator.commit_budget_per_hour is 129" in over.stderr, over.stderr


def fit(*overrides: str):
    from hubgrpo.config.quota import fit_hub_quota

    return fit_hub_quota(loads(MINIMAL, overrides=list(overrides)), QUOTA)


def test_fit_keeps_checkpoints_within_half_of_every_budget_the_hub_allows():
    from hubgrpo.config.quota import checkpoint_floor_s

    for budget in range(1, QUOTA + 1):
        for every in (None, 0, 1, 59, 3600):
            fitted = fit(f"coordinator.commit_budget_per_hour={budget}",
                         f"coordinator.checkpoint_every_s={'null' if every is None else every}").config.coordinator
            assert 3600 / fitted.checkpoint_interval_s <= budget / 2, (budget, every)
            assert fitted.checkpoint_every_s == max(every or 0, checkpoint_floor_s(budget))
    assert checkpoint_floor_s(128) == 57 and checkpoint_floor_s(60) == 120 and checkpoint_floor_s(7) == 1029


def test_fit_changes_a_copy_keeps_explicit_choices_and_refuses_only_what_cannot_fit():
    from hubgrpo.config.quota import fit_hub_quota, round_room

    cfg = loads(MINIMAL)
    fitted = fit_hub_quota(cfg, QUOTA)
    assert cfg.hub.submissions is None and cfg.coordinator.checkpoint_every_s is None  # the caller's is untouched
    assert fitted.config.hub.submissions == "coordinator" and len(fitted.changes) == 2 and fitted.notes == []
    s3 = fit("hub.submissions=s3://bkt/rounds", "coordinator.checkpoint_every_s=600",
             "coordinator.checkpoint_every_versions=1")
    assert s3.config.hub.submissions == "s3://bkt/rounds" and s3.changes == []
    assert s3.config.coordinator.checkpoint_every_s == 600
    assert len(s3.notes) == 1 and "checkpoint_every_versions: 1" in s3.notes[0]
    assert fit("coordinator.commit_budget_per_hour=128").config.coordinator.commit_budget_per_hour == 128
    with pytest.raises(ConfigError, match="commit_budget_per_hour is 129"):
        fit("coordinator.commit_budget_per_hour=129")
    inrepo = fit("hub.submissions=null").config
    assert inrepo.hub.submissions is None and round_room(inrepo) == 30
    with pytest.raises(ConfigError, match=r"budget_per_hour \(1\) leaves no commit an hour for rounds"):
        fit("hub.submissions=null", "coordinator.commit_budget_per_hour=1")
    assert round_room(fit("hub.submissions=null", "coordinator.commit_budget_per_hour=2").config) == 1


@pytest.mark.timeout(240)
def test_init_run_api_fits_the_config_on_the_hub_and_says_so(hub_emulator, monkeypatch):
    from hubgrpo.python_api import init_run

    monkeypatch.setenv("HF_ENDPOINT", hub_emulator.url)
    monkeypatch.setenv("HF_TOKEN", TEST_TOKEN)
    said: list[str] = []
    init_run(TINY, "alice/api", echo=said.append)
    assert any("changed hub.submissions: unset -> coordinator" in s for s in said), said
    cfg, _ = stored_config(hub_emulator, "api")
    assert cfg.hub.submissions == "coordinator" and cfg.coordinator.checkpoint_every_s == 120
    again: list[str] = []
    init_run(TINY, "alice/api", echo=again.append)  # an existing run is resumed: nothing changed, nothing said
    assert again == []
