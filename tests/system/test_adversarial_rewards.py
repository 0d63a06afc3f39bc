"""A hostile participant against verified rewards and held-out scores, through HTTP and commits only (the
``Run`` of test_adversarial): forged rollouts files are refused with their own code while honest versions merge, a
forged ``reward_mean`` changes nothing anyone sees, and hostile held-out reports are refused."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import httpx
import pytest

from hubgrpo import layout
from hubgrpo.coordinator.core import Coordinator
from hubgrpo.coordinator.repo_init import init_repo
from hubgrpo.errors import InvalidSubmission, Refused
from hubgrpo.space.api import serve
from hubgrpo.store.local import LocalStore
from hubgrpo.worker.client import CoordinatorClient, unwrap
from tests.support.adversarial_run import SECRET, Run, record_edit
from tests.support.coord_helpers import make_config, write_adapter


def rewards_in(tree) -> list[float]:
    """Every number under a key naming a reward in a JSON tree (status, state.json)."""
    if isinstance(tree, dict):
        return [x for k, v in tree.items() for x in ([v] if "reward" in k and isinstance(v, (int, float))
                                                      and not isinstance(v, bool) else rewards_in(v))]
    return [x for v in tree for x in rewards_in(v)] if isinstance(tree, list) else []


def rollouts_edit(edit):
    """Rewrite rollouts.json.gz: ``edit(data)`` changes the parsed JSON in place or returns the raw text to write."""
    def mutate(folder: Path, base) -> None:
        data = json.loads(gzip.decompress((folder / layout.ROLLOUTS_FILE).read_bytes()))
        text = edit(data)
        raw = text if isinstance(text, str) else json.dumps(data)  # json.dumps writes NaN as NaN
        (folder / layout.ROLLOUTS_FILE).write_bytes(gzip.compress(raw.encode()))
    return mutate


def _inflate(data):
    for b in data["batches"]:
        b["rewards"] = [[1.0] * len(col) for col in b["rewards"]]


def _nan(data):
    data["batches"][0]["rewards"][0][0] = float("nan")


def _overflow(data):
    data["batches"][0]["rewards"][0][0] = "@@"
    return json.dumps(data).replace('"@@"', "1e400")


def _foreign_prompts(data):
    data["batches"][0]["prompt_indices"] = [10**9] * len(data["batches"][0]["prompt_indices"])


def _short_batch(data):
    b = data["batches"][0]
    b["prompt_indices"], b["completions"] = b["prompt_indices"][:-1], b["completions"][:-1]
    b["rewards"] = [col[:-1] for col in b["rewards"]]


def no_rollouts(folder: Path, base) -> None:
    (folder / layout.ROLLOUTS_FILE).unlink()


def rollouts_bomb(folder: Path, base) -> None:
    (folder / layout.ROLLOUTS_FILE).write_bytes(gzip.compress(b"[" + b" " * (256 << 20) + b"]"))


ROLLOUT_ATTACKS = {  # name: (mutation, the refusal code)
    "inflated rewards": (rollouts_edit(_inflate), "reward_mismatch"),
    "rollouts reward NaN": (rollouts_edit(_nan), "bad_rollouts"),
    "rollouts reward 1e400": (rollouts_edit(_overflow), "bad_rollouts"),
    "rollouts of prompts never leased": (rollouts_edit(_foreign_prompts), "bad_rollouts"),
    "a rollouts batch one completion short": (rollouts_edit(_short_batch), "bad_rollouts"),
    "10**6 prompt indices": (rollouts_edit(lambda d: '{"batches": [{"prompt_indices": [' + "0," * 10**6 + '0]}]}'),
                             "too_large"),
    "nested rollouts": (rollouts_edit(lambda d: "[" * 20_000 + "]" * 20_000), "bad_rollouts"),
    "rollouts decompression bomb": (rollouts_bomb, "too_large"),
    "no rollouts": (no_rollouts, "no_rollouts"),
}


@pytest.mark.timeout(240)
def test_every_forged_rollouts_file_is_refused_with_its_code_while_honest_versions_merge(tmp_path):
    """The assertions are ``Run``'s (tests/system/test_adversarial.py): each attack refused with its code, an honest version
    merged after it, state.json loading again and a restarted coordinator starting."""
    run = Run(tmp_path)
    try:
        run.honest_version()
        run.refuse_each(ROLLOUT_ATTACKS)
    finally:
        run.close()


@pytest.mark.timeout(120)
def test_a_forged_reward_mean_changes_nothing_visible(tmp_path):
    """A submission.json claiming reward 99 on a task whose maximum is 1: the leaderboard, the curves, the versions,
    state.json and the model card show the reward recomputed from its rollouts (0.5), nowhere 99."""
    from hubgrpo.space import view

    run = Run(tmp_path)
    try:
        forged = run.attack(record_edit(reward_mean="99.0", reward_first="99.0", reward_last="99.0"))
        assert forged["status"] in ("admitted", "merged")
        version = run.wait_merged(forged["submission_id"])
        status = run.client.status()
        row = next(r for r in status["leaderboard"] if r["worker"] == "mallory")
        assert row["mean_reward"] == 0.5 and status["versions"][version]["reward"] == 0.5
        snap = view.snapshot(run.coord)
        assert snap["reward"]["reward"].max() == 0.5 and snap["workers"]["reward"].max() == 0.5
        state = json.loads(run.saved_state().to_json())
        assert max(rewards_in(status)) == max(rewards_in(state)) == 0.5
        cells = [c.strip() for line in run.store.read(layout.MODEL_CARD).decode().splitlines()
                 if line.startswith("|") for c in line.split("|")]
        assert "0.5" in cells and not [c for c in cells if c.startswith("99")]
        assert not [c for row in snap["leaderboard"] + snap["versions"] for c in row if c == 99.0]
    finally:
        run.close()


@pytest.mark.timeout(120)
def test_hostile_held_out_scores_are_refused_and_only_evaluators_record_them(tmp_path):
    """record_eval over HTTP: numbers, types and versions are checked; the first score counts; on an authenticated
    coordinator a worker that may train still may not score (coordinator.evaluators, default the owner)."""
    from hubgrpo.layout import PROTOCOL_VERSION
    from hubgrpo.space.auth import HubAuth

    run = Run(tmp_path)
    try:
        run.honest_version()

        def score(*args, protocol=PROTOCOL_VERSION):
            return run.client._call("record_eval", *args, after_token=[protocol])

        def raw(args: str):  # the JSON a hostile client writes by hand (NaN, Infinity, 1e400 as literals)
            body = '{"data": [%s, null, %d]}' % (args, PROTOCOL_VERSION)
            resp = httpx.post(f"{run.url}/gradio_api/run/record_eval", content=body, timeout=30,
                              headers={"Content-Type": "application/json"})
            return unwrap(resp.json()["data"][0])

        hostile = ["1, NaN, 4", "1, Infinity, 4", "1, -Infinity, 4", "1, 1e400, 4", "1, 99.0, 4", "1, -5.0, 4",
                   "1, 0.5, -3", "1, 0.5, 1000000000000", "1, 0.5, 0", "true, 0.5, 4", '"1", 0.5, 4', "1.5, 0.5, 4",
                   "[1], 0.5, 4", '1, "0.5", 4', "1, null, 4", "1, 0.5, 4.5", "1" + "0" * 40 + ", 0.5, 4",
                   '{"a": 1}, 0.5, 4', "1, true, 4"]
        for args in hostile:
            with pytest.raises(InvalidSubmission) as e:
                raw(args)
            assert e.value.code == "bad_eval", (args, e.value.message)
        with pytest.raises(InvalidSubmission) as e:
            score(999, 0.5, 4)
        assert e.value.code == "unknown_version"
        with pytest.raises(Refused) as e:
            score(1, 0.5, 4, protocol=None)
        assert e.value.code == "version"
        assert score(1, 0.5, 4)["status"] == "recorded"
        assert score(1, 1.0, 4)["status"] == "duplicate"  # the first score of a version counts
        assert run.client.status()["versions"][1]["eval_reward"] == 0.5
        run.check_state_and_restart()
    finally:
        run.close()
    names = {"hf_test_tok_alice": "alice", "hf_test_tok_bob": "bob"}

    def whoami(token):
        if token not in names:
            raise PermissionError(token)
        return {"name": names[token], "orgs": []}

    store = LocalStore(tmp_path / "auth-repo")
    init_repo(store, make_config(), write_adapter(tmp_path / "auth-v0", seed=0))
    coord = Coordinator(store, SECRET, workdir=tmp_path / "auth-coord")
    app, url = serve(coord, auth=HubAuth(["alice", "bob"], whoami=whoami, evaluators=["alice"]))
    try:
        bob = CoordinatorClient(url, token="hf_test_tok_bob", retries=0)
        alice = CoordinatorClient(url, token="hf_test_tok_alice")
        assert bob.lease("bob-box").user == "bob"  # bob may train …
        with pytest.raises(Refused) as e:
            bob.record_eval(0, 0.5, 4)  # … but not score
        assert e.value.code == "auth" and "coordinator.evaluators" in e.value.hint
        assert alice.record_eval(0, 0.25, 4)["status"] == "recorded"
        names = ("submission.json", "rollouts.json.gz")
        with pytest.raises(Refused) as e:
            bob.round_files("bob-box-1", 0, names)  # nor read anyone's rounds through the coordinator
        assert e.value.code == "auth" and "coordinator.evaluators" in e.value.hint
        with pytest.raises(InvalidSubmission) as e2:
            alice.round_files("bob-box-1", 0, names)
        assert e2.value.code == "bad_verdict" and "coordinator.verify: off" in e2.value.message
    finally:
        app.close()


def test_a_run_repo_s_config_cannot_make_the_coordinator_run_code(tmp_path):
    """The coordinator recomputes rewards, so a config naming `os:system` would be code it runs: it refuses to
    start unless its operator allows that name (--allow-reward), through the installed entry point."""
    import subprocess
    import sys

    cfg = make_config()
    evil = cfg.model_copy(update={"rewards": [cfg.rewards[0].model_copy(update={"function": "os:system"})]})
    init_repo(LocalStore(tmp_path / "evil"), evil, write_adapter(tmp_path / "v0", seed=0))
    exe = Path(sys.executable).with_name("hubgrpo")
    r = subprocess.run([str(exe), "coordinator", "--repo", str(tmp_path / "evil"), "--port", "0"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "os:system" in r.stderr and "--allow-reward" in r.stderr
    assert "HUBGRPO_ALLOW_REWARD" in r.stderr  # the Space's way to allow it
    Coordinator(LocalStore(tmp_path / "evil"), SECRET, workdir=tmp_path / "c", allow_code=["os:system"])
