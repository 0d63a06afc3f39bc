"""Admission checks: a valid submission passes; every hostile one is refused with its code, nothing unpickled."""

from __future__ import annotations

import json
import os
import pickle
import struct
from pathlib import Path

import pytest
import torch
import typer
from safetensors.torch import save_file
from typer.testing import CliRunner

from hubgrpo.merge.submission_checks import check_submission
from hubgrpo.cli.merge_cmd import register
from hubgrpo.errors import InvalidSubmission
from hubgrpo.merge import Adapter, dense_delta, load_adapter_dir, save_adapter_dir
from tests.support.adapter_factory import drifted, make_adapter, rel_err

WEIGHTS, CONFIG = "adapter_model.safetensors", "adapter_config.json"
KEY = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"
MARKER = Path("/tmp/hubgrpo-admission-pwned")


class Payload:
    """Unpickling this creates MARKER: proof that a file was deserialised with pickle."""

    def __reduce__(self):
        return (os.system, (f"touch {MARKER}",))


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


def _tensors(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(folder / WEIGHTS))


def _set_tensor(fn):
    def mutate(folder: Path) -> None:
        weights = _tensors(folder)
        fn(weights)
        save_file(weights, str(folder / WEIGHTS))
    return mutate


def _set_config(**changes):
    def mutate(folder: Path) -> None:
        config = json.loads((folder / CONFIG).read_text())
        config.update(changes)
        (folder / CONFIG).write_text(json.dumps(config))
    return mutate


def _write(name: str, data: bytes):
    return lambda folder: (folder / name).write_bytes(data)


def _raw_header(header: dict, data: bytes, declared: int | None = None):
    blob = json.dumps(header).encode()
    return _write(WEIGHTS, struct.pack("<Q", len(blob) if declared is None else declared) + blob + data)


def _symlink_file(folder: Path) -> None:
    (folder / CONFIG).unlink()
    os.symlink("/etc/hostname", folder / CONFIG)


def _symlink_weights(folder: Path) -> None:
    target = folder.parent / "elsewhere.safetensors"
    (folder / WEIGHTS).rename(target)
    os.symlink(target, folder / WEIGHTS)


def _nested(folder: Path) -> None:
    (folder / "ref").mkdir()
    (folder / "ref" / WEIGHTS).write_bytes((folder / WEIGHTS).read_bytes())


def _truncate(folder: Path) -> None:
    data = (folder / WEIGHTS).read_bytes()
    (folder / WEIGHTS).write_bytes(data[: len(data) - 100])


def _pad(folder: Path) -> None:
    (folder / WEIGHTS).write_bytes((folder / WEIGHTS).read_bytes() + b"\0" * 64)


def _weights_dir(folder: Path) -> None:
    (folder / WEIGHTS).unlink()
    (folder / WEIGHTS).mkdir()


def _huge(folder: Path) -> None:
    _set_tensor(lambda w: w.update({KEY: w[KEY] * 1e4}))(folder)


HOSTILE = {
    "nan": (_set_tensor(lambda w: w[KEY].__setitem__((0, 0), float("nan"))), "nonfinite"),
    "inf": (_set_tensor(lambda w: w[KEY].__setitem__((1, 1), float("inf"))), "nonfinite"),
    "neg_inf": (_set_tensor(lambda w: w[KEY].__setitem__((2, 2), float("-inf"))), "nonfinite"),
    "wrong_shape": (_set_tensor(lambda w: w.update({KEY: torch.zeros(33, 4)})), "shape"),
    "transposed": (_set_tensor(lambda w: w.update({KEY: w[KEY].T.contiguous()})), "shape"),
    "wrong_rank_same_config": (_set_tensor(lambda w: w.update({KEY: torch.zeros(32, 8)})), "shape"),
    "wrong_rank_config": (_set_config(r=8), "config_mismatch"),
    "missing_key": (_set_tensor(lambda w: w.pop(KEY)), "missing_keys"),
    "extra_module": (_set_tensor(lambda w: w.update({"base_model.model.lm_head.lora_A.weight": torch.zeros(4, 32)})),
                     "extra_keys"),
    "dora_magnitude": (_set_tensor(lambda w: w.update({KEY.replace("lora_B.weight", "lora_magnitude_vector"):
                                                       torch.ones(32)})), "extra_keys"),
    "float16": (_set_tensor(lambda w: w.update({KEY: w[KEY].half()})), "dtype"),
    "bfloat16": (_set_tensor(lambda w: w.update({KEY: w[KEY].bfloat16()})), "dtype"),
    "int64": (_set_tensor(lambda w: w.update({KEY: w[KEY].long()})), "dtype"),
    "alpha": (_set_config(lora_alpha=16), "config_mismatch"),
    "rslora": (_set_config(use_rslora=True), "config_mismatch"),
    "dora": (_set_config(use_dora=True), "config_mismatch"),
    "targets": (_set_config(target_modules=["q_proj", "v_proj"]), "config_mismatch"),
    "base_model": (_set_config(base_model_name_or_path="evil/model"), "config_mismatch"),
    "peft_type": (_set_config(peft_type="LOHA"), "config_mismatch"),
    "modules_to_save": (_set_config(modules_to_save=["lm_head"]), "config_mismatch"),
    "rank_pattern": (_set_config(rank_pattern={"q_proj": 2}), "config_mismatch"),
    "config_not_json": (_write(CONFIG, b"{not json"), "bad_config"),
    "config_list": (_write(CONFIG, b"[1, 2]"), "bad_config"),
    "config_binary": (_write(CONFIG, b"\xff\xfe\x00garbage"), "bad_config"),
    "no_config": (lambda f: (f / CONFIG).unlink(), "missing_file"),
    "no_weights": (lambda f: (f / WEIGHTS).unlink(), "missing_file"),
    "pickle_renamed": (_write(WEIGHTS, pickle.dumps({"w": Payload()})), "corrupt"),
    "torch_save_renamed": (lambda f: torch.save({KEY: torch.zeros(2)}, f / WEIGHTS), "corrupt"),
    "bin_file": (_write("adapter_model.bin", pickle.dumps(Payload())), "not_safetensors"),
    "pt_file": (_write("optimizer.pt", b"PK\x03\x04"), "not_safetensors"),
    "pkl_file": (_write("state.pkl", pickle.dumps(Payload())), "not_safetensors"),
    "truncated": (_truncate, "corrupt"),
    "padded": (_pad, "corrupt"),
    "huge_header_length": (_raw_header({}, b"", declared=2**63), "corrupt"),
    "header_not_json": (_write(WEIGHTS, struct.pack("<Q", 4) + b"\x80\x04\x95x"), "corrupt"),
    "header_list": (_raw_header([], b""), "corrupt"),
    "offsets_beyond_file": (_raw_header({KEY: {"dtype": "F32", "shape": [32, 4], "data_offsets": [0, 512]}},
                                        b"\0" * 16), "corrupt"),
    "overlapping_offsets": (_raw_header({KEY: {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                                         "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, b"\0" * 12),
                            "corrupt"),
    "bad_dtype_in_header": (_raw_header({KEY: {"dtype": "OBJ", "shape": [1], "data_offsets": [0, 8]}}, b"\0" * 8),
                            "corrupt"),
    "tiny_file": (_write(WEIGHTS, b"\x01\x02"), "corrupt"),
    "empty_weights": (_write(WEIGHTS, b""), "empty_file"),
    "empty_config": (_write(CONFIG, b""), "empty_file"),
    "empty_readme": (_write("README.md", b""), "empty_file"),
    "symlink_config": (_symlink_file, "symlink"),
    "symlink_weights": (_symlink_weights, "symlink"),
    "nested_dir": (_nested, "nested_dir"),
    "weights_is_dir": (_weights_dir, "nested_dir"),
    "unknown_file": (_write("run.sh", b"rm -rf /"), "unexpected_file"),
    "hidden_file": (_write(".DS_Store", b"x"), "unexpected_file"),
    "huge_norm": (_huge, "norm_outlier"),
}


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
    _write("adapter_model.bin", b"x")(good)
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
    _set_config(base_model_name_or_path="HuggingFaceTB/SmolLM2-135M-Instruct")(good)
    check_submission(good, old, max_bytes=10**7)
    _set_config(base_model_name_or_path="builtin:tiny")(good)
    with pytest.raises(InvalidSubmission) as e:
        check_submission(good, old, max_bytes=10**7)
    assert e.value.code == "config_mismatch"
