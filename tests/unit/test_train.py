"""``hubgrpo train`` (single-process baseline) through the CLI, the model card, and light imports."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import torch
from peft import PeftModel, get_peft_model_state_dict
from safetensors.torch import load_file

from hubgrpo.card import render_model_card
from hubgrpo.cli.main import main
from hubgrpo.config import loads
from hubgrpo.layout import ADAPTER_CONFIG, ADAPTER_WEIGHTS, CONFIG_FILE, MODEL_CARD, StepMetrics
from hubgrpo.worker.train import METRICS_FILE, reward_windows
from tests.support.models_fixture import tiny_cache  # noqa: F401  (fixture)

ROOT = Path(__file__).resolve().parents[2]


def test_train_cli_writes_a_loadable_adapter(tiny_cache, tmp_path, capsys):
    out = tmp_path / "adapter"
    rc = main(["train", str(ROOT / "configs" / "tiny.yaml"), "--steps", "4", "--output", str(out),
               "--eval-samples", "4", "--set", "params.max_completion_length=8", "--save-every", "2"])
    assert rc == 0
    captured = capsys.readouterr()
    assert "adapter written to" in captured.out
    # not a terminal (as in a log file or CI): a plain progress line for the first and the last step at least
    assert "GRPO step 1/4" in captured.err and "GRPO step 4/4" in captured.err
    assert {ADAPTER_WEIGHTS, ADAPTER_CONFIG, MODEL_CARD, METRICS_FILE, CONFIG_FILE} <= {p.name for p in out.iterdir()}
    metrics = json.loads((out / METRICS_FILE).read_text())
    assert [m["step"] for m in metrics["step_metrics"]] == [1, 2, 3, 4]
    assert metrics["samples"] == 4 * 16 and metrics["eval"]["before"] is not None
    assert all(StepMetrics.model_validate(m) for m in metrics["step_metrics"])
    ended = metrics["step_ended_at"]  # the wall clock at each step's end: the process-start clock of benchmarks
    assert len(ended) == 4 and ended == sorted(ended) and time.time() - 600 < ended[0] <= time.time()

    from hubgrpo.worker.models import load_model

    base, _ = load_model("builtin:tiny")
    model = PeftModel.from_pretrained(base, str(out))
    on_disk = load_file(out / ADAPTER_WEIGHTS)
    loaded = get_peft_model_state_dict(model, save_embedding_layers=False)
    assert loaded.keys() == on_disk.keys() and all(torch.equal(loaded[k], on_disk[k]) for k in on_disk)
    card = (out / MODEL_CARD).read_text()
    assert "library_name: peft" in card and "- grpo" in card and "reward (train, sampled)" in card
    # --save-every 2: the adapter after steps 2 and 4; the last one is the final adapter
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-000002", "step-000004"]
    last, mid = (load_file(out / "checkpoints" / s / ADAPTER_WEIGHTS) for s in ("step-000004", "step-000002"))
    assert all(torch.equal(last[k], on_disk[k]) for k in on_disk) and any(not torch.equal(mid[k], last[k]) for k in mid)


def test_model_card_metadata_and_no_secrets():
    cfg = loads("base_model: builtin:smollm2-135m-instruct\nproject_name: demo\n"
                "hub: {token: hf_supersecret}\ncoordinator: {secret: s3cr3t}")
    card = render_model_card(cfg, title="Demo", reward_rows=[{"version": 1, "reward": 0.123456}], body="Body.")
    assert card.startswith("---\n") and "base_model: HuggingFaceTB/SmolLM2-135M-Instruct" in card
    assert "library_name: peft" in card and all(f"- {t}" in card for t in ("hubgrpo", "grpo", "lora"))
    assert "| 1 | 0.1235 |" in card and "# Demo" in card and "Body." in card
    assert "hf_supersecret" not in card and "s3cr3t" not in card
    assert "AutoPeftModelForCausalLM.from_pretrained(" in card  # the base model has a Hub name
    tiny = render_model_card(loads("base_model: builtin:tiny\nproject_name: t"), title="T", reward_rows=[])
    assert "base_model:" not in tiny.split("---")[1]  # a random model has no Hub base model
    assert "AutoPeft" not in tiny and "PeftModel.from_pretrained(base" in tiny


def test_model_card_names_the_run_learning_rate_curve():
    base = ("base_model: builtin:tiny\nproject_name: t\nparams: {learning_rate: 0.1}\n"
            "rounds: {versions: 60, lr_schedule: ")
    decay = render_model_card(loads(base + "wsd, lr_warmup: 0}"), title="T", reward_rows=[])
    assert "lr 0.1 (constant, down to 0.01 over the last 18 versions)" in decay
    wsd = render_model_card(loads(base + "wsd, lr_warmup: 0.1}"), title="T", reward_rows=[])
    assert "lr 0.1 (up from 0.01 over the first 6 versions, then constant, down to 0.01 over the last 18" in wsd
    assert "lr 0.1 (cosine to 0.01 over the run)" in render_model_card(loads(base + "cosine}"), title="T",
                                                                     reward_rows=[])


def test_reward_windows():
    steps = [StepMetrics(step=i, reward=float(i)) for i in range(1, 13)]
    rows = reward_windows(steps, n_windows=4)
    assert [r["steps"] for r in rows] == ["1–3", "4–6", "7–9", "10–12"]
    assert rows[0]["reward (train, sampled)"] == 2.0


def test_cli_and_card_do_not_import_torch():
    code = ("import sys, hubgrpo.cli, hubgrpo.card, hubgrpo.cli.train_cmd\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_a_trained_adapter_loads_with_auto_peft_from_its_folder(tiny_cache, tmp_path, capsys):
    """adapter_config.json names a base model AutoPeftModelForCausalLM can find: here a local folder (a Hub id for
    the built-in SmolLM2, see test_auto_peft_finds_smollm2_under_its_hub_name)."""
    import shutil

    from peft import AutoPeftModelForCausalLM

    from hubgrpo.worker.models import load_model, tiny_dir

    base_dir = shutil.copytree(tiny_dir(), tmp_path / "my-base")
    out = tmp_path / "adapter"
    assert main(["train", str(ROOT / "configs" / "tiny.yaml"), "--steps", "2", "--output", str(out),
                 "--eval-samples", "0", "--set", f"base_model={base_dir}",
                 "--set", "params.max_completion_length=4"]) == 0
    capsys.readouterr()
    assert json.loads((out / ADAPTER_CONFIG).read_text())["base_model_name_or_path"] == str(base_dir)
    auto = AutoPeftModelForCausalLM.from_pretrained(str(out)).eval()
    base, _ = load_model(str(base_dir), device="cpu")
    manual = PeftModel.from_pretrained(base, str(out)).eval()
    ids = torch.tensor([[1, 5, 9, 13, 2]])
    with torch.no_grad():
        assert torch.equal(auto(ids).logits, manual(ids).logits)
    assert any(float(v.abs().max()) > 0 for k, v in load_file(out / ADAPTER_WEIGHTS).items() if "lora_B" in k)


def test_builtin_models_are_saved_under_their_hub_names():
    from hubgrpo.card import adapter_base_name

    assert adapter_base_name("builtin:smollm2-135m-instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert adapter_base_name("builtin:tiny") == "builtin:tiny"  # random weights: no Hub model exists
    assert adapter_base_name("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"
