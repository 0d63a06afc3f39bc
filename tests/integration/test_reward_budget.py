"""A reward function the operator allowed (``--allow-reward``) that a participant's completion sends into
catastrophic backtracking: the coordinator recomputes it in a child process with a time budget
(``coordinator.reward_timeout_s``), refuses the round with ``reward_timeout`` when it runs over, stops the child,
and admits an honest round submitted at the same time meanwhile (through HTTP and repo commits: ``Run``)."""

from __future__ import annotations

import gzip
import json
import os
import threading
import time
from pathlib import Path

import pytest

from hubgrpo import layout
from hubgrpo.coordinator.core import Coordinator
from hubgrpo.coordinator.repo_init import init_repo
from hubgrpo.errors import InvalidSubmission
from hubgrpo.space.api import serve
from hubgrpo.store.local import LocalStore
from hubgrpo.worker.client import CoordinatorClient
from tests.support.adversarial_run import SECRET, Run
from tests.support.coord_helpers import make_config, write_adapter

REWARD = '''
import re

EVIL = re.compile(r"(a+)+$")  # exponential backtracking on "aaaa…a!"


def patterned(prompts, completions, **kwargs):
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [1.0 if EVIL.match(t) else 0.0 for t in texts]
'''
BUDGET_S = 6.0  # a fresh reward process must start within it on a loaded 2-core machine
CHILD_MODULE = "hubgrpo.task.reward_process"


class RegexRun(Run):
    """``Run`` on a config whose reward is a file's function, allowed for the coordinator."""

    def __init__(self, tmp: Path):
        (tmp / "patterned.py").write_text(REWARD)
        spec = f"{tmp / 'patterned.py'}:patterned"
        cfg = make_config(**{"merge.quorum": 1, "rounds.versions": 1000, "coordinator.commit_budget_per_hour": 1000,
                             "rewards": f"[{{function: '{spec}'}}]", "coordinator.reward_timeout_s": BUDGET_S})
        self.tmp, self.store = tmp, LocalStore(tmp / "repo")
        init_repo(self.store, cfg, write_adapter(tmp / "v0", seed=0, b_scale=0.0))
        self.spec = spec
        self.coord = Coordinator(self.store, SECRET, workdir=tmp / "coord", allow_code=[spec])
        self.app, self.url = serve(self.coord, tick_interval=0.05)
        self.client = CoordinatorClient(self.url, retries=0)
        self.seed = 100


def catastrophic(folder: Path, base) -> None:
    """One completion of the round's rollouts becomes 'a' × 64 + '!' (2^64 backtracking steps for the regex)."""
    data = json.loads(gzip.decompress((folder / layout.ROLLOUTS_FILE).read_bytes()))
    first = data["batches"][0]["completions"][0]
    evil = "a" * 64 + "!"
    data["batches"][0]["completions"][0] = evil if isinstance(first, str) else [{"role": "assistant",
                                                                                 "content": evil}]
    (folder / layout.ROLLOUTS_FILE).write_bytes(gzip.compress(json.dumps(data).encode()))


def reward_children() -> list[int]:
    """Processes of this test's user running the isolated reward module."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if CHILD_MODULE.encode() in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


@pytest.mark.timeout(120)
def test_a_catastrophic_regex_reward_is_stopped_and_the_round_refused_while_others_are_admitted(tmp_path):
    run = RegexRun(tmp_path)
    try:
        run.honest_version()  # the reward runs fine on ordinary completions
        got: dict = {}

        def attack():
            t0 = time.monotonic()
            got["answer"] = run.attack(catastrophic)
            got["seconds"] = time.monotonic() - t0

        attacker = threading.Thread(target=attack)
        attacker.start()
        time.sleep(0.5)  # the attack's round is being checked
        t0 = time.monotonic()
        version = run.honest_version()  # admitted and merged beside it
        honest_s = time.monotonic() - t0
        attacker.join(60)
        assert not attacker.is_alive(), "the catastrophic round's submit never got its verdict"
        refused = got["answer"]
        assert isinstance(refused, InvalidSubmission) and refused.code == "reward_timeout", refused
        assert "patterned" in refused.message and f"{BUDGET_S:g} s" in refused.message
        assert got["seconds"] < BUDGET_S + 20, got
        assert version >= 2 and honest_s < BUDGET_S + 15, honest_s
        time.sleep(0.5)
        assert reward_children() == [], "a reward process outlived its budget"
        assert "reward_timeout" in {r["code"] for r in run.client.status()["refusals"]}
        assert run.honest_version() == version + 1
        again = Coordinator(run.store, SECRET, workdir=tmp_path / "restart", allow_code=[run.spec])
        assert again.state.version == run.coord.state.version  # every state.json written loads again
    finally:
        run.close()
    assert os.getpid() not in reward_children()
