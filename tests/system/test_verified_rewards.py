"""Verified rewards and held-out scores with the real engine (tiny model, real TRL rounds) and real HTTP:

- an honest run's recomputed rewards are exactly the worker's own (and match what TRL trained on);
- a tampered rollouts file is refused with its code (mismatch, NaN, sizes, shape, bombs);
- ``hubgrpo evaluate --once`` through the installed entry point records a held-out score for every version,
  equal to the engine's own greedy evaluation, kept in state.json across a restart and shown by ``hubgrpo status``.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hubgrpo import layout, runrepo
from hubgrpo.coordinator.core import Coordinator
from hubgrpo.coordinator.verify import RewardCheck
from hubgrpo.errors import InvalidSubmission
from hubgrpo.layout import Rollouts
from hubgrpo.worker.client import CoordinatorClient
from tests.support.coord_helpers import served_tiny_run
from tests.support.models_fixture import tiny_cache, tiny_config  # noqa: F401 (fixture)

EXE = Path(sys.executable).with_name("hubgrpo")
SECRET = b"verified-secret"
SETTINGS = ["merge.quorum=1", "rounds.versions=50", "rounds.steps=2", "coordinator.heartbeat_interval_s=1"]


@pytest.fixture(scope="module")
def served_run(tiny_cache, tmp_path_factory):  # noqa: F811
    """A served coordinator over a local run repo of the tiny model and a real engine to train its rounds."""
    with served_tiny_run(tmp_path_factory.mktemp("verified"), SETTINGS, SECRET) as run:
        yield run


def honest_round(run: dict, name: str = "w1") -> tuple:
    """Lease, train a real round, commit, submit; returns (lease, submission, folder copy, answer)."""
    client = CoordinatorClient(run["url"], retries=2)
    lease = client.lease(name)
    out = run["tmp"] / "rounds" / lease.lease_id
    adapter = client.adapter(lease.base_version, lease.base_sha, run["tmp"] / "bases", 1 << 30)
    sub = run["engine"].run_round(adapter, lease, out)
    keep = shutil.copytree(out, run["tmp"] / "kept" / lease.lease_id)
    sub_id = layout.submission_id(lease.worker, lease.lease_id)
    adds = {layout.submission_path(lease.base_version, sub_id, f): out / f for f in layout.SUBMISSION_FILES}
    answer = client.submit(lease, run["store"].commit(adds, message=f"hubgrpo: submission {sub_id}"))
    return lease, sub, keep, answer


def wait_merged(coord, sub_id: str, timeout: float = 60.0):
    import time

    deadline = time.time() + timeout
    while sub_id not in coord.state.merged_ids:
        assert time.time() < deadline, f"{sub_id} was not merged"
        time.sleep(0.05)
    return next(m for v in coord.state.versions for m in v.merged if m.submission_id == sub_id)


@pytest.mark.timeout(300)
def test_an_honest_run_s_verified_rewards_are_its_own_exactly(served_run):
    for _ in range(2):
        lease, sub, folder, answer = honest_round(served_run)
        entry = wait_merged(served_run["coord"], answer["submission_id"])
        assert entry.reward_mean == sub.reward_mean  # recomputed == self-computed, exactly
        assert RewardCheck(served_run["cfg"]).check(lease, folder) == sub.reward_mean
        trl = sum(m.reward for m in sub.step_metrics) / len(sub.step_metrics)  # what TRL logged (float32)
        assert abs(trl - sub.reward_mean) < 1e-5
    served_run["honest"] = (lease, folder)


def _tamper(folder: Path, edit) -> Path:
    data = json.loads(gzip.decompress((folder / layout.ROLLOUTS_FILE).read_bytes()))
    raw = edit(data)
    (folder / layout.ROLLOUTS_FILE).write_bytes(gzip.compress((raw if isinstance(raw, str) else
                                                               json.dumps(data)).encode()))
    return folder


def _set(path: tuple, value):
    def edit(data):
        node = data
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    return edit


def _completion_changed(data):
    c = data["batches"][0]["completions"][0]
    c[0]["content"] = "aaaaaaaa"  # scores 1.0 with char_fraction, its recorded reward is another


def _longer_text(data):
    batch = data["batches"][0]
    batch["completion_ids"][0] = [1]
    batch["completions"][0][0]["content"] = "x" * 200  # more than one token can decode to


def _swap_ends(indices: list) -> None:
    """[a, a, a, a, b, b, b, b] → [b, a, a, a, b, b, b, a]: no group is one prompt's any more."""
    indices[0], indices[-1] = indices[-1], indices[0]


TAMPERS = {  # name: (edit of the JSON, refusal code)
    "a reward raised": (_set(("batches", 0, "rewards", 0, 0), 0.75), "reward_mismatch"),
    "a completion rewritten": (_completion_changed, "reward_mismatch"),
    "NaN": (_set(("batches", 0, "rewards", 0, 1), float("nan")), "bad_rollouts"),
    "Infinity": (_set(("batches", 0, "rewards", 0, 1), float("inf")), "bad_rollouts"),
    "a negative prompt index": (_set(("batches", 0, "prompt_indices", 0), -1), "bad_rollouts"),
    "another reward function": (_set(("reward_names",), ["os_system"]), "bad_rollouts"),
    "one batch missing": (lambda d: d["batches"].pop(), "bad_rollouts"),
    "groups mixed": (lambda d: _swap_ends(d["batches"][0]["prompt_indices"]), "bad_rollouts"),
    "unknown key": (_set(("extra",), 1), "bad_rollouts"),
    "a completion longer than generation allows": (_set(("batches", 0, "completions", 0),
                                                        "<answer>" * 10_000), "bad_rollouts"),
    "a token id past any vocabulary": (_set(("batches", 0, "completion_ids", 0, 0), 1 << 24), "bad_rollouts"),
    "a negative token id": (_set(("batches", 0, "prompt_ids", 0, 0), -1), "bad_rollouts"),
    "a completion of more tokens than generation allows": (_set(("batches", 0, "completion_ids", 0),
                                                                [1] * 1000), "bad_rollouts"),
    "token ids of one completion fewer": (lambda d: d["batches"][0]["completion_ids"].pop(), "bad_rollouts"),
    "a text longer than its tokens": (_longer_text, "bad_rollouts"),
    "no token ids while the run verifies": (lambda d: [b.update(prompt_ids=None, completion_ids=None)
                                                       for b in d["batches"]], "bad_rollouts"),
    "10**6 completions": (lambda d: json.dumps({**d, "batches": [{**d["batches"][0],
                                                                 "completions": ["a"] * 10**6}]}), "too_large"),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", sorted(TAMPERS))
def test_a_tampered_rollouts_file_is_refused(served_run, name, tmp_path):
    if "honest" not in served_run:
        pytest.skip("needs the honest round of the test above")
    lease, honest = served_run["honest"]
    edit, code = TAMPERS[name]
    folder = _tamper(shutil.copytree(honest, tmp_path / "sub"), edit)
    cfg = served_run["cfg"].model_copy(deep=True)
    cfg.coordinator.verify = "sample"  # rounds must carry their token ids
    with pytest.raises(InvalidSubmission) as e:
        RewardCheck(cfg).check(lease, folder)
    assert e.value.code == code, e.value.message
    assert len(e.value.message) < 600


@pytest.mark.timeout(60)
def test_the_rollouts_file_is_small_and_bounded(served_run):
    if "honest" not in served_run:
        pytest.skip("needs the honest round of the test above")
    from hubgrpo.task.rollouts import read, size_limit

    lease, folder = served_run["honest"]
    size = (folder / layout.ROLLOUTS_FILE).stat().st_size
    data = read(folder / layout.ROLLOUTS_FILE, size_limit(served_run["cfg"], lease))
    assert isinstance(data, Rollouts) and size < 8192 and len(data.batches) == lease.steps
    assert all(len(b.completion_ids or ()) == len(b.completions) for b in data.batches)  # keyed: ids for a replay
    (folder / "bomb").mkdir()
    (folder / "bomb" / layout.ROLLOUTS_FILE).write_bytes(gzip.compress(b"0" * (64 << 20)))  # 64 MiB of zeros
    with pytest.raises(InvalidSubmission) as e:
        read(folder / "bomb" / layout.ROLLOUTS_FILE, size_limit(served_run["cfg"], lease))
    assert e.value.code == "too_large"


@pytest.mark.timeout(420)
def test_evaluate_once_through_the_entry_point_records_every_version(served_run, tiny_cache):  # noqa: F811
    run, env = served_run, dict(os.environ, HUBGRPO_CACHE=str(tiny_cache))
    store, coord = run["store"], run["coord"]
    while coord.state.version < 2:
        wait_merged(coord, honest_round(run)[3]["submission_id"])
    versions = list(range(coord.state.version + 1))
    r = subprocess.run([str(EXE), "evaluate", "--repo", str(store.location), "--coordinator", run["url"], "--once",
                        "--samples", "4", "--threads", "1", "--quiet"], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    status = CoordinatorClient(run["url"]).status()
    scores = {v["version"]: v["eval_reward"] for v in status["versions"]}
    assert sorted(scores) == versions and None not in scores.values(), scores
    shas = runrepo.version_shas(store)
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the evaluator ran (--threads 1): the same arithmetic, the same greedy tokens
    try:
        for v in versions:  # the evaluator's number is the engine's own greedy score of that version
            folder = runrepo.adapter_at(store, shas[v], run["tmp"] / "eval-check")
            assert scores[v] == run["engine"].evaluate(folder, n=4, greedy=True)
            assert {x["version"]: x["eval_samples"] for x in status["versions"]}[v] == 4
    finally:
        torch.set_num_threads(threads)
    assert "evaluated" in r.stdout and f"v{versions[-1]:06d}" in r.stdout
    again = subprocess.run([str(EXE), "evaluate", "--repo", str(store.location), "--coordinator", run["url"],
                            "--once", "--quiet"], env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "evaluated 0 versions" in again.stdout  # nothing left to score
    assert coord.flush()  # the scores reach state.json (the server does it after refusal_flush_s)
    restarted = Coordinator(store, SECRET, workdir=run["tmp"] / "restarted")
    assert {v["version"]: v["eval_reward"] for v in restarted.status()["versions"]} == scores
    out = subprocess.run([str(EXE), "status", "--repo", str(store.location)], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and "held-out" in out.stdout and f"{scores[versions[-1]]:.3f}" in out.stdout
