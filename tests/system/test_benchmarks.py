"""The benchmark suite kept runnable: every script's quick mode runs (as ``python benchmarks/<question>/<script>.py``)
and writes a result in the shared shape with the numbers it should; the kept results carry that shape; the README's
figures table is the one the results give; no script imports another question's.

The quick modes check the scripts, not the figures: tiny model, a few steps. Those that start several processes
or train for tens of seconds are ``slow`` (run them with ``-m slow``)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
QUESTIONS = sorted(p.name for p in BENCH.iterdir() if p.is_dir() and not p.name.startswith(("_", ".")))


def run(script: str, out: Path, *args: str, quick: bool = True, timeout: float = 240) -> str:
    """``python benchmarks/SCRIPT [--quick] --results OUT ARGS`` from the repository root; its output."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "QUIET": "1"}
    cmd = [sys.executable, f"benchmarks/{script}", *(["--quick"] if quick else []), "--results", str(out), *args]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def shaped(path: Path, quick: bool | None = True) -> dict:
    """A result JSON in the shared shape (its markdown beside it, ending with the meta); its data."""
    result = json.loads(path.read_text())
    meta = result["meta"]
    for key in ("script", "command", "commit", "date", "machine", "load", "quick"):
        assert key in meta, f"{path.name}: meta has no {key}"
    for key in ("cpu", "cores", "python", "torch"):
        assert key in meta["machine"], f"{path.name}: meta.machine has no {key}"
    assert set(meta["load"]) >= {"start", "end"}
    assert meta["commit"] and meta["date"], path.name
    assert "headline" in result
    if quick is not None:
        assert meta["quick"] is quick
        assert Path(ROOT / meta["script"]).is_file(), meta["script"]
    if not meta.get("recovered"):
        assert len(meta["load"]["start"]) == 3 and len(meta["load"]["end"]) == 3
        assert meta["machine"]["cores"] and meta["machine"]["python"]
    assert "Measured at commit" in path.with_suffix(".md").read_text().rsplit("\n\n", 1)[-1]
    return result


# --- the suite itself ------------------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_the_figures_table_is_current():
    proc = subprocess.run([sys.executable, "benchmarks/figures.py", "--check"], cwd=ROOT, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.timeout(60)
def test_every_question_has_a_row_and_every_kept_result_the_shared_shape():
    sys.path.insert(0, str(ROOT))
    from benchmarks.figures import QUESTIONS as ROWS

    assert sorted(folder for folder, _, _ in ROWS) == QUESTIONS
    for folder, _, names in ROWS:
        for name in names:
            assert shaped(BENCH / folder / "results" / f"{name}.json", quick=None)["headline"], name
    for path in BENCH.glob("*/results/*.json"):
        assert shaped(path, quick=False)["meta"]["script"].startswith(f"benchmarks/{path.parent.parent.name}/")
    assert not (BENCH / "results").exists(), "results live in their question's folder"


@pytest.mark.timeout(60)
def test_no_script_imports_another_questions_script():
    """A script may import ``benchmarks.common`` and scripts of its own question, nothing else of benchmarks/; of
    tests/, only the helpers in ``tests.support`` (a test module is no library: its helpers move when tests do)."""
    for path in BENCH.glob("*/*.py"):
        mine = path.parent.name
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom) else
                     [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            for name in names:
                if name == "tests" or name.startswith("tests."):
                    assert name.startswith("tests.support"), f"{path.relative_to(ROOT)} imports {name}"
                if name.startswith("benchmarks.") and name != "benchmarks.common":
                    assert name.split(".")[1] == mine, f"{path.relative_to(ROOT)} imports {name}"
                assert name.split(".")[0] not in {p.stem for p in BENCH.glob("*/*.py")} - {"benchmarks"}, \
                    f"{path.relative_to(ROOT)} imports {name} by its bare name"


# --- quick modes -----------------------------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_merge_quick(tmp_path):
    run("merge/merge.py", tmp_path)
    r = shaped(tmp_path / "merge.json")
    assert {c["method"] for c in r["cases"]} == {"svd", "ffa"} and all("error" not in c for c in r["cases"])
    assert all(c["best_s"] > 0 and c["residual"] < 1 for c in r["cases"])
    assert 0 < r["drift"][0]["svd"] < 1


@pytest.mark.timeout(120)
def test_merge_latency_quick(tmp_path):
    run("merge/merge_latency.py", tmp_path)
    rows = shaped(tmp_path / "merge_latency.json")["rows"]
    assert len(rows) == 3 and all(r["quorum"] == 2 and r["latency_s"] > 0 for r in rows)
    assert rows[2]["total_cpu_s"] >= rows[2]["latency_cpu_s"]


@pytest.mark.timeout(120)
def test_round_agreement_quick(tmp_path):
    run("merge/round_agreement.py", tmp_path)
    r = shaped(tmp_path / "round-agreement.json")
    base = r["result"]["bases"]["0"]
    assert -1 <= base["pairwise_cos_mean"] <= 1 and base["orthogonal_ratio"] == pytest.approx(2 ** -0.5)


@pytest.mark.timeout(120)
def test_staleness_phase_quick(tmp_path):
    run("simulator/staleness_phase.py", tmp_path)
    rows = shaped(tmp_path / "staleness_phase.json")["rows"]
    assert len(rows) == 2 and all(0 <= r["mean"] <= 1 and len(r["fresh_shares"]) == 2 for r in rows)


@pytest.mark.timeout(60)
def test_phase_walk_on_the_kept_real_runs(tmp_path):
    real = sorted(str(p) for p in (BENCH / "speedup" / "results").glob("speedup-real-decay-s*.json"))
    run("simulator/phase_walk.py", tmp_path, *real)
    r = shaped(tmp_path / "phase-walk.json")
    assert len(r["seeds"]) == 6 and sum(s["crossings"] for s in r["seeds"]) == 0


@pytest.mark.timeout(90)
def test_scaleout_pool_of_kept_seeds_gives_their_table(tmp_path):
    """Two kept results of one rule (seed 0 at N = 4 and at N = 8, one shared N = 1) pool into one seed with both
    rows, the N = 1 row once; results of another rule are refused."""
    res = BENCH / "scaleout" / "results"
    run("scaleout/pool.py", tmp_path, str(res / "scaleout-mixed-outer15-n4.json"),
        str(res / "scaleout-mixed-outer15-n8.json"), "--name", "pooled", quick=False)
    r = shaped(tmp_path / "pooled.json", quick=False)
    assert [x["workers"] for x in r["seeds"][0]["rows"]] == [1, 4, 8]
    assert {x["workers"]: round(x["speedup_mean"], 2) for x in r["summary"]} == {1: 1.0, 4: 4.48, 8: 7.69}
    assert r["samples"][1]["per_seed"] == {"0": pytest.approx(512 / 592)}
    with pytest.raises(AssertionError, match="differs from scaleout-mixed-outer15-n4 in rule"):
        run("scaleout/pool.py", tmp_path, str(res / "scaleout-mixed-outer15-n4.json"),
            str(res / "scaleout-mixed-fedasync.json"), "--name", "mixed", quick=False)


@pytest.mark.timeout(60)
def test_learning_pool_of_a_pooled_result_gives_its_table(tmp_path):
    kept = BENCH / "learning" / "results" / "learning-b4-tiny-pooled.json"
    run("learning/learning_pool.py", tmp_path, str(kept), "--name", "pooled")
    mine = {r["name"]: r["ratio"] for r in shaped(tmp_path / "pooled.json")["summary"]}
    theirs = {r["name"]: r["ratio"] for r in json.loads(kept.read_text())["summary"]}
    assert mine == pytest.approx(theirs)


@pytest.mark.timeout(60)
def test_store_commit_quick(tmp_path):
    run("round/store_commit.py", tmp_path)
    results = shaped(tmp_path / "store_commit.json")["results"]
    assert len(results) == 3 and all(isinstance(r, str) or r["commit_p50_ms"] > 0 for r in results.values())


@pytest.mark.slow  # ~20 s: a timing tool, CI's budget
@pytest.mark.timeout(120)
def test_api_latency_quick(tmp_path):
    run("load/api_latency.py", tmp_path)
    rows = shaped(tmp_path / "api_latency.json")["rows"]
    assert len(rows) == 6 and all(r["lease"]["p50_ms"] > 0 and r["submit"]["p50_ms"] > 0 for r in rows)


@pytest.mark.slow  # ~30 s each: CI's budget (their behaviour has CI tests of its own)
@pytest.mark.timeout(240)
def test_scaleout_quick_then_rescore_and_sim_quota_on_it(tmp_path):
    run("scaleout/scaleout.py", tmp_path, "--work", str(tmp_path / "work"))
    r = shaped(tmp_path / "scaleout-tiny.json")
    assert [(x["fleet"], x["workers"]) for x in r["summary"]] == [("homog", 1), ("homog", 2)]
    assert r["seeds"][0]["target"] > 0 and (tmp_path / "scaleout-tiny.png").is_file()
    run("scaleout/rescore.py", tmp_path, "--reference", str(tmp_path / "scaleout-tiny.json"), "--runs",
        str(tmp_path / "scaleout-tiny.json"), "--name", "rescored")
    again = shaped(tmp_path / "rescored.json")
    assert [(t["fleet"], t["workers"]) for t in again["summary"]] == [("homog", 1), ("homog", 2)]
    mine, theirs = again["rows"][0]["speedup"], r["seeds"][0]["rows"][1]["speedup"]
    assert (mine is None) == (theirs is None) and (mine is None or mine == pytest.approx(theirs))
    run("scaleout/sim_quota.py", tmp_path, "--runs", str(tmp_path / "scaleout-tiny.json"), "--name", "combined")
    assert shaped(tmp_path / "combined.json")["summary"] == r["summary"]


@pytest.mark.timeout(60)
def test_scaleout_refuses_a_reference_measured_under_another_epoch(tmp_path):
    """N = 1 recorded before the simulator kept the run's schedule (STAMP_EPOCH 4) is no reference for fleets of
    today's code: the run stops before simulating anything, and says why."""
    from benchmarks.common import STAMP_EPOCH, epoch_of, same_epoch

    same_epoch({"meta": {"epoch": STAMP_EPOCH}}, "a result of this code")  # returns: the same epoch
    assert epoch_of({"epoch": STAMP_EPOCH - 1}) == STAMP_EPOCH - 1
    assert epoch_of({"commit": "0" * 40}) is None
    with pytest.raises(SystemExit, match="STAMP_EPOCH"):
        same_epoch({"meta": {"epoch": STAMP_EPOCH - 1}}, "an older result")
    old = BENCH / "scaleout/results/scaleout-mixed-close.json"  # measured at 4758d47, at peak rate throughout
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "benchmarks/scaleout/scaleout.py", "--mode", "mixed-sampled", "--fleets",
                           "hetero", "--workers", "2", "--seeds", "0", "--no-train", "--reference-from", str(old),
                           "--work", str(tmp_path / "work"), "--results", str(tmp_path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=50)
    assert proc.returncode != 0 and "STAMP_EPOCH" in proc.stderr and "measure it again" in proc.stderr, proc.stderr
    assert not list(tmp_path.glob("*.json"))


@pytest.mark.timeout(120)
def test_round_quick(tmp_path):
    run("round/round.py", tmp_path)
    parts = shaped(tmp_path / "round.json")["parts"]
    assert list(parts) == ["tiny"] and parts["tiny"]["rounds"]["s_per_step"] > 0


@pytest.mark.slow  # ~15 s: a timing tool, CI's budget
@pytest.mark.timeout(120)
def test_round_overhead_quick(tmp_path):
    run("round/round_overhead.py", tmp_path)
    r = shaped(tmp_path / "round_overhead.json")
    assert len(r["rows"]) == 2 and r["objects"] > 0 and all(x["one_round_s"] > 0 for x in r["rows"])


@pytest.mark.slow  # ~15 s: a timing tool, CI's budget
@pytest.mark.timeout(120)
def test_profile_step_quick(tmp_path):
    """Every phase of a step is timed, the timed phases fit inside the wall clock they are part of (what is left
    over is not negative: nothing is counted twice), and the FLOP rates are below the peak."""
    run("round/profile_step.py", tmp_path)
    r = shaped(tmp_path / "profile-step.json")
    per = r["per_step_s"]
    assert all(per[k] > 0 for k in ("prefill", "decode", "forward", "backward", "optimizer", "load", "save"))
    assert min(per["generate_other"], per["step_other"], per["round_other"]) > -0.005, per
    assert r["raw"]["counts"]["completion_tokens"] > 0 and r["raw"]["counts"]["steps"] == 2 * 4
    assert all(0 < r["rates"][k]["of_peak"] < 1.5 for k in ("prefill", "decode", "training"))


@pytest.mark.slow  # ~15 s: a timing tool, CI's budget
@pytest.mark.timeout(180)
def test_gpu_smoke_on_the_cpu(tmp_path):
    run("gpu/gpu_smoke.py", tmp_path, "--device", "cpu", "--models", "smollm2-135m")
    r = shaped(tmp_path / "gpu_smoke.json")
    assert r["merge"]["ok"] and all(x["ok"] for x in r["rounds"]), r


@pytest.mark.timeout(240)
def test_gpu_bench_on_the_cpu(tmp_path):
    """A worker's rounds and a bare GRPOTrainer on one tiny shape, decoded compiled (on a CPU: the static cache)
    and eager: both measured, every completion run to the length limit on both sides, the two trainers'
    GRPOConfigs differ only in logging and reward weights, and the two decode modes sample the same tokens. The
    replay script then checks the recorded rounds as a CPU verifier would: none fails, even under strict."""
    run("gpu/gpu_bench.py", tmp_path, "--device", "cpu", "--shapes", "smollm2")
    report = shaped(tmp_path / "gpu_bench.json")
    assert [r["decode"] for r in report["shapes"]] == ["compiled", "eager"]
    for row in report["shapes"]:
        assert row["hubgrpo"]["ok"] and row["trl"]["ok"], row
        assert row["hubgrpo"]["full_length"] and row["trl"]["full_length"]
        assert row["hubgrpo"]["measured_steps"] == row["trl"]["measured_steps"] == 1
        assert row["ratio"] > 0 and row["hubgrpo"]["tokens_per_s"] > 0 and row["trl"]["tokens_per_s"] > 0
        assert row["hubgrpo"]["compile"] == row["trl"]["compile"] == {"graphs": 0, "cudagraph_skips": 0}  # a CPU
        assert set(row["settings_differ"]) <= {"logging_steps", "reward_weights"}, row["settings_differ"]
    (agree,) = report["agreement"]
    assert agree["completions"] == 32 and agree["identical"] == 32, agree
    run("gpu/gpu_replay.py", tmp_path, "--verify", str(tmp_path / "gpu_bench.json"))
    rows = shaped(tmp_path / "gpu-replay.json")["rows"]
    assert len(rows) == 2 and all(r["weights_match"] for r in rows), rows
    for rule in ("wide", "strict"):
        assert all(r[rule]["completions"] == 32 and r[rule]["failed_completions"] == 0 for r in rows), rows


@pytest.mark.slow  # ~50 s: the GPU machine's script, run here on the CPU
@pytest.mark.timeout(360)
def test_the_gpu_script_runs_on_the_cpu_within_its_total(tmp_path):
    """scripts/gpu_check.sh as a lent GPU machine runs it (its results into $OUT), on this CPU: the benchmark gets
    what the total leaves, its own budget 70 s less, a worker step is profiled on a random model of SmolLM2's
    shapes, and the noise check is skipped, not failed, without CUDA."""
    env = {**os.environ, "OUT": str(tmp_path), "GPU_CHECK_TOTAL_S": "300", "GPU_CHECK_PROFILE_S": "60",
           "GPU_CHECK_PROFILE_ARGS": "--device cpu --quick --shape smollm2-135m"}
    env.pop("GPU_CHECK_TIMEOUT_S", None)
    t0 = time.monotonic()
    proc = subprocess.run(["bash", "scripts/gpu_check.sh", "--device", "cpu", "--quick", "--shapes", "smollm2"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=330)
    assert time.monotonic() - t0 < 300
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    given = next(line for line in proc.stdout.splitlines() if "the benchmark gets at most" in line)
    bench = int(given.split("at most ")[1].split()[0])
    assert 140 < bench <= 200, given  # 300 s, less what came before, 40 s and the profile's 60
    report = shaped(tmp_path / "gpu_bench.json")
    assert report["settings"]["budget_s"] == bench - 70 and all(r["hubgrpo"]["ok"] for r in report["shapes"]), report
    assert "no CUDA device here" in proc.stdout and (tmp_path / "gpu_check.log").is_file()
    profile = shaped(tmp_path / "profile-step-gpu.json")
    assert profile["raw"]["shape"] == "smollm2-135m" and profile["per_step_s"]["decode"] > 0, profile["raw"]


@pytest.mark.slow  # ~15 s: a timing tool, CI's budget
@pytest.mark.timeout(120)
def test_generate_options_quick(tmp_path):
    run("round/generate_options.py", tmp_path)
    r = shaped(tmp_path / "generate-options.json")
    assert [a["arm"] for a in r["arms"]] == ["rows 16", "rows 32", "rows 64", "merged", "bfloat16"], r["arms"]
    assert all(a["s"] > 0 and a["tokens_per_s"] > 0 for a in r["arms"])


@pytest.mark.slow  # ~30 s each: CI's budget (their behaviour has CI tests of its own)
@pytest.mark.timeout(180)
def test_restart_loss_quick(tmp_path):
    run("restart/restart_loss.py", tmp_path)
    r = shaped(tmp_path / "restart-loss.json")
    assert len(r["restarts"]) == 1 and r["merged_twice"] == 0
    assert all(x["lost_versions"] <= x["bound"] for x in r["restarts"])


@pytest.mark.timeout(120)
def test_upload_spans_quick(tmp_path):
    run("round/upload_spans.py", tmp_path)
    r = shaped(tmp_path / "upload-spans.json")
    assert r["sent_mb"] < 0.6 * r["adapter_mb"] and len(r["protocol_6"]) > 5 and len(r["protocol_7"]) > 5


@pytest.mark.slow  # ~15 s: a timing tool, CI's budget
@pytest.mark.timeout(180)
def test_upload_route_quick(tmp_path):
    run("load/upload_route.py", tmp_path)
    small = shaped(tmp_path / "upload_route.json")["models"]["small"]
    assert small["sequential"]["mb_per_s"] > 0 and small["concurrent"]["rounds_per_s"] > 0


@pytest.mark.slow  # ~30 s each: CI's budget (their behaviour has CI tests of its own)
@pytest.mark.timeout(180)
def test_anonymous_memory_quick(tmp_path):
    run("load/anonymous_memory.py", tmp_path)
    r = shaped(tmp_path / "anonymous_memory.json")
    assert r["scale"] == 0.01 and r["peak_over_baseline_mib"] < 64


# --- slow quick modes: several processes, or training for tens of seconds ---------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_learning_quick_then_pooled(tmp_path):
    run("learning/learning.py", tmp_path)
    r = shaped(tmp_path / "learning.json")
    assert [x["name"] for x in r["summary"]] == ["baseline", "async-1w"] and r["summary"][1]["gain_ratio"] is not None
    run("learning/learning_pool.py", tmp_path, str(tmp_path / "learning.json"), "--name", "pooled")
    assert len(shaped(tmp_path / "pooled.json")["gains"]) == 2


@pytest.mark.timeout(180)
def test_verify_rounds_quick(tmp_path):
    """Honest worker rounds through the verifier: every one passes, its sample within the budget."""
    run("proof/verify_rounds.py", tmp_path, timeout=170)
    r = shaped(tmp_path / "verify-rounds-tiny.json")
    assert len(r["rounds"]) == 3 and all(x["passed"] and x["checked"] > 0 for x in r["rounds"])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_proof_bench_quick(tmp_path):
    """Honest rounds replayed by both verifiers, every attack kind forged and judged on its sample, the cost."""
    run("proof/proof_bench.py", tmp_path, timeout=280)
    r = shaped(tmp_path / "proof.json")
    assert r["honest"][0]["bf16"]["rounds"] == 8 and r["honest"][0]["fp32"]["rounds"] == 8
    assert len(r["attacks"]) == 9 and all(a["rounds"] == 8 and a["checked_tokens"] > 0 for a in r["attacks"])
    assert all(a["checked_tokens"] <= 0.1 * a["tokens"] for a in r["attacks"])
    assert r["cost"]["bf16"]["tokens_per_s"] > 0 and r["cost"]["fp32"]["share_of_training"] > 0


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_proof_model_quick_then_rendered_again(tmp_path):
    """Honest rounds of both precision pairs, every attack kind (truncated among them), the cost; the result
    recounted from its stored deficits."""
    run("proof/proof_model.py", tmp_path, timeout=280)
    r = shaped(tmp_path / "proof-tiny.json")
    assert {(h["worker"], h["verifier"]) for h in r["honest"]} == {("fp32", "fp32"), ("bf16", "fp32")}
    assert all(h["rounds"] == 8 and h["false_alarms"]["wide"] <= h["rounds"] for h in r["honest"])
    kinds = {a["attack"]: a for a in r["attacks"]}
    assert len(kinds) == 9 and kinds["truncated"]["caught"]["wide"] == 8 and not r["units_left"]
    assert r["cost"]["tokens_per_s"] > 0 and r["cost"]["checked_completions"] >= 1
    run("proof/proof_model.py", tmp_path, "--render", str(tmp_path / "proof-tiny.json"), quick=False)
    again = json.loads((tmp_path / "proof-tiny.json").read_text())
    assert again["headline"] == r["headline"] and again["meta"]["rendered"]


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_proof_model_another_shape_with_rounds_of_two_checked_completions(tmp_path):
    """``--set`` changes the round's shape, ``--checked 2`` makes each round two completions, ``--only`` keeps the
    honest units."""
    run("proof/proof_model.py", tmp_path, "--set", "params.max_completion_length=6", "--checked", "2",
        "--only", "honest:", timeout=360)
    r = shaped(tmp_path / "proof-tiny.json")
    assert "≤ 6 tokens" in r["shape"] and not r["attacks"] and not r["cost"] and not r["units_left"]
    assert all(h["rounds"] == 8 and 16 <= h["tokens"] <= 16 * 6 for h in r["honest"])
    assert "2 checked completion(s)" in (tmp_path / "proof-tiny.md").read_text()


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_speedup_real_quick_then_the_simulator_replays_it(tmp_path):
    run("speedup/speedup_real.py", tmp_path, timeout=360)
    r = shaped(tmp_path / "speedup-real.json")
    row = r["rows"][0]
    assert row["speedup_train_reward"] and row["run_version_at_target"] >= 1 and r["raw"][0]["run"]["rounds"]
    run("simulator/validate.py", tmp_path, str(tmp_path / "speedup-real.json"), "--work", str(tmp_path / "work"),
        "--timing", "median")
    v = shaped(tmp_path / "validate.json")
    assert len(v["seeds"]) == 1 and v["seeds"][0]["versions"] == 6 and (tmp_path / "validate.png").is_file()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_speedup_real_stops_a_run_after_its_target(tmp_path):
    """``--stop-after 2``: the run is ended two rounds after its workers log the (quick) target, before its 12
    versions; the report says so, and the speed-up is still read from the versions it made."""
    run("speedup/speedup_real.py", tmp_path, "--stop-after", "2", timeout=240)
    r = shaped(tmp_path / "speedup-real.json")
    run_ = r["raw"][0]["run"]
    assert run_["stopped"] and 1 <= len(run_["curve"]) < 12 and r["rows"][0]["speedup_train_reward"]
    assert "ended 2 rounds after its workers logged the target" in (tmp_path / "speedup-real.md").read_text()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_speedup_quota_quick(tmp_path):
    run("speedup/speedup_quota.py", tmp_path, timeout=540)
    r = shaped(tmp_path / "speedup-real-quota.json")
    seed = r["seeds"][0]
    assert seed["quota"]["hub_peak_commits_per_hour"] >= 1 and seed["free"]["versions"] == 12


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sim_quota_versions_quick(tmp_path):
    run("scaleout/sim_quota_versions.py", tmp_path, "--work", str(tmp_path / "work"))
    rows = shaped(tmp_path / "sim_quota_versions.json")["rows"]
    assert len(rows) == 3 and all(r["versions"] == 6 for r in rows)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_merge_choice_quick(tmp_path):
    run("merge/merge_choice.py", tmp_path)
    r = shaped(tmp_path / "merge-choice.json")
    assert [s["variant"] for s in r["sims"]] == ["svd"] and r["train"][0]["eval_after"] is not None


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_coordinator_load_quick(tmp_path):
    run("load/coordinator_load.py", tmp_path)
    run_ = shaped(tmp_path / "coordinator_load.json")["runs"][0]
    assert run_["mode"] == "s3" and run_["lost"] == 0 and run_["duplicates_merged"] == 0 and run_["delivered"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_coordinator_load_hub_quick(tmp_path):
    run("load/coordinator_load.py", tmp_path, "--modes", "hub")
    run_ = shaped(tmp_path / "coordinator_load-hub.json")["runs"][0]
    assert run_["mode"] == "hub" and run_["lost"] == 0 and run_["commits"]["emulator_at_end"].get("quota_429", 0) == 0


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_overhead_quick(tmp_path):
    run("round/overhead.py", tmp_path)
    cases = shaped(tmp_path / "overhead.json")["cases"]
    assert [c["store"] for c in cases] == ["local directory"] and cases[0]["rounds"] >= 1


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_run_breakdown_quick(tmp_path):
    run("round/run_breakdown.py", tmp_path)
    r = shaped(tmp_path / "run_breakdown-tiny.json")
    assert r["versions"] == 1 and r["breakdown"]["rounds"] >= 1


@pytest.mark.slow
@pytest.mark.timeout(480)
def test_soak_quick(tmp_path):
    run("soak/soak.py", tmp_path)
    r = shaped(tmp_path / "soak.json")
    assert r["final"]["version"] == 3 and r["gc"]["rc"] == 0


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_task_headroom_smallest_run(tmp_path):
    """task_headroom.py has no quick mode of its own (its logic stays as measured): its smallest run."""
    run("task/task_headroom.py", tmp_path, "--candidates", "addition1", "--steps", "2", "--save-every", "1",
        "--mid", "1", "--eval", "2", "--threads", "1", quick=False, timeout=540)
    rows = shaped(tmp_path / "task-headroom.json", quick=False)["rows"]
    assert [c["step"] for c in rows["addition1"]["curve"]] == [0, 1, 2]


@pytest.mark.slow  # ~20 s: a timing tool, CI's budget
@pytest.mark.timeout(240)
def test_side_by_side_quick(tmp_path):
    run("speedup/side_by_side.py", tmp_path, timeout=200)
    r = shaped(tmp_path / "side-by-side-tiny.json")
    assert len(r["alone"]) == 1 and len(r["side_by_side"]) == 2 and all(len(ts) == 2 for ts in r["side_by_side"])
    assert r["ceiling"] == pytest.approx(2 * r["step_s_alone"] / r["step_s_side_by_side"])
