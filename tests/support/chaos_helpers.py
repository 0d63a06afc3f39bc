"""Helpers for the chaos suite: subprocess coordinator/workers on the Hub emulator, and run accounting.

Everything listens on and talks to 127.0.0.1 only. Processes are started in their own session so a kill takes
the whole process group; callers keep the Popen objects and end only those.
"""

from __future__ import annotations

import collections
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from hubgrpo import layout, runrepo

ROOT = Path(__file__).resolve().parents[2]
SECRET = "chaos-secret"
_SUB_MSG = re.compile(r"^hubgrpo: submission (\S+)")
_VER_MSG = re.compile(r"^hubgrpo: version (\d+) ")


def chaos_env(endpoint: str, token: str) -> dict:
    """Environment for coordinator and worker subprocesses: the emulator as the Hub, one torch thread."""
    env = dict(os.environ, HF_ENDPOINT=endpoint, HF_TOKEN=token, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               TOKENIZERS_PARALLELISM="false", HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_DISABLE_XET="1",
               GRADIO_ANALYTICS_ENABLED="False", HUBGRPO_SECRET=SECRET)
    env.pop("HF_HUB_OFFLINE", None)
    return env


def start_coordinator(repo_id: str, port: int, env: dict, workdir: Path, log: Path) -> subprocess.Popen:
    """``serve(Coordinator(HubStore(repo_id)), port=port)`` in a subprocess (restartable on the same port)."""
    code = ("import time, pathlib, logging; logging.basicConfig(level=logging.INFO); "
            "from hubgrpo.coordinator.core import Coordinator; from hubgrpo.space.api import serve; "
            "from hubgrpo.store.hub import HubStore; "
            f"c = Coordinator(HubStore({repo_id!r}, retry_base_s=0.2), {SECRET.encode()!r}, "
            f"workdir=pathlib.Path({str(workdir)!r})); "
            f"app, url = serve(c, port={port}, tick_interval=0.5); print('up', url, flush=True); time.sleep(3600)")
    out = open(log, "ab")
    return subprocess.Popen([sys.executable, "-c", code], env=env, stdout=out, stderr=subprocess.STDOUT,
                            cwd=str(ROOT), start_new_session=True)


def start_worker(repo_id: str, url: str, name: str, env: dict, log: Path) -> subprocess.Popen:
    """``hubgrpo worker --threads 1`` in a subprocess."""
    cmd = [sys.executable, "-m", "hubgrpo.cli", "worker", "--repo", repo_id, "--coordinator", url,
           "--name", name, "--threads", "1"]
    out = open(log, "ab")
    return subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=str(ROOT),
                            start_new_session=True)


def kill(proc: subprocess.Popen) -> None:
    """SIGKILL one process group we started, and reap it."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=30)


def wait_for_line(log: Path, pattern: str, timeout: float) -> str:
    """Wait until the process writing ``log`` prints a line matching the regex ``pattern``; return that line (polled
    every 50 ms: a worker's own 'step 1/2' says it is inside a round, which the coordinator's status, polled over
    HTTP, can report a round late). A worker's step line names the version only when its round reports a reward."""
    rx = re.compile(pattern)

    def line():
        text = log.read_text(errors="replace") if log.exists() else ""
        return next((ln for ln in text.splitlines() if rx.search(ln)), None)

    return wait_for(line, timeout, repr(pattern), poll=0.05)


def wait_for(pred, timeout: float, what: str, poll: float = 0.5):
    """Poll ``pred`` until truthy (exceptions count as not yet) or fail after ``timeout`` seconds."""
    end = time.time() + timeout
    while time.time() < end:
        try:
            value = pred()
        except Exception:  # the coordinator or the store may be restarting
            value = None
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


_ANSWER = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) hubgrpo\.worker INFO round (\S+): .*, (\w+)$")


def answered_at(logs: Path) -> dict[str, float]:
    """When each worker's submit of a round was answered (epoch seconds), from the ``w*.log`` files in ``logs``."""
    from datetime import datetime

    out = {}
    for log in sorted(logs.glob("w*.log")):
        for line in log.read_text(errors="replace").splitlines():
            if m := _ANSWER.match(line):
                out[m.group(2)] = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
    return out


def submitted_ids(store) -> set[str]:
    """Submission ids with a folder in the repo (at the head)."""
    out = set()
    for path in store.list_files(layout.SUBMISSIONS):
        parsed = layout.parse_submission_path(path)
        if parsed:
            out.add(parsed[1])
    return out


def audit(store) -> dict:
    """Count what the repo holds: merged/refused/lost submissions, commits per submission and per version."""
    state = runrepo.read_state(store)
    history = store.history()  # newest first
    sub_commits: collections.Counter = collections.Counter()
    ver_commits: collections.Counter = collections.Counter()
    sub_pos: dict[str, int] = {}
    ver_pos: dict[int, int] = {}
    for i, c in enumerate(history):
        first = c.message.splitlines()[0] if c.message else ""
        if m := _SUB_MSG.match(first):
            sub_commits[m.group(1)] += 1
            sub_pos.setdefault(m.group(1), i)
        elif m := _VER_MSG.match(first + " "):
            ver_commits[int(m.group(1))] += 1
            ver_pos.setdefault(int(m.group(1)), i)
    in_repo = submitted_ids(store) | set(sub_commits)  # folders of merged rounds leave the head (keep_submissions)
    merged, refused = set(state.merged_ids), {r.submission_id for r in state.refused}
    unaccounted = in_repo - merged - refused

    def older_than(version: int) -> set[str]:  # positions grow with age (newest first)
        pos = ver_pos.get(version, -1)
        return {s for s in unaccounted if sub_pos.get(s, -1) > pos >= 0}

    return {"version": state.version, "finished": state.finished, "merged_ids": list(state.merged_ids),
            "in_repo": len(in_repo), "merged": len(merged), "refused": len(refused),
            "refused_codes": dict(collections.Counter(r.code for r in state.refused)),
            "lost": sorted(older_than(state.version)), "lost_before_prev": sorted(older_than(state.version - 1)),
            "sub_commits": dict(sub_commits), "ver_commits": dict(ver_commits), "state": state}
