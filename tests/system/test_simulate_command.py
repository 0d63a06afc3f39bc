"""``hubgrpo simulate``, the installed command: refusals of bad options (exit 2, naming them), and real rounds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.sim_support import deterministic_part

ROOT = Path(__file__).resolve().parents[2]


def test_simulate_without_a_stop_condition_exits_2_with_a_hint(tmp_path):
    exe = Path(sys.executable).with_name("hubgrpo")
    r = subprocess.run([str(exe), "simulate", str(ROOT / "configs" / "tiny.yaml"), "--workers", "2", "--output",
                        str(tmp_path / "x")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "stop condition" in r.stderr and "--until-version" in r.stderr


def test_simulate_with_a_bad_start_spec_exits_2_naming_it(tmp_path):
    exe = Path(sys.executable).with_name("hubgrpo")
    r = subprocess.run([str(exe), "simulate", str(ROOT / "configs" / "tiny.yaml"), "--workers", "2", "--starts",
                        "1e400", "--until-version", "1", "--output", str(tmp_path / "x")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--starts '1e400'" in r.stderr and "spread:10" in r.stderr
    assert not (tmp_path / "x").exists()


@pytest.mark.timeout(300)
def test_simulate_command_is_deterministic_with_real_rounds(tmp_path):
    """The installed command, tiny model, 4 workers: the same seed twice gives the same versions and staleness."""
    exe = Path(sys.executable).with_name("hubgrpo")
    results = []
    for name in ("a", "b"):
        out = tmp_path / name
        r = subprocess.run([str(exe), "simulate", str(ROOT / "configs" / "tiny.yaml"), "--workers", "4",
                            "--until-version", "5", "--eval-samples", "4", "--seed", "1", "--no-progress",
                            "--output", str(out), "--set", "rounds.steps=2"],
                           capture_output=True, text=True, timeout=280)
        assert r.returncode == 0, r.stderr[-2000:]
        assert "held-out reward" in r.stdout and (out / "simulation.png").stat().st_size > 1000
        results.append(json.loads((out / "simulation.json").read_text()))
    a, b = results
    assert deterministic_part(a) == deterministic_part(b)
    assert a["versions"][-1]["version"] == 5 and any(int(k) > 0 for k in a["staleness_histogram"])
    assert all(v["eval_reward"] is not None for v in a["versions"])


@pytest.mark.parametrize("option,value", [("--latency-s", "1e400"), ("--rejoin-s", "inf"), ("--until-reward", "nan")])
def test_simulate_refuses_a_number_that_is_not_finite_naming_it(tmp_path, option, value):
    exe = Path(sys.executable).with_name("hubgrpo")
    r = subprocess.run([str(exe), "simulate", str(ROOT / "configs" / "tiny.yaml"), "--workers", "2", option, value,
                        "--until-version", "1", "--output", str(tmp_path / "x")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and f"{option} {float(value)} is not a finite number" in r.stderr, r.stderr[-1500:]
    assert not (tmp_path / "x").exists()
