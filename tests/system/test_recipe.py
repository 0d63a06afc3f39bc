"""The recipe: a config that says nothing about the merge or the rounds gets the measured one; ``config show``
names it; ``config validate`` and ``init`` (the installed command) refuse what every worker would refuse later."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hubgrpo.config import loads
from hubgrpo.config.recipe import RECIPE_KEYS, default_recipe, describe, differences
from hubgrpo.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
EXE = Path(sys.executable).with_name("hubgrpo")
MINIMAL = "base_model: builtin:tiny\nproject_name: t\n"
# the recipe of the measured runs (benchmarks/README.md: real N = 2 and the simulated SmolLM2 fleets): changing a
# default means measuring the new recipe first, then this line
MEASURED = {"merge.method": "ffa", "merge.rebase": True, "merge.quorum": 1, "merge.outer_lr": 1.0,
            "merge.fleet_outer_lr": 1.5, "merge.fleet_outer_lr_decays": True,
            "merge.outer_momentum": 0.0, "merge.max_staleness": 4,
            "merge.staleness_per_worker": 2.0,
            "rounds.steps": 1, "rounds.reset_optimizer": False, "rounds.lr_schedule": "wsd",
            "rounds.lr_warmup": 0.0, "rounds.lr_decay": 0.3, "worker.pipeline": False}


def cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([str(EXE), *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def test_a_config_that_says_nothing_gets_the_measured_recipe():
    assert set(MEASURED) == set(RECIPE_KEYS)
    assert default_recipe() == MEASURED
    assert differences(loads(MINIMAL)) == {}


def test_every_shipped_config_and_example_keeps_the_recipe_or_says_why_not():
    from hubgrpo.config import load_config

    for path in [*sorted((ROOT / "configs").glob("*.yaml")), *sorted((ROOT / "examples").rglob("*.yaml"))]:
        diff = differences(load_config(path))
        if diff:  # a config that leaves the recipe says so in its header, or names there each key it changes
            header = path.read_text().split("\ntask:")[0]
            assert "Not the recommended recipe" in header or all(k in header for k in diff), (path.name, diff)


def test_another_method_alone_turns_rebase_off_and_an_explicit_rebase_with_svd_is_refused():
    cfg = loads(MINIMAL + "merge: {method: svd}\n")
    assert cfg.merge.rebase is False and set(differences(cfg)) == {"merge.method", "merge.rebase"}
    with pytest.raises(ConfigError, match="merge.rebase"):
        loads(MINIMAL + "merge: {method: svd, rebase: true}\n")


def test_a_batch_without_whole_groups_is_refused_with_the_sizes_that_fit():
    with pytest.raises(ConfigError, match=r"\(7\) is not a multiple of num_generations \(4\).*make the batch 4 or 8"):
        loads(MINIMAL + "params: {per_device_train_batch_size: 7, num_generations: 4}\n")
    with pytest.raises(ConfigError, match=r"make the batch 4(?! or)"):
        loads(MINIMAL + "params: {per_device_train_batch_size: 2, num_generations: 4}\n")
    batch = "params: {per_device_train_batch_size: 6, num_generations: 4, gradient_accumulation_steps: 2}\n"
    cfg = loads(MINIMAL + batch)
    assert cfg.params.per_device_train_batch_size == 6


def test_describe_names_the_recipe_and_what_differs():
    assert describe(loads(MINIMAL)).endswith("the default, measured best")
    line = describe(loads(MINIMAL + "rounds: {steps: 5}\n"))
    assert "5-step rounds" in line and "rounds.steps (5; default 1)" in line
    piped = describe(loads(MINIMAL + "worker: {pipeline: true}\n"))
    assert "rounds pipelined" in piped and "worker.pipeline (True; default False)" in piped
    assert "rounds in sequence" in describe(loads(MINIMAL))


def test_scheduler_names_are_transformers_own():
    from transformers import SchedulerType

    from hubgrpo.task.preflight import SCHEDULERS

    assert set(SCHEDULERS) == {s.value for s in SchedulerType}


BAD = {
    "builtin:exact_answr": ('rewards:\n  - {function: "builtin:exact_answr"}\n',
                            "rewards[0].function: unknown built-in reward 'builtin:exact_answr'"),
    "no colon": ('rewards:\n  - {function: "my_rewards"}\n', "is not of the form module:function"),
    "task": ('data: {path: "builtin:additon"}\n', "data: unknown built-in task 'builtin:additon'"),
    "option": ('data: {path: "builtin:addition", options: {digts: 2}}\n', "has no option 'digts'"),
    "value": ('data: {path: "builtin:addition", options: {digits: 0}}\n', "needs digits >= 1"),
    "scheduler": ("params: {lr_scheduler_type: cosin}\n", "'cosin' is not a transformers scheduler"),
    "size": ('data: {path: "builtin:addition", options: {size: lots}}\n', "size must be whole numbers >= 0"),
    "warmup": ("params: {lr_scheduler_type: linear, warmup_steps: 3}\n",
               "params.warmup_steps (3) >= rounds.steps (1)"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_config_validate_refuses_what_every_worker_would_refuse(tmp_path, case):
    text, message = BAD[case]
    (tmp_path / "c.yaml").write_text(MINIMAL + text)
    r = cli("config", "validate", str(tmp_path / "c.yaml"))
    assert r.returncode == 2 and message in r.stderr, (r.returncode, r.stdout, r.stderr)


def test_validate_does_not_import_torch_and_batch_errors_exit_2(tmp_path):
    (tmp_path / "c.yaml").write_text(MINIMAL + "params: {per_device_train_batch_size: 7, num_generations: 4}\n")
    r = cli("config", "validate", str(tmp_path / "c.yaml"))
    assert r.returncode == 2 and "make the batch 4 or 8" in r.stderr
    code = ("import sys; from hubgrpo.cli.config_cmd import load_checked; load_checked(sys.argv[1], []); "
            "print(sorted(m for m in ('torch', 'transformers', 'trl', 'peft', 'gradio') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code, str(ROOT / "configs" / "demo.yaml")], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr


def test_init_refuses_a_misspelt_reward_before_creating_anything(tmp_path):
    (tmp_path / "c.yaml").write_text(MINIMAL + 'rewards:\n  - {function: "builtin:exact_answr"}\n')
    r = cli("init", str(tmp_path / "c.yaml"), "--repo", str(tmp_path / "run"), cwd=tmp_path)
    assert r.returncode == 2 and "builtin:exact_answr" in r.stderr and "builtin:exact_answer" in r.stderr
    assert not (tmp_path / "run").exists()


def test_config_show_and_validate_name_the_recipe(tmp_path):
    (tmp_path / "c.yaml").write_text(MINIMAL)
    shown = cli("config", "show", str(tmp_path / "c.yaml"))
    assert shown.returncode == 0 and shown.stdout.startswith("# recipe: ffa + rebase, quorum 1, 1-step rounds")
    assert shown.stdout.splitlines()[0].endswith("the default, measured best")
    svd = cli("config", "show", str(tmp_path / "c.yaml"), "--set", "merge.method=svd", "--set", "merge.rebase=false")
    assert "differs from the default in merge.method ('svd'; default 'ffa'), merge.rebase" in svd.stdout
    demo = cli("config", "show", "configs/demo.yaml")  # the demo keeps a fleet's step at 1 (its header says why)
    assert demo.stdout.splitlines()[0].endswith("differs from the default in merge.fleet_outer_lr (None; default 1.5)")
    ok = cli("config", "validate", "configs/demo.yaml")
    assert ok.returncode == 0 and "recipe: ffa + rebase" in ok.stdout
