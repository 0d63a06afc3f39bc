"""Admission checks: a valid submission passes; every hostile one is refused with its code, nothing unpickled."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import typer
from typer.testing import CliRunner

from hubgrpo.cli.merge_cmd import register
from hubgrpo.errors import InvalidSubmission
from hubgrpo.merge import Adapter, dense_delta, load_adapter_dir, save_adapter_dir
from hubgrpo.merge.submission_checks import check_submission
from tests.support.adapter_factory import drifted, make_adapter, rel_err
from tests.support.hostile_folders import HOSTILE, MARKER, set_config, write_file


@pytest.fixture
def global_():
    return make_adapter(seed=0)


@pytest.fixture
def good(tmp_path, global_) -> Path:
    """A valid submission folder: the drifted global adapter + submission.json + README.md."""
    folder = save_adapter_dir(drifted(global_, 0.1, seed=1), tmp_path / "sub")
    (folder / "submission.json").write_text('{"samples": 64}')
    (folder / "README.md").write_text("worker notes")
    return folder


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_submission_is_refused(name, good, global_):
    mutate, code = HOSTILE[name]
    MARKER.unlink(missing_ok=True)
    mutate(good)
    with pytest.raises(InvalidSubmission) as exc:
        check_submission(good, global_, max_bytes=10**7, norm_limit=50.0)
    assert exc.value.code == code, exc.value.message
    assert exc.value.message and not MARKER.exists()


def test_hostile_set_is_large_enough():
    assert len(HOSTILE) >= 30


def test_valid_submission_is_admitted(good, global_):
    adapter = check_submission(good, global_, max_bytes=10**7, known_versions={0, 1}, base_version=1,
                               norm_limit=50.0, current_version=2, max_staleness=2)
    assert rel_err(dense_delta(adapter), dense_delta(load_adapter_dir(good))) == 0.0


@pytest.mark.parametrize("kwargs,code", [
    ({"max_bytes": 1000}, "too_large"),
    ({"known_versions": {0, 1}, "base_version": 7}, "unknown_base"),
    ({"known_versions": {0, 1}}, "unknown_base"),
    ({"base_version": 1, "current_version": 9, "max_staleness": 4}, "stale"),
])
def test_caller_limits(good, global_, kwargs, code):
    with pytest.raises(InvalidSubmission) as exc:
        check_submission(good, global_, **{"max_bytes": 10**7, **kwargs})
    assert exc.value.code == code


def test_symlinked_folder_and_missing_folder(tmp_path, good, global_):
    link = tmp_path / "link"
    os.symlink(good, link)
    for path, code in ((link, "symlink"), (tmp_path / "absent", "missing_file")):
        with pytest.raises(InvalidSubmission) as exc:
            check_submission(path, global_, max_bytes=10**7)
        assert exc.value.code == code


def test_frozen_embedding_weight_must_match(tmp_path):
    global_ = make_adapter(seed=0)
    emb = "base_model.model.model.embed_tokens"
    global_.weights.update({f"{emb}.lora_embedding_A": torch.randn(4, 64),
                            f"{emb}.lora_embedding_B": torch.randn(32, 4),
                            f"{emb}.base_layer.weight": torch.randn(64, 32)})
    sub = Adapter({k: v.clone() for k, v in global_.weights.items()}, global_.config)
    check_submission(save_adapter_dir(sub, tmp_path / "ok"), global_, max_bytes=10**7)
    sub.weights[f"{emb}.base_layer.weight"][0, 0] += 1.0
    with pytest.raises(InvalidSubmission) as exc:
        check_submission(save_adapter_dir(sub, tmp_path / "bad"), global_, max_bytes=10**7)
    assert exc.value.code == "modified_base_weight"


def _app() -> typer.Typer:
    app = typer.Typer()
    register(app)
    return app


def test_cli_check(tmp_path, good, global_):
    save_adapter_dir(global_, tmp_path / "global")
    runner = CliRunner()
    ok = runner.invoke(_app(), ["check", str(tmp_path / "global"), str(good)])
    assert ok.exit_code == 0 and "admitted" in ok.output
    write_file("adapter_model.bin", b"x")(good)
    bad = runner.invoke(_app(), ["check", str(tmp_path / "global"), str(good)])
    assert bad.exit_code == 1 and "not_safetensors" in bad.output


def test_cli_merge_writes_weighted_mean(tmp_path, global_):
    save_adapter_dir(global_, tmp_path / "global")
    subs = [drifted(global_, 0.2, seed=i) for i in range(2)]
    dirs = [str(save_adapter_dir(s, tmp_path / f"s{i}")) for i, s in enumerate(subs)]
    out = tmp_path / "merged"
    result = CliRunner().invoke(_app(), ["merge", str(tmp_path / "global"), *dirs, "--weights", "3,1",
                                         "--method", "stack", "--output", str(out), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["method"] == "stack" and report["merged"] == 2
    d0, d1 = dense_delta(subs[0]), dense_delta(subs[1])
    assert rel_err(dense_delta(load_adapter_dir(out)), {k: 0.75 * d0[k] + 0.25 * d1[k] for k in d0}) <= 1e-5
    table = CliRunner().invoke(_app(), ["merge", str(tmp_path / "global"), *dirs, "--output", str(out)])
    assert table.exit_code == 0 and "residual" in table.output
    wrong = CliRunner().invoke(_app(), ["merge", str(tmp_path / "global"), *dirs, "--weights", "1", "-o", str(out)])
    assert wrong.exit_code != 0


def test_a_builtin_base_name_matches_its_hub_name(good, global_):
    """Runs begun when built-ins were saved as ``builtin:…`` admit rounds that name the Hub model, and back."""
    from hubgrpo.merge import Adapter

    old = Adapter(weights=global_.weights, config={**global_.config,
                                                   "base_model_name_or_path": "builtin:smollm2-135m-instruct"})
    set_config(base_model_name_or_path="HuggingFaceTB/SmolLM2-135M-Instruct")(good)
    check_submission(good, old, max_bytes=10**7)
    set_config(base_model_name_or_path="builtin:tiny")(good)
    with pytest.raises(InvalidSubmission) as e:
        check_submission(good, old, max_bytes=10**7)
    assert e.value.code == "config_mismatch"
