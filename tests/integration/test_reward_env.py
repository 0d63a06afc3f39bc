"""The child process that recomputes an allowed reward function on a participant's completions
(``hubgrpo.task.reward_process``) gets none of hubgrpo's secrets: a reward that runs what a completion says (a code
execution reward) would otherwise hand the coordinator's Hub token and lease-signing secret to any participant.
Through a served coordinator and a real round (``tests.system.test_adversarial.Run``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hubgrpo.coordinator.core import Coordinator
from hubgrpo.coordinator.repo_init import init_repo
from hubgrpo.space.api import serve
from hubgrpo.store.local import LocalStore
from hubgrpo.worker.client import CoordinatorClient
from tests.support.adversarial_run import SECRET, Run
from tests.support.coord_helpers import make_config, write_adapter

REWARD = '''
import json
import os

SEEN = {seen!r}
NAMES = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HUBGRPO_SECRET", "JUDGE_ENDPOINT")


def nosy(prompts, completions, **kwargs):
    with open(SEEN, "a") as f:
        f.write(json.dumps({{"pid": os.getpid(), **{{n: os.environ.get(n) for n in NAMES}}}}) + "\\n")
    return [0.5 for _ in completions]
'''


class NosyRun(Run):
    """``Run`` whose reward is a file's function (allowed) that writes down what it sees of the environment."""

    def __init__(self, tmp: Path):
        self.seen = tmp / "seen.jsonl"
        (tmp / "nosy.py").write_text(REWARD.format(seen=str(self.seen)))
        spec = f"{tmp / 'nosy.py'}:nosy"
        cfg = make_config(**{"merge.quorum": 1, "rounds.versions": 1000, "coordinator.commit_budget_per_hour": 1000,
                             "rewards": f"[{{function: '{spec}'}}]"})
        self.tmp, self.store = tmp, LocalStore(tmp / "repo")
        init_repo(self.store, cfg, write_adapter(tmp / "v0", seed=0, b_scale=0.0))
        self.coord = Coordinator(self.store, SECRET, workdir=tmp / "coord", allow_code=[spec])
        self.app, self.url = serve(self.coord, tick_interval=0.05)
        self.client = CoordinatorClient(self.url, retries=0)
        self.seed = 100


@pytest.mark.timeout(120)
def test_the_reward_child_gets_no_hub_token_and_no_lease_secret(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_coordinator_write_token")
    monkeypatch.setenv("HUGGING_FACE_HUB_TOKEN", "hf_coordinator_write_token")
    monkeypatch.setenv("HUBGRPO_SECRET", "the-lease-signing-secret")
    monkeypatch.setenv("JUDGE_ENDPOINT", "http://127.0.0.1:9/judge")  # an ordinary variable a reward may read
    run = NosyRun(tmp_path)
    try:
        assert run.honest_version() >= 1  # the round was rescored in the child, admitted and merged
    finally:
        run.close()
    seen = [e for e in map(json.loads, run.seen.read_text().splitlines()) if e["pid"] != os.getpid()]
    assert seen, "the reward function never ran in a child"  # (the test's own worker scores in this process)
    for env in seen:
        assert env["HF_TOKEN"] is None and env["HUGGING_FACE_HUB_TOKEN"] is None, env
        assert env["HUBGRPO_SECRET"] is None, env
        assert env["JUDGE_ENDPOINT"] == "http://127.0.0.1:9/judge", env
