"""The examples/ folder: the offline ones run (through the files users run), the others are checked."""

from __future__ import annotations

import ast
import json
import os
import py_compile
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
EXE = Path(sys.executable).with_name("hubgrpo")


@pytest.mark.timeout(400)
def test_quickstart_runs_a_run_end_to_end(tmp_path):
    r = subprocess.run([sys.executable, str(EXAMPLES / "quickstart.py"), str(tmp_path)], capture_output=True,
                       text=True, timeout=380, cwd=str(tmp_path), env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "run finished: version 3" in r.stdout and "pushed the last version" in r.stdout and "sample:" in r.stdout
    assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file()
    assert "library_name: peft" in (tmp_path / "adapter" / "README.md").read_text()


@pytest.mark.timeout(300)
def test_custom_task_trains_with_its_own_data_and_reward_file(tmp_path):
    out = tmp_path / "adapter"
    r = subprocess.run([str(EXE), "train", "examples/custom_task/config.yaml", "--steps", "2", "--output", str(out),
                        "--eval-samples", "2"], capture_output=True, text=True, timeout=280, cwd=str(ROOT))
    assert r.returncode == 0, r.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert len(metrics["step_metrics"]) == 2
    assert all(0.0 <= m["reward"] <= 1.2 for m in metrics["step_metrics"])  # reversed_word (≤ 1) + format (0.2)
    sys.path.insert(0, str(EXAMPLES / "custom_task"))
    try:
        from rewards import reversed_word
    finally:
        sys.path.pop(0)
    scores = reversed_word(None, ["<answer>elppa</answer>", "<answer>elpxx</answer>", "no"], ["elppa"] * 3)
    assert scores == [1.0, 0.5 * 3 / 5, 0.0]


def test_modal_worker_compiles_and_runs_the_worker_command():
    py_compile.compile(str(EXAMPLES / "modal_worker.py"), doraise=True)  # modal is not installed here
    tree = ast.parse((EXAMPLES / "modal_worker.py").read_text())
    calls = {n.func.attr for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)}
    assert {"App", "function", "local_entrypoint", "starmap", "from_name", "pip_install"} <= calls
    text = (EXAMPLES / "modal_worker.py").read_text()
    assert '"hubgrpo", "worker", "--repo"' in text and "hf_" not in text.replace("HF_TOKEN=hf_...", "")


def test_the_hf_jobs_recipe_uses_real_commands():
    """Every `hubgrpo …` line of the recipe parses with the real CLI (`--help` on its command path)."""
    text = (EXAMPLES / "hf_jobs.md").read_text()
    commands = {tuple(line.split()[1:3]) for line in text.replace("\\\n", " ").splitlines()
                if line.startswith("hubgrpo ")}
    assert {("launch", "--repo"), ("jobs", "ls"), ("jobs", "logs"), ("jobs", "stop"), ("space", "deploy")} <= commands
    for sub in {c[0] for c in commands} | {"jobs ls", "jobs logs", "jobs stop", "space deploy"}:
        r = subprocess.run([str(EXE), *sub.split(), "--help"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, (sub, r.stderr)
