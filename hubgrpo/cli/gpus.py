"""``hubgrpo worker --gpus all|0,1,…``: one worker process per GPU of this machine, supervised.

``visible`` lists the GPUs this process may use without importing torch: ``CUDA_VISIBLE_DEVICES`` when it is set
(what CUDA itself honours), else ``nvidia-smi -L``, else ``torch.cuda.device_count()`` in a subprocess.
``choose`` turns ``--gpus`` into (index, device) pairs: the index counts the visible GPUs from 0 as torch numbers
them (``cuda:N``), the device is the ``CUDA_VISIBLE_DEVICES`` entry the child gets, so each child sees its one GPU
as ``cuda:0``. ``supervise`` runs the children (each named ``<name>-gpu<index>``, each with its own lease),
forwards SIGINT, SIGTERM and SIGHUP to them, lets the others go on when one dies, and returns non-zero when any
failed, saying which.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from hubgrpo.errors import ConfigError

ENV = "CUDA_VISIBLE_DEVICES"
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_SMI_GPU = re.compile(r"^GPU (\d+):")
_NONE_HINT = "drop --gpus (one worker for the whole machine), or run where nvidia-smi or CUDA sees a GPU"


def visible(env: Mapping[str, str] | None = None) -> list[str]:
    """The ``CUDA_VISIBLE_DEVICES`` entries of the GPUs this process sees, in CUDA's order; ConfigError if none."""
    env = os.environ if env is None else env
    if ENV in env:
        found, source = _parse_env(env[ENV]), f"{ENV}={env[ENV]!r}"
    elif shutil.which("nvidia-smi"):
        found, source = _from_smi(), "nvidia-smi -L"
    else:
        found, source = _from_torch(), "torch.cuda.device_count()"
    if not found:
        raise ConfigError(f"no GPU visible ({source} lists none)", hint=_NONE_HINT)
    return found


def _parse_env(value: str) -> list[str]:
    """CUDA stops at the first invalid entry; a negative index (``-1``) is the usual way to hide every GPU."""
    out = []
    for entry in (e.strip() for e in value.split(",")):
        if not entry or entry.startswith("-"):
            break
        out.append(entry)
    return out


def _from_smi() -> list[str]:
    try:
        r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if r.returncode != 0:
        return []
    return [m.group(1) for m in map(_SMI_GPU.match, r.stdout.splitlines()) if m]


def _from_torch() -> list[str]:
    code = "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)"
    try:
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
        n = int(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else 0
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return []
    return [str(i) for i in range(n)]


def choose(spec: str, devices: list[str]) -> list[tuple[int, str]]:
    """``--gpus`` (``all`` or comma-separated indices into ``devices``) as (index, device) pairs."""
    shown = ", ".join(str(i) for i in range(len(devices)))
    if spec.strip().lower() == "all":
        return list(enumerate(devices))
    picked: list[int] = []
    for part in (p.strip() for p in spec.split(",")):
        if not part.isdigit():
            raise ConfigError(
                f"--gpus {spec!r}: {part!r} is not a GPU index",
                hint=f"pass --gpus all, or indices separated by commas (visible here: {shown})",
            )
        if int(part) in picked:
            raise ConfigError(
                f"--gpus {spec!r} lists GPU {int(part)} twice: two workers on one GPU",
                hint="name each GPU once (one worker per GPU); for more workers per GPU start more `hubgrpo worker`s",
            )
        if int(part) >= len(devices):
            raise ConfigError(
                f"--gpus {spec!r}: GPU {int(part)} is not visible ({len(devices)} visible: {shown})",
                hint=f"pick among {shown}, or pass --gpus all (the indices count the GPUs {ENV} or nvidia-smi show)",
            )
        picked.append(int(part))
    return [(i, devices[i]) for i in picked]


@dataclass
class Child:
    """One worker process: its GPU index (in the ``--gpus`` numbering), its device entry and its name."""

    index: int
    device: str
    name: str
    proc: subprocess.Popen | None = None

    @property
    def code(self) -> int | None:
        """The exit status as a shell shows it (128 + N for a child ended by signal N); None while it runs."""
        rc = None if self.proc is None else self.proc.poll()
        return None if rc is None else (128 - rc if rc < 0 else rc)


def supervise(gpus: list[tuple[int, str]], name: str, argv: Callable[[str], list[str]], *, poll_s: float = 0.2) -> int:
    """Start ``argv(<name>-gpu<i>)`` once per GPU with ``CUDA_VISIBLE_DEVICES`` set to that GPU, wait for all;
    return 0 when every child exited 0, else the first failed child's status (each failure is reported)."""
    children = [Child(i, dev, f"{name}-gpu{i}") for i, dev in gpus]
    stopping: list[int] = []

    def forward(signum, frame) -> None:
        stopping.append(signum)
        for c in children:
            if c.proc is not None and c.proc.poll() is None:
                c.proc.send_signal(signum)

    main = threading.current_thread() is threading.main_thread()  # signal handlers: the main thread only
    previous = {s: signal.signal(s, forward) for s in FORWARDED} if main else {}
    try:
        for c in children:
            if stopping:
                break
            c.proc = _start(c, argv(c.name))
            _say(f"{c.name}: started on GPU {c.index} ({ENV}={c.device}), pid {c.proc.pid}")
        return _wait(children, poll_s)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _start(child: Child, cmd: list[str]) -> subprocess.Popen:
    # its own session: a Ctrl-C at the terminal reaches each child once, forwarded here, not twice
    env = dict(os.environ, **{ENV: child.device, "HUBGRPO_PARENT_PID": str(os.getpid())})
    return subprocess.Popen(cmd, env=env, start_new_session=True)


def _wait(children: list[Child], poll_s: float) -> int:
    running = [c for c in children if c.proc is not None]
    while running:
        time.sleep(poll_s)
        for c in [c for c in running if c.code is not None]:
            running.remove(c)
            tail = f"; {len(running)} still running" if running else ""
            _say(f"{c.name}: exited with status {c.code}{tail}")
    failed = [c for c in children if c.code != 0]
    if not failed:
        return 0
    listed = ", ".join(
        f"{c.name} (GPU {c.index}): " + ("not started" if c.proc is None else str(c.code)) for c in failed
    )
    _say(f"{len(failed)} of {len(children)} workers failed: {listed}")
    return next((c.code for c in failed if c.code), 1)


def _say(line: str) -> None:
    print(f"hubgrpo worker --gpus: {line}", file=sys.stderr, flush=True)
