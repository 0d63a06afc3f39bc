"""Non-built-in reward functions run in a child process with a time budget (the coordinator's rescoring).

A reward function the coordinator's operator allowed (``--allow-reward``) is still fed by participants: one
completion can send a regex into catastrophic backtracking, and a thread running it can be neither stopped nor
preempted (``re`` holds the GIL), so the whole coordinator would hang. ``score`` therefore runs the round's
non-built-in functions in a fresh ``python -m hubgrpo.task.reward_process``: the request (this process's own data:
the functions' names and kwargs, the prompts, the run's dataset columns and the round's completions) goes as a
pickle on its stdin, the values come back as JSON on its stdout, and when the budget runs out the child and
everything it started are killed (SIGKILL to its process group) and ``TimeoutError`` is raised. The child also
limits its own CPU time, so it ends even if the coordinator dies first, and it gets the coordinator's environment
without its secrets (``WITHHELD``: the Hub token, the lease-signing secret; a reward's own values come as its
kwargs): a reward that runs what a completion says would otherwise hand them to any participant. Built-in rewards
stay in-process: they are linear in the completion's length.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import signal
import subprocess
import sys
from typing import Any

from hubgrpo.errors import HubGrpoError, RewardError

MAX_ANSWER_BYTES = 64 << 20  # a round's values as JSON are kilobytes; anything beyond is a broken function
WITHHELD = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HUBGRPO_SECRET")  # the coordinator's secrets: no reward needs them


class IsolatedReward:
    """A non-built-in reward (named as ``load_rewards`` names it) that only ``score`` calls, in a child process."""

    def __init__(self, spec: str, *, name: str, weight: float = 1.0, kwargs: dict | None = None):
        self.spec, self.__name__, self.weight, self.kwargs = spec, name, weight, dict(kwargs or {})


def score(rewards: list[IsolatedReward], inputs: list[tuple], budget_s: float) -> list[list[list]]:
    """``[batch][function][completion]`` values of ``rewards`` for ``inputs`` (one ``(prompts, columns,
    completions)`` per generation batch), computed in a child process within ``budget_s`` seconds. Raises
    ``TimeoutError`` past the budget (the child is killed), ``RewardError`` when a function fails."""
    request = pickle.dumps(
        {
            "path": list(sys.path),
            "budget_s": budget_s,
            "inputs": inputs,
            "rewards": [(r.spec, r.__name__, r.weight, r.kwargs) for r in rewards],
        }
    )
    env = {k: v for k, v in os.environ.items() if k not in WITHHELD}  # a reward may run what a completion says
    proc = subprocess.Popen(
        [sys.executable, "-m", __name__],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        env=env,
    )
    try:
        out, err = proc.communicate(request, timeout=budget_s)
    except subprocess.TimeoutExpired:
        names = ", ".join(r.__name__ for r in rewards)
        raise TimeoutError(
            f"reward function {names} took more than {budget_s:g} s on this round's completions (stopped)"
        ) from None
    finally:
        _kill(proc)
    try:
        answer = json.loads(out[:MAX_ANSWER_BYTES])
    except ValueError:
        tail = err.decode(errors="replace").strip()[-300:]
        raise RewardError(f"the reward process exited with code {proc.returncode}: {tail}") from None
    if "error" in answer:
        raise RewardError(str(answer["error"])[:1000])
    return answer["values"]


def _kill(proc: subprocess.Popen) -> None:
    """Stop the child and whatever it started (its own process group), and reap it."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            proc.kill()
    proc.communicate()


def _limit_cpu(budget_s: float) -> None:
    try:
        import resource

        limit = math.ceil(budget_s) + 2
        resource.setrlimit(resource.RLIMIT_CPU, (limit, limit + 1))
    except (ImportError, ValueError, OSError):  # not POSIX, or a hard limit already lower: the parent still kills
        pass


def main() -> int:
    """The child: read the request, score every batch, answer ``{"values": ...}`` or ``{"error": ...}``."""
    request = pickle.load(sys.stdin.buffer)  # from the coordinator that started this process: its own data
    _limit_cpu(request["budget_s"])
    sys.path[:] = request["path"]
    answer_to = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # what the user's function prints goes to stderr, not into the answer
    sys.stdout = sys.stderr
    from hubgrpo.task.rewards import Reward, load_function

    batch = None
    try:
        functions = [
            Reward(load_function(spec), name=name, weight=weight, kwargs=kwargs)
            for spec, name, weight, kwargs in request["rewards"]
        ]
        values = []
        for batch, (prompts, columns, completions) in enumerate(request["inputs"]):
            values.append([f(prompts, completions, **columns) for f in functions])
        answer: dict[str, Any] = {"values": values}
    except HubGrpoError as e:
        answer = {"error": e.message if batch is None else f"batch {batch}: {e.message}"}
    json.dump(answer, answer_to)
    answer_to.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
