"""`hubgrpo status --coordinator URL` against a hostile coordinator, and `hubgrpo status` on a repo whose state.json
a hostile writer edited.

Everything printed came from the other side: terminal escape sequences (``ESC ]52`` writes the clipboard, ``ESC ]0``
the window title, ``ESC [2J`` clears the screen) must never reach the user's terminal, rich markup in a name is
shown as text, and a status of the wrong shape is a clear error naming the coordinator, never a traceback. The
installed command, over real HTTP on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hubgrpo import layout, runrepo
from hubgrpo.coordinator.repo_init import init_repo
from hubgrpo.coordinator.status import state_status
from hubgrpo.store.local import LocalStore
from tests.support.coord_helpers import make_config, write_adapter
from tests.support.hostile_coordinator import HostileCoordinator, answer

ESC = "\x1b]52;c;ZWNobyBwd25lZA==\x1b\\\x1b[2J\x1b]0;owned\x1b\\"
MARKUP = "[blink]m[/blink]"


@pytest.fixture
def run_repo(tmp_path) -> LocalStore:
    store = LocalStore(tmp_path / "repo")
    init_repo(store, make_config(), write_adapter(tmp_path / "v0", seed=0))
    return store


def status_cmd(repo: LocalStore, *extra: str) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("hubgrpo")
    env = dict(os.environ, COLUMNS="400")
    env.pop("HF_TOKEN", None)
    return subprocess.run([str(exe), "status", "--repo", str(repo.root), *extra], env=env, capture_output=True,
                          text=True, timeout=60)


def hostile_status(repo: LocalStore) -> dict:
    status = state_status(runrepo.read_state(repo), 10)
    status["project"] = "p" + ESC
    status["versions"][0]["contributors"] = ["c" + ESC, MARKUP]
    status["leaderboard"] = [{"worker": "w" + ESC, "user": MARKUP, "accepted": 1, "refused": 0, "samples": 8,
                              "mean_reward": 0.5, "reward_gain": 0.1, "last_seen": 0.0}]
    status.update(commits_last_hour="1" + ESC, commit_budget_per_hour=10, leases=[], finished=False)
    return status


@pytest.mark.timeout(90)
def test_status_from_a_hostile_coordinator_puts_no_escape_sequence_on_the_terminal(run_repo):
    with HostileCoordinator(status=answer(hostile_status(run_repo))) as coord:
        done = status_cmd(run_repo, "--coordinator", coord.url)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "\x1b" not in done.stdout + done.stderr, repr(done.stdout)
    assert MARKUP in done.stdout, done.stdout  # shown as the text it is, not obeyed


@pytest.mark.timeout(90)
def test_status_of_a_repo_with_a_planted_state_puts_no_escape_sequence_on_the_terminal(run_repo):
    state = json.loads(run_repo.read(layout.STATE_FILE))
    state["project_name"] = "p" + ESC
    run_repo.commit({layout.STATE_FILE: json.dumps(state).encode()}, message="planted")
    done = status_cmd(run_repo)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "\x1b" not in done.stdout + done.stderr, repr(done.stdout)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("junk", [{}, {"versions": "x", "leaderboard": 1, "project": 1}], ids=["empty", "wrong-types"])
def test_a_junk_status_is_a_clear_error_not_a_traceback(run_repo, junk):
    with HostileCoordinator(status=answer(junk)) as coord:
        done = status_cmd(run_repo, "--coordinator", coord.url)
    out = done.stdout + done.stderr
    assert done.returncode != 0 and "Traceback" not in out, out
    assert "error:" in out and "is not a hubgrpo status" in out and coord.url in out, out


@pytest.mark.timeout(240)
@pytest.mark.parametrize("recorded", [{"status": "recorded" + ESC}, {"status": "recorded", "eval_reward": "x",
                                                                      "version": "v", "samples": None}],
                         ids=["escapes", "overrides"])
def test_evaluate_prints_its_own_numbers_and_no_escape_sequence(tmp_path, recorded):
    """`hubgrpo evaluate --once` scores v0, records it, prints the result: the coordinator's answer to record_eval
    neither replaces the evaluator's own version, score and count (a traceback, or a forged line) nor puts escapes
    on the terminal."""
    from hubgrpo.cli.embedded import ensure_repo
    from hubgrpo.config import load_config

    run_repo = LocalStore(tmp_path / "real")
    ensure_repo(run_repo, load_config(Path(__file__).parents[2] / "configs" / "tiny.yaml"))  # a real v0 adapter
    exe = Path(sys.executable).with_name("hubgrpo")
    status = {"versions": [{"version": 0, "eval_reward": None}], "finished": True}
    with HostileCoordinator(status=answer(status), record_eval=answer(recorded)) as coord:
        done = subprocess.run([str(exe), "evaluate", "--repo", str(run_repo.root), "--coordinator", coord.url,
                               "--once", "--samples", "2", "--threads", "1", "--quiet"], capture_output=True,
                              text=True, timeout=200, env=dict(os.environ, OMP_NUM_THREADS="1"))
    out = done.stdout + done.stderr
    assert done.returncode == 0 and "Traceback" not in out, out
    assert "\x1b" not in out and "v000000  held-out reward" in done.stdout, repr(out)
