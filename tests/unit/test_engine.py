"""The round engine on the tiny model: real TRL GRPOTrainer + PEFT on CPU, a few steps per round."""

from __future__ import annotations

import json

import pytest
import torch
from peft import get_peft_model_state_dict
from safetensors.torch import load_file, save_file

from hubgrpo.worker.engine import RoundEngine
from hubgrpo.errors import ModelError, RewardError
from hubgrpo.layout import ADAPTER_CONFIG, ADAPTER_WEIGHTS, ROLLOUTS_FILE, SUBMISSION_FILE, Submission
from tests.support.models_fixture import make_lease, tiny_cache, tiny_config  # noqa: F401  (fixture)


@pytest.fixture(scope="module")
def engine(tiny_cache):
    return RoundEngine(tiny_config(), worker="w1")


@pytest.fixture(scope="module")
def v0(engine, tmp_path_factory):
    return engine.init_adapter(tmp_path_factory.mktemp("v0"))


def _base_weights(engine) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in engine.trainer.model.named_parameters() if "lora_" not in k}


def test_init_adapter_is_the_base_model(engine, v0):
    state = load_file(v0 / ADAPTER_WEIGHTS)
    assert sorted(p.name for p in v0.iterdir()) == [ADAPTER_CONFIG, ADAPTER_WEIGHTS]
    assert len(state) == 4 * 7 * 2 and all(".default" not in k for k in state)
    assert all(float(v.abs().max()) == 0.0 for k, v in state.items() if "lora_B" in k)
    assert all(float(v.abs().max()) > 0.0 for k, v in state.items() if "lora_A" in k)
    conf = json.loads((v0 / ADAPTER_CONFIG).read_text())
    assert conf["r"] == 4 and conf["lora_alpha"] == 8 and conf["base_model_name_or_path"] == "builtin:tiny"


def test_init_adapter_follows_params_seed(engine, v0, tmp_path):
    same = load_file(RoundEngine(tiny_config()).init_adapter(tmp_path / "same") / ADAPTER_WEIGHTS)
    other = load_file(RoundEngine(tiny_config(["params.seed=1"])).init_adapter(tmp_path / "other") / ADAPTER_WEIGHTS)
    ours = load_file(v0 / ADAPTER_WEIGHTS)
    assert all(torch.equal(ours[k], same[k]) for k in ours)
    assert all(not torch.equal(ours[k], other[k]) for k in ours if "lora_A" in k)


def test_round_trains_lora_only_and_writes_a_valid_submission(engine, v0, tmp_path):
    before = _base_weights(engine)
    seen = []
    lease = make_lease(steps=3)
    sub = engine.run_round(v0, lease, tmp_path, on_step=lambda step, m: seen.append((step, m["reward"])))
    assert [s for s, _ in seen] == [1, 2, 3]
    after = _base_weights(engine)
    assert all(torch.equal(before[k], after[k]) for k in before)
    start, end = load_file(v0 / ADAPTER_WEIGHTS), load_file(tmp_path / ADAPTER_WEIGHTS)
    assert start.keys() == end.keys()
    assert any(float(end[k].abs().max()) > 0 for k in end if "lora_B" in k)  # B left zero: training happened
    assert sorted(p.name for p in tmp_path.iterdir()) == [ADAPTER_CONFIG, ADAPTER_WEIGHTS, ROLLOUTS_FILE,
                                                          SUBMISSION_FILE]
    on_disk = Submission.from_json((tmp_path / SUBMISSION_FILE).read_text())
    assert on_disk == sub
    assert sub.lease == lease and sub.base_sha == lease.base_sha and sub.worker == "w1"
    assert sub.submission_id == "w1-l1" and sub.steps == 3 and len(sub.step_metrics) == 3
    assert sub.samples == 3 * 8 and sub.prompts == 6 and sub.tokens > sub.samples
    assert [m.reward for m in sub.step_metrics] == [r for _, r in seen]
    assert sub.reward_first == seen[0][1] and sub.reward_last == seen[-1][1]
    assert {"load", "generate", "reward", "train", "save", "total"} <= sub.timings.keys()
    assert sub.timings["total"] >= sub.timings["generate"] + sub.timings["train"]
    assert {"torch", "transformers", "trl", "peft", "hubgrpo"} <= sub.versions.keys()
    assert sub.device.startswith("cpu") and sub.step_metrics[0].grad_norm is not None


def test_round_starts_from_exactly_the_given_adapter(engine, v0, tmp_path):
    first = engine.run_round(v0, make_lease(steps=2, lease_id="a"), tmp_path / "a")
    assert first.steps == 2
    engine.load_adapter(tmp_path / "a")
    in_model = get_peft_model_state_dict(engine.trainer.model, save_embedding_layers=False)
    on_disk = load_file(tmp_path / "a" / ADAPTER_WEIGHTS)
    assert all(torch.equal(in_model[k], on_disk[k]) for k in on_disk)
    engine.run_round(tmp_path / "a", make_lease(steps=0, lease_id="b"), tmp_path / "b")  # 0 steps: a pure copy
    copied = load_file(tmp_path / "b" / ADAPTER_WEIGHTS)
    assert all(torch.equal(copied[k], on_disk[k]) for k in on_disk)


def test_rounds_are_deterministic_and_reset_adam(engine, v0, tmp_path, monkeypatch):
    for name in ("x", "y"):
        engine.run_round(v0, make_lease(steps=2, lease_id=name, seed=5), tmp_path / name)
    x, y = load_file(tmp_path / "x" / ADAPTER_WEIGHTS), load_file(tmp_path / "y" / ADAPTER_WEIGHTS)
    assert all(torch.equal(x[k], y[k]) for k in x)  # same adapter + lease → same result (fresh AdamW each round)
    monkeypatch.setattr(engine.cfg.rounds, "reset_optimizer", False)
    engine.run_round(v0, make_lease(steps=2, lease_id="z", seed=5), tmp_path / "z")
    z = load_file(tmp_path / "z" / ADAPTER_WEIGHTS)
    assert any(not torch.equal(x[k], z[k]) for k in x)  # Adam moments carried over from the previous round


def test_each_simulated_machine_keeps_its_own_adam_moments(v0, tmp_path):
    keep = ["rounds.reset_optimizer=false"]
    alone = RoundEngine(tiny_config(keep), worker="w1")  # machine a alone: round 1, then round 2 with its moments
    alone.run_round(v0, make_lease(steps=2, lease_id="a1", seed=5), tmp_path / "a1")
    alone.run_round(v0, make_lease(steps=2, lease_id="a2", seed=6), tmp_path / "a2")
    shared = RoundEngine(tiny_config(keep), worker="w1")  # the same two rounds with machine b's round between them
    shared.run_round(v0, make_lease(steps=2, lease_id="a1", seed=5), tmp_path / "s1", optimizer_key="a")
    shared.run_round(v0, make_lease(steps=2, lease_id="b1", seed=9), tmp_path / "b1", optimizer_key="b")
    shared.run_round(v0, make_lease(steps=2, lease_id="a2", seed=6), tmp_path / "s2", optimizer_key="a")
    want, got = load_file(tmp_path / "a2" / ADAPTER_WEIGHTS), load_file(tmp_path / "s2" / ADAPTER_WEIGHTS)
    assert all(torch.equal(want[k], got[k]) for k in want)  # b's round left a's AdamW state alone
    fresh = load_file(tmp_path / "b1" / ADAPTER_WEIGHTS)
    shared.run_round(v0, make_lease(steps=2, lease_id="b1", seed=9), tmp_path / "b2", optimizer_key="new")
    again = load_file(tmp_path / "b2" / ADAPTER_WEIGHTS)
    assert all(torch.equal(fresh[k], again[k]) for k in fresh)  # a machine seen for the first time starts fresh


def test_lease_params_override_and_beta_rebuilds_without_saving_ref(engine, v0, tmp_path):
    sub = engine.run_round(v0, make_lease(steps=1, lease_id="lr", params={"learning_rate": 1e-3}), tmp_path / "lr")
    assert sub.timings["setup"] == 0.0 and engine.trainer.args.learning_rate == 1e-3
    sub = engine.run_round(v0, make_lease(steps=2, lease_id="kl", params={"beta": 0.05}), tmp_path / "kl")
    assert sub.timings["setup"] > 0.0 and engine.trainer.beta == 0.05
    assert sub.step_metrics[-1].kl is not None
    assert sorted(p.name for p in (tmp_path / "kl").iterdir()) == [ADAPTER_CONFIG, ADAPTER_WEIGHTS, ROLLOUTS_FILE,
                                                          SUBMISSION_FILE]
    assert load_file(tmp_path / "kl" / ADAPTER_WEIGHTS).keys() == load_file(v0 / ADAPTER_WEIGHTS).keys()
    engine.run_round(v0, make_lease(steps=1, lease_id="back"), tmp_path / "back")  # and back to the config
    assert engine.trainer.beta == 0.0


def test_a_leased_share_of_the_fleet_batch_is_what_the_round_samples(engine, v0, tmp_path):
    """rounds.fleet_batch split: the lease carries the worker's batch (one prompt group of 4 here); the round
    samples exactly that per step, its rollouts say so, and the next lease at the config's batch rebuilds back."""
    from hubgrpo.task import rollouts

    sub = engine.run_round(v0, make_lease(steps=2, lease_id="half", indices=[3, 5],
                                          params={"per_device_train_batch_size": 4}), tmp_path / "half")
    assert sub.samples == 8 and sub.prompts == 2 and engine.trainer.args.per_device_train_batch_size == 4
    batches = rollouts.read(tmp_path / "half" / ROLLOUTS_FILE, 1 << 20).batches
    assert sorted(sorted(set(b.prompt_indices)) for b in batches) == [[3], [5]]  # one prompt's group per step
    assert [len(b.completions) for b in batches] == [4, 4]
    sub = engine.run_round(v0, make_lease(steps=1, lease_id="whole"), tmp_path / "whole")
    assert sub.samples == 8 and engine.trainer.args.per_device_train_batch_size == 8


def test_train_follows_the_run_learning_rate_schedule(tiny_cache):
    """`hubgrpo train` with rounds.lr_schedule cosine: the steps follow the curve a run follows over its
    versions, down to rounds.lr_final × learning_rate after the last one."""
    from hubgrpo.worker.train import prompts_per_step, run_params

    cfg = tiny_config(["rounds.lr_schedule=cosine", "rounds.lr_final=0.25", "params.learning_rate=0.01"])
    eng = RoundEngine(cfg, worker="train")
    eng.train_steps(eng.prompt_rows(range(3 * prompts_per_step(cfg))), 3, seed=0, params=run_params(eng, 3))
    assert eng.trainer.optimizer.param_groups[0]["lr"] == pytest.approx(0.01 * 0.25)
    assert run_params(RoundEngine(tiny_config(), worker="plain"), 3) is None  # constant: the config as it is


def test_train_follows_the_run_wsd_schedule_step_by_step(tiny_cache):
    """rounds.lr_schedule wsd: `hubgrpo train`'s step k trains at the rate a run's lease on version k gets
    (the same warmup, plateau and decay, counted in steps instead of versions)."""
    from hubgrpo.worker.train import prompts_per_step, run_params

    steps = 8
    cfg = tiny_config(["rounds.lr_schedule=wsd", "rounds.lr_warmup=0.25", "rounds.lr_decay=0.25",
                       "params.learning_rate=0.01", "rounds.lr_final=0.2", f"rounds.versions={steps}"])
    eng = RoundEngine(cfg, worker="train")
    seen: list[float] = []  # the rate of the next step, after each step's scheduler update
    lr0 = eng.trainer.args.learning_rate
    eng.train_steps(eng.prompt_rows(range(steps * prompts_per_step(cfg))), steps, seed=0,
                    params=run_params(eng, steps),
                    on_step=lambda step, m: seen.append(eng.trainer.optimizer.param_groups[0]["lr"]))
    assert lr0 == 0.01 and seen == [pytest.approx(cfg.run_lr(k)) for k in range(1, steps + 1)]
    assert seen[0] == pytest.approx(0.006) and seen[1:6] == [pytest.approx(0.01)] * 5  # warmup 2, plateau
    assert seen[6] == pytest.approx(0.006) and seen[7] == pytest.approx(0.002)  # decay 2, down to 20 %


def test_adapters_that_do_not_fit_are_model_errors(engine, v0, tmp_path):
    state = load_file(v0 / ADAPTER_WEIGHTS)
    conf = json.loads((v0 / ADAPTER_CONFIG).read_text())

    def write(name, tensors, config=conf):
        d = tmp_path / name
        d.mkdir()
        save_file(tensors, str(d / ADAPTER_WEIGHTS))
        (d / ADAPTER_CONFIG).write_text(json.dumps(config))
        return d

    key = next(iter(state))
    cases = {
        "missing": ({k: v for k, v in state.items() if k != key}, conf, "missing base_model"),
        "extra": ({**state, "base_model.model.lm_head.lora_A.weight": state[key].clone()}, conf,
                  "unexpected base_model"),
        "shape": ({k: torch.zeros(2, *v.shape[1:]) if "lora_A" in k else v for k, v in state.items()}, conf,
                  "wrong shape"),
        "rank": ({k: (v[:2] if "lora_A" in k else v[:, :2]).contiguous() for k, v in state.items()}, {**conf, "r": 2},
                 "adapter has"),
        "alpha": (state, {**conf, "lora_alpha": 32}, "adapter has"),
    }
    for name, (tensors, config, message) in cases.items():
        with pytest.raises(ModelError, match=message):
            engine.load_adapter(write(name, tensors, config))
    with pytest.raises(ModelError, match="does not exist"):
        engine.run_round(tmp_path / "nowhere", make_lease(), tmp_path / "out")
    (tmp_path / "garbage").mkdir()
    (tmp_path / "garbage" / ADAPTER_WEIGHTS).write_bytes(b"not safetensors")
    (tmp_path / "garbage" / ADAPTER_CONFIG).write_text(json.dumps(conf))
    with pytest.raises(ModelError, match="cannot read"):
        engine.load_adapter(tmp_path / "garbage")


def test_evaluate_scores_greedy_completions(engine, v0):
    score = engine.evaluate(v0, n=4)
    assert 0.0 <= score <= 1.0
    assert engine.evaluate(v0, n=4) == score  # greedy: deterministic


def test_a_failing_reward_stops_the_round_with_a_reward_error(tiny_cache, tmp_path):
    f = tmp_path / "bad.py"
    f.write_text("def bad(prompts, completions, **kw):\n    return [1.0] * (len(completions) - 1)\n")
    eng = RoundEngine(tiny_config([f"rewards=[{{function: '{f}:bad'}}]"]))
    v = eng.init_adapter(tmp_path / "v0")
    with pytest.raises(RewardError, match="bad returned 7 values for 8 completions"):
        eng.run_round(v, make_lease(steps=1), tmp_path / "out")


@pytest.mark.slow
def test_smollm2_round(tmp_path):
    """SmolLM2-135M-Instruct (downloaded once into the user cache): one 2-step round on the demo config."""
    from pathlib import Path

    from hubgrpo.config import load_config

    cfg = load_config(Path(__file__).resolve().parents[2] / "configs" / "demo.yaml", overrides=["worker.device=cpu"])
    eng = RoundEngine(cfg)
    sub = eng.run_round(eng.init_adapter(tmp_path / "v0"), make_lease(steps=2), tmp_path / "r1")
    assert sub.steps == 2 and sub.samples == 2 * cfg.params.per_device_train_batch_size
    assert Submission.from_json((tmp_path / "r1" / SUBMISSION_FILE).read_text()) == sub
    assert (tmp_path / "r1" / ADAPTER_WEIGHTS).stat().st_size > 1_000_000


@pytest.mark.slow
def test_auto_peft_finds_smollm2_under_its_hub_name(tmp_path):
    """A SmolLM2 run's adapter names HuggingFaceTB/SmolLM2-135M-Instruct, so AutoPeftModelForCausalLM loads it the
    way Hub users do; offline here, from a Hub cache that holds our conversion of the model under that name."""
    import subprocess
    import sys
    from pathlib import Path

    from hubgrpo.config import load_config
    from hubgrpo.worker.models import smollm2_dir

    cfg = load_config(Path(__file__).resolve().parents[2] / "configs" / "demo.yaml", overrides=["worker.device=cpu"])
    adapter = RoundEngine(cfg).init_adapter(tmp_path / "v0")
    assert json.loads((adapter / ADAPTER_CONFIG).read_text())["base_model_name_or_path"] == \
        "HuggingFaceTB/SmolLM2-135M-Instruct"
    repo = tmp_path / "hub" / "models--HuggingFaceTB--SmolLM2-135M-Instruct"
    snapshot = repo / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    for f in smollm2_dir().iterdir():
        (snapshot / f.name).symlink_to(f)
    code = ("import sys; from peft import AutoPeftModelForCausalLM\n"
            "m = AutoPeftModelForCausalLM.from_pretrained(sys.argv[1])\n"
            "print(type(m).__name__, m.peft_config['default'].base_model_name_or_path)")
    env = dict(__import__("os").environ, HF_HUB_CACHE=str(tmp_path / "hub"), HF_HUB_OFFLINE="1")
    r = subprocess.run([sys.executable, "-c", code, str(adapter)], capture_output=True, text=True, timeout=300,
                       env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "PeftModelForCausalLM HuggingFaceTB/SmolLM2-135M-Instruct" in r.stdout


def test_sampled_evaluate_is_reproducible_per_seed(engine, v0):
    first = engine.evaluate(v0, n=8, greedy=False, seed=7)
    assert 0.0 <= first <= 1.0
    assert engine.evaluate(v0, n=8, greedy=False, seed=7) == first  # same seed, same adapter: same samples
    others = {engine.evaluate(v0, n=8, greedy=False, seed=s) for s in range(8, 12)}
    assert others != {first}  # other seeds draw other completions


@pytest.mark.timeout(120)
def test_ffa_merge_freezes_lora_a_so_rounds_merge_exactly(tiny_cache, tmp_path):
    from hubgrpo.merge import MergeOptions, load_adapter_dir, merge

    eng = RoundEngine(tiny_config(["merge.method=ffa"]), worker="w1")
    v0 = eng.init_adapter(tmp_path / "v0")
    before = load_file(str(v0 / ADAPTER_WEIGHTS))
    for i in range(2):
        eng.run_round(v0, make_lease(steps=2, lease_id=f"l{i}", seed=i), tmp_path / f"s{i}")
        after = load_file(str(tmp_path / f"s{i}" / ADAPTER_WEIGHTS))
        assert all(torch.equal(after[k], v) for k, v in before.items() if "lora_A" in k)  # A never trains
        assert any(not torch.equal(after[k], v) for k, v in before.items() if "lora_B" in k)  # B does
    g = load_adapter_dir(v0)
    subs = [load_adapter_dir(tmp_path / f"s{i}") for i in range(2)]
    result = merge(g, [(subs[0], g, 0.5), (subs[1], g, 0.5)], MergeOptions(method="ffa"))
    assert result.report["method"] == "ffa"  # accepted: the merge refuses adapters whose A moved


_HEAP_SCRIPT = """
import gc, json, tempfile, weakref
from pathlib import Path
from hubgrpo.worker.engine import RoundEngine
from tests.support.models_fixture import make_lease, tiny_config

class Cycle:
    def __init__(self):
        self.me = self

engine = RoundEngine(tiny_config(), worker="w1")
tmp = Path(tempfile.mkdtemp())
v0 = engine.init_adapter(tmp / "v0")
before = Cycle()
dead = weakref.ref(before)
del before  # garbage that only the cycle collector frees: it must not outlive the round
counts = []
engine.run_round(v0, make_lease(steps=2, lease_id="a"), tmp / "a", on_step=lambda s, m: counts.append(gc.get_freeze_count()))
after = gc.get_freeze_count()
gc.collect()
freed = dead() is None
gc.freeze()  # a heap frozen by someone else stays frozen
frozen = gc.get_freeze_count()
engine.run_round(v0, make_lease(steps=1, lease_id="b"), tmp / "b")
print(json.dumps({"during": counts, "after": after, "freed": freed, "frozen": frozen, "still": gc.get_freeze_count()}))
"""


def test_rounds_train_with_the_heap_frozen_and_leave_it_collectable(tiny_cache):
    """In a process of its own: another test's thread in the middle of a round would hold the freeze here."""
    import subprocess
    import sys
    from pathlib import Path

    out = subprocess.run([sys.executable, "-c", _HEAP_SCRIPT], cwd=Path(__file__).resolve().parents[2],
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(r["during"]) == 2 and min(r["during"]) > 10_000  # the loaded model's objects sat out every step
    assert r["after"] == 0 and r["freed"]  # the freeze ended with the round; old garbage is collected again
    assert r["still"] > r["frozen"] // 2  # not unfrozen (objects freed by refcount leave the frozen set)
