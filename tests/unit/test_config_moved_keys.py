"""Keys that left ``params`` (``rounds``: the run's schedule; ``worker``: the machine's own): still accepted at
their old place with a deprecation warning, refused when the old and the new one disagree, and never used by the
files the project ships."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import yaml

from hubgrpo.cli.main import main
from hubgrpo.config import Config, ParamsConfig, deprecations, loads, to_yaml
from hubgrpo.config.legacy import MOVED, migrate
from hubgrpo.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
MINIMAL = "base_model: builtin:tiny\nproject_name: t\n"
NOTE = "params.versions is now rounds.versions; write it there"


def test_an_old_key_is_read_at_its_new_place_and_warned_once(caplog):
    with caplog.at_level(logging.WARNING, logger="hubgrpo.config"):
        cfg = loads(MINIMAL + "params: {versions: 3, num_threads: 2, learning_rate: 0.1}\n", source="old.yaml")
    assert cfg.rounds.versions == 3 and cfg.worker.threads == 2 and cfg.params.learning_rate == 0.1
    assert deprecations(cfg) == [NOTE, "params.num_threads is now worker.threads; write it there"]
    warned = [r.getMessage() for r in caplog.records if r.name == "hubgrpo.config"]
    assert warned == [f"old.yaml: deprecated: {note}" for note in deprecations(cfg)]


def test_the_new_layout_loads_without_a_note(caplog):
    with caplog.at_level(logging.WARNING, logger="hubgrpo.config"):
        cfg = loads(MINIMAL + "rounds: {versions: 3, steps: 2}\nworker: {threads: 2}\n")
    assert (cfg.rounds.versions, cfg.rounds.steps, cfg.worker.threads) == (3, 2, 2)
    assert deprecations(cfg) == [] and not caplog.records


def test_an_old_key_in_an_override_goes_to_its_new_place_and_wins():
    cfg = loads(MINIMAL + "rounds: {versions: 10}\n", overrides=["params.versions=3", "params.steps_per_round=2"])
    assert cfg.rounds.versions == 3 and cfg.rounds.steps == 2
    assert deprecations(cfg) == [NOTE, "params.steps_per_round is now rounds.steps; write it there"]
    old_file = loads(MINIMAL + "params: {versions: 10}\n", overrides=["rounds.versions=4"])
    assert old_file.rounds.versions == 4 and deprecations(old_file) == [NOTE]


def test_an_old_key_and_its_new_one_that_disagree_are_refused_naming_both():
    with pytest.raises(ConfigError) as ei:
        loads(MINIMAL + "params:\n  versions: 3\nrounds:\n  versions: 5\n", source="both.yaml")
    message = str(ei.value)
    assert "params.versions (3) and rounds.versions (5) are both set" in message
    assert "both.yaml, line 4 and line 6" in message and "keep only rounds.versions" in message
    same = loads(MINIMAL + "params: {versions: 5}\nrounds: {versions: 5}\n")  # agreeing: read, and warned
    assert same.rounds.versions == 5 and deprecations(same) == [NOTE]


def test_config_validate_prints_the_deprecations(tmp_path, capsys):
    old = tmp_path / "old.yaml"
    old.write_text(MINIMAL + "params: {versions: 3}\n")
    assert main(["config", "validate", str(old), "--set", "params.share_prompts=false"]) == 0
    err = capsys.readouterr().err
    assert f"warning: deprecated: {NOTE}" in err
    assert "warning: deprecated: params.share_prompts is now worker.share_prompts; write it there" in err
    assert err.count("params.versions is now") == 1  # printed once, not logged besides
    new = tmp_path / "new.yaml"
    new.write_text(MINIMAL + "rounds: {versions: 3}\n")
    assert main(["config", "validate", str(new)]) == 0
    assert "deprecated" not in capsys.readouterr().err


def test_a_run_repos_old_layout_config_is_read_as_data():
    """A worker reads a run repo's stored config unexpanded: an old-layout one moves as it is, ${...} and all."""
    text = MINIMAL + 'params: {steps_per_round: 2, device: "${DEVICE}"}\n'
    cfg = loads(text, expand=False, env={"DEVICE": "cuda"})
    assert cfg.rounds.steps == 2 and cfg.worker.device == "${DEVICE}"


def test_a_value_from_the_environment_keeps_its_placeholder_at_the_new_place():
    cfg = loads(MINIMAL + 'params: {device: "${DEVICE}"}\n', env={"DEVICE": "cpu"})
    assert cfg.worker.device == "cpu"
    assert yaml.safe_load(to_yaml(cfg))["worker"]["device"] == "${DEVICE}"


def test_the_stored_config_is_in_the_new_layout():
    """What `hubgrpo init` writes to the run repo (``to_yaml``): the new sections, no old key; it loads quietly."""
    cfg = loads(MINIMAL + "params: {steps_per_round: 2, versions: 4, run_lr_schedule: cosine, num_threads: 1}\n")
    stored = yaml.safe_load(to_yaml(cfg, drop_secrets=True))
    assert stored["rounds"]["steps"] == 2 and stored["rounds"]["lr_schedule"] == "cosine"
    assert stored["worker"]["threads"] == 1
    assert not {old.split(".")[1] for old in MOVED} & set(stored["params"])
    assert deprecations(loads(to_yaml(cfg, drop_secrets=True), expand=False)) == []


def test_a_config_built_in_python_moves_old_keys_too():
    cfg = Config(base_model="builtin:tiny", project_name="t", params={"versions": 3, "learning_rate": 0.1})
    assert cfg.rounds.versions == 3 and deprecations(cfg) == [NOTE]
    assert migrate({"params": {"seed": 1}}) == ({"params": {"seed": 1}}, [])  # nothing moved: the same mapping


def test_every_moved_key_has_a_field_at_its_new_place_and_none_at_its_old():
    for old, new in MOVED.items():
        section, key = new.split(".")
        assert key in Config.model_fields[section].annotation.model_fields, new
        assert old.split(".")[1] not in ParamsConfig.model_fields, old


def test_what_a_lease_sets_is_still_params():
    """The wire format is unchanged: a lease's ``params`` hold GRPO fields, which stayed in ``params``."""
    from hubgrpo.worker.lease_bounds import LEASE_PARAMS

    assert set(LEASE_PARAMS) <= set(ParamsConfig.model_fields)


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("rounds: {steps: 0}", "rounds.steps"),
        ("rounds: {versions: 0}", "rounds.versions"),
        ("rounds: {lr_final: 0}", "rounds.lr_final"),
        ("rounds: {fleet_batch: halves}", "rounds.fleet_batch"),
        ("worker: {threads: 0}", "worker.threads"),
        ("worker: {dtype: float8}", "worker.dtype"),
        ("worker: {no_such_key: 1}", "worker.no_such_key"),
    ],
)
def test_the_new_sections_validate_their_fields(text, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        loads(MINIMAL + text + "\n")


def test_a_split_fleet_batch_needs_whole_prompt_groups():
    with pytest.raises(ConfigError, match=r"rounds\.fleet_batch split .* multiple of num_generations"):
        loads(
            MINIMAL + "params: {per_device_train_batch_size: 6, num_generations: 4, gradient_accumulation_steps: 2}\n"
            "rounds: {fleet_batch: split}\n"
        )  # whole groups per step, but not in a worker's share of the batch


SHIPPED = sorted([*ROOT.glob("configs/*.yaml"), *ROOT.glob("examples/**/*.yaml")])


@pytest.mark.parametrize("path", SHIPPED, ids=[str(p.relative_to(ROOT)) for p in SHIPPED])
def test_shipped_configs_use_no_deprecated_key(path):
    raw = yaml.safe_load(path.read_text())
    assert migrate(raw)[1] == [], f"{path.relative_to(ROOT)} writes a key at a place it moved from"


def test_there_are_shipped_configs():
    assert len(SHIPPED) >= 5
