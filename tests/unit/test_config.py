"""Config: YAML load, ${ENV} expansion, overrides, unknown keys, errors with key path and line, CLI in process."""

from __future__ import annotations

from pathlib import Path

import pytest

from hubgrpo.cli.main import main
from hubgrpo.config import Config, load_config, loads, to_yaml
from hubgrpo.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
MINIMAL = "base_model: builtin:tiny\nproject_name: t\n"


def test_minimal_config_fills_documented_defaults():
    cfg = loads(MINIMAL)
    assert cfg.task == "llm-grpo" and cfg.merge.method == "ffa" and cfg.merge.rebase and cfg.lora.r == 16
    assert cfg.rewards[0].function == "builtin:exact_answer"
    for name, f in Config.model_fields.items():
        assert f.description, f"field {name} is undocumented"


def test_every_field_is_documented():
    from hubgrpo.config import field_docs

    rows = field_docs()
    assert len(rows) > 50
    missing = [k for k, _, doc in rows if not doc]
    assert missing == []


def test_env_expansion_with_and_without_default():
    text = MINIMAL + "hub:\n  repo_id: ${HUB_USER:-me}/run\n  token: ${TOKEN_X}\n"
    cfg = loads(text, env={"TOKEN_X": "hf_abc"})
    assert cfg.hub.repo_id == "me/run" and cfg.hub.token.get_secret_value() == "hf_abc"
    cfg = loads(text, env={"TOKEN_X": "hf_abc", "HUB_USER": "bob"})
    assert cfg.hub.repo_id == "bob/run"
    with pytest.raises(ConfigError, match=r"hub.token: environment variable TOKEN_X is not set"):
        loads(text, env={})


def test_blank_env_default_means_unset():
    cfg = loads(MINIMAL + "coordinator:\n  url: ${NOPE:-}\n", env={})
    assert cfg.coordinator.url is None


def test_dotted_overrides_are_parsed_as_yaml():
    cfg = loads(MINIMAL, overrides=["params.learning_rate=1e-4", "lora.target_modules=[q_proj, v_proj]",
                                    "merge.nesterov=true"])
    assert cfg.params.learning_rate == pytest.approx(1e-4)
    assert cfg.lora.target_modules == ["q_proj", "v_proj"] and cfg.merge.nesterov is True
    with pytest.raises(ConfigError, match="key.path=value"):
        loads(MINIMAL, overrides=["params.learning_rate"])


def test_unknown_key_names_path_and_line():
    text = MINIMAL + "params:\n  learning_rate: 1.0e-4\n  learnig_rate: 3\n"
    with pytest.raises(ConfigError) as ei:
        loads(text, source="x.yaml")
    msg = str(ei.value)
    assert "params.learnig_rate (x.yaml, line 5)" in msg and "unknown key" in msg


def test_bad_value_names_value_and_allowed():
    with pytest.raises(ConfigError) as ei:
        loads(MINIMAL + "merge:\n  method: average\n", source="m.yaml")
    msg = str(ei.value)
    assert "merge.method (m.yaml, line 4): got 'average'" in msg and "'svd'" in msg


def test_invalid_yaml_and_wrong_top_level():
    with pytest.raises(ConfigError, match="line 2"):
        loads("base_model: x\n  bad: [\n", source="y.yaml")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        loads("- a\n- b\n")
    with pytest.raises(ConfigError, match="project_name"):
        loads("base_model: x\nproject_name: 'a b/c'\n")


def test_to_yaml_redacts_secrets_and_round_trips():
    cfg = loads(MINIMAL + "hub:\n  token: hf_supersecret\n")
    text = to_yaml(cfg)
    assert "hf_supersecret" not in text and "'***'" in text
    again = loads(to_yaml(cfg, redact=False))
    assert again == cfg


@pytest.mark.parametrize("name", ["configs/tiny.yaml", "configs/demo.yaml", "examples/gsm8k_qwen2.5-0.5b.yaml",
                                  "examples/custom_task/config.yaml"])
def test_shipped_configs_validate(name):
    assert load_config(ROOT / name, env={}).project_name


def test_cli_validate_and_show(tmp_path, capsys):
    good = tmp_path / "good.yaml"
    good.write_text(MINIMAL + "hub:\n  token: hf_x\n")
    assert main(["config", "validate", str(good)]) == 0
    assert main(["config", "show", str(good), "--set", "lora.r=4"]) == 0
    out = capsys.readouterr().out
    assert "r: 4" in out and "hf_x" not in out
    bad = tmp_path / "bad.yaml"
    bad.write_text(MINIMAL + "lora:\n  rank: 4\n")
    assert main(["config", "validate", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "lora.rank" in err and "line 4" in err and "hint:" in err


def test_lr_schedule_is_transformers_cosine_over_the_versions():
    p = loads(MINIMAL + "params: {learning_rate: 0.2}\nrounds: {versions: 10, lr_schedule: cosine, lr_final: 0.1}")
    assert p.run_lr(0) == pytest.approx(0.2) and p.run_lr(10) == pytest.approx(0.02)
    assert p.run_lr(5) == pytest.approx(0.2 * (0.1 + 0.9 * 0.5)) and p.run_lr(10**6) == pytest.approx(0.02)
    assert all(p.run_lr(v) > p.run_lr(v + 1) for v in range(10))
    from transformers.optimization import _get_cosine_schedule_with_warmup_lr_lambda as hf

    assert all(p.run_lr(v) == pytest.approx(0.2 * hf(v, num_warmup_steps=0, num_training_steps=10, num_cycles=0.5,
                                                     min_lr_rate=0.1)) for v in range(11))
    constant = loads(MINIMAL + "params: {learning_rate: 0.2}\nrounds: {lr_schedule: constant}")
    assert [constant.run_lr(v) for v in (0, 7, 10)] == [0.2, 0.2, 0.2]
    with pytest.raises(ConfigError, match="rounds.lr_final"):
        loads(MINIMAL + "rounds: {lr_schedule: cosine, lr_final: 1.5}")


def test_lr_schedule_wsd_is_transformers_warmup_stable_decay_over_the_versions():
    p = loads(MINIMAL + "params: {learning_rate: 0.2}\nrounds: {versions: 10, lr_schedule: wsd, lr_final: 0.1, "
              "lr_warmup: 0.2, lr_decay: 0.3}")
    assert p.rounds.wsd_steps(10) == (2, 3)
    assert p.run_lr(0) == pytest.approx(0.02) and p.run_lr(1) == pytest.approx(0.11)  # rising from 10 %
    assert [p.run_lr(v) for v in range(2, 8)] == [pytest.approx(0.2)] * 6  # stable up to the decay's start
    assert p.run_lr(10) == pytest.approx(0.02) and p.run_lr(10**6) == pytest.approx(0.02)
    assert all(p.run_lr(v) > p.run_lr(v + 1) for v in range(7, 10))
    from transformers.optimization import _get_wsd_scheduler_lambda as hf

    assert all(p.run_lr(v) == pytest.approx(0.2 * hf(v, num_warmup_steps=2, num_stable_steps=5, num_decay_steps=3,
                                                     warmup_type="linear", decay_type="cosine", min_lr_ratio=0.1,
                                                     num_cycles=0.5)) for v in range(13))
    with pytest.raises(ConfigError, match=r"rounds.lr_warmup .* exceed 1"):
        loads(MINIMAL + "rounds: {lr_schedule: wsd, lr_warmup: 0.6, lr_decay: 0.5}")


def test_a_verified_run_refuses_workers_without_keyed_sampling():
    with pytest.raises(ConfigError, match="worker.keyed_sampling: true, or coordinator.verify: off"):
        loads(MINIMAL + "coordinator:\n  verify: untrusted\nworker:\n  keyed_sampling: false\n")
    assert not loads(MINIMAL + "worker:\n  keyed_sampling: false\n").worker.keyed_sampling  # nothing replays


def test_a_strictly_verified_run_refuses_bfloat16_workers_and_names_the_fix():
    strict = "coordinator:\n  verify: sample\n  verify_tolerance: strict\n"
    with pytest.raises(ConfigError) as ei:
        loads(MINIMAL + strict + "worker:\n  dtype: bfloat16\n", source="s.yaml")
    assert "verify_tolerance strict" in str(ei.value) and "worker.dtype: float32" in str(ei.value)
    assert loads(MINIMAL + strict).coordinator.verify_tolerance == "strict"  # dtype auto: float32 rounds
    assert loads(MINIMAL + strict.replace("sample", "'off'") + "worker:\n  dtype: bfloat16\n")  # nothing replays
    with pytest.raises(ConfigError, match="the default with coordinator.verify on"):  # strict by default
        loads(MINIMAL + "coordinator:\n  verify: sample\nworker:\n  dtype: bfloat16\n")
    wide = loads(MINIMAL + "coordinator:\n  verify: sample\n  verify_tolerance: wide\nworker:\n  dtype: bfloat16\n")
    assert wide.coordinator.verify_tolerance == "wide" and wide.worker.dtype == "bfloat16"


def test_a_run_stored_before_the_tolerance_existed_keeps_the_wide_rule(tmp_path):
    """A run repo's config is a full dump; one written before coordinator.verify_tolerance existed (verify on, a
    bfloat16 fleet) was verified with the wide rule: read back, it keeps that rule instead of failing to load
    under today's default (strict refuses bfloat16 workers). A config stored with the key keeps what it says."""
    import yaml

    from hubgrpo import layout, runrepo
    from hubgrpo.store.local import LocalStore

    store = LocalStore(tmp_path / "repo")
    store.create()
    cfg = loads(MINIMAL + "coordinator:\n  verify: sample\n  verify_tolerance: wide\nworker:\n  dtype: bfloat16\n")
    old = yaml.safe_load(to_yaml(cfg, drop_secrets=True))
    del old["coordinator"]["verify_tolerance"]
    store.commit({layout.CONFIG_FILE: yaml.safe_dump(old).encode()}, message="a run stored by an older hubgrpo")
    read = runrepo.read_config(store)
    assert read.coordinator.verify_tolerance == "wide" and read.worker.dtype == "bfloat16"
    strict = loads(MINIMAL + "coordinator:\n  verify: sample\n")
    store.commit({layout.CONFIG_FILE: to_yaml(strict, drop_secrets=True).encode()}, message="today's hubgrpo")
    assert runrepo.read_config(store).coordinator.verify_tolerance == "strict"
