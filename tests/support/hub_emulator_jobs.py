"""Hugging Face Jobs for the local Hub emulator: each job's command runs as a LOCAL PROCESS.

Routes (huggingface_hub 2.4 ``HfApi.run_job`` / ``list_jobs`` / ``inspect_job`` / ``fetch_job_logs`` /
``cancel_job``), all under ``/api/jobs/{namespace}``:

- ``POST`` with the job spec (``command``, ``environment``, ``secrets``, ``flavor``, ``timeoutSeconds``,
  ``labels``, ``dockerImage`` …) → the job's JSON; the command starts at once (stage RUNNING).
- ``GET`` → the namespace's jobs, filtered by ``label=k=v`` (all must match) and ``stage=`` (any may match).
- ``GET /{id}`` → one job; ``GET /{id}/logs`` → its output so far as server-sent events
  (``data: {"timestamp", "data"}``); ``POST /{id}/cancel`` → the process group gets SIGTERM (SIGKILL after 5 s),
  stage CANCELED.

A job's process sees only a few variables of the emulator's own environment (``PASS_ENV``: PATH with this
Python's bin folder first, HOME, caches, thread counts), then the job's ``environment`` and its ``secrets`` — as on
HF Jobs, where a secret reaches the container as an environment variable and nothing else does. The answer lists
secret NAMES only. A process that exits 0 ends COMPLETED, else ERROR; ``timeoutSeconds`` kills it (ERROR).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from tests.support.hub_emulator_state import HubError, iso

PASS_ENV = ("HOME", "LANG", "TMPDIR", "HUBGRPO_CACHE", "HF_HOME", "HF_HUB_CACHE", "OMP_NUM_THREADS",
            "MKL_NUM_THREADS", "TOKENIZERS_PARALLELISM", "HF_HUB_DISABLE_XET", "PYTHONPATH")


@dataclass
class Job:
    id: str
    owner: str
    spec: dict
    created: float
    stage: str = "RUNNING"
    message: str | None = None
    finished: float | None = None
    lines: list[tuple[float, str]] = field(default_factory=list)
    proc: subprocess.Popen | None = None

    def info(self) -> dict:
        s = self.spec
        return {"id": self.id, "createdAt": iso(self.created), "startedAt": iso(self.created),
                "finishedAt": iso(self.finished) if self.finished else None,
                "dockerImage": s.get("dockerImage"), "spaceId": s.get("spaceId"), "command": s.get("command"),
                "arguments": s.get("arguments", []), "environment": s.get("environment", {}),
                "secrets": {k: "***" for k in s.get("secrets", {})}, "flavor": s.get("flavor"),
                "labels": s.get("labels"), "status": {"stage": self.stage, "message": self.message},
                "owner": {"id": self.owner, "name": self.owner, "type": "user"}}


class JobsEmulator:
    """The jobs of every namespace; ``jobs[id]``. ``stop_all()`` ends every process (emulator shutdown)."""

    def __init__(self):
        self.jobs: dict[str, Job] = {}
        self._lock = threading.Lock()

    def route(self, api, req, seg: list[str]):
        """(endpoint name, thunk) for ``/api/jobs/…``, else None."""
        if len(seg) < 3 or seg[:2] != ["api", "jobs"]:
            return None
        ns, rest, m = seg[2], seg[3:], req.method
        if not rest and m == "POST":
            return "job-create", lambda: self.create(api, req, ns)
        if not rest and m == "GET":
            return "job-list", lambda: self.list(api, req, ns)
        if len(rest) == 1 and m == "GET":
            return "job-info", lambda: self._json(self._job(req, ns, rest[0]).info())
        if len(rest) == 2 and rest[1] == "logs" and m == "GET":
            return "job-logs", lambda: self.logs(req, ns, rest[0])
        if len(rest) == 2 and rest[1] == "cancel" and m == "POST":
            return "job-cancel", lambda: self.cancel(req, ns, rest[0])
        return None

    @staticmethod
    def _json(obj):
        from tests.support.hub_emulator_api import json_resp

        return json_resp(obj)

    def _owner(self, req, ns: str) -> str:
        if req.user is None:
            raise HubError(401, "Invalid credentials in Authorization header")
        if req.user != ns:
            raise HubError(403, f"You cannot manage jobs of namespace {ns}")
        return req.user

    def _job(self, req, ns: str, job_id: str) -> Job:
        self._owner(req, ns)
        job = self.jobs.get(job_id)
        if job is None or job.owner != ns:
            raise HubError(404, f"Job {job_id} not found")
        return job

    def create(self, api, req, ns: str):
        owner = self._owner(req, ns)
        spec = req.json()
        command = spec.get("command")
        if not isinstance(command, list) or not command or not all(isinstance(c, str) for c in command):
            raise HubError(400, "command must be a non-empty list of strings")
        job = Job(id=secrets.token_hex(12), owner=owner, spec=spec, created=time.time())
        env = {k: os.environ[k] for k in PASS_ENV if k in os.environ}
        env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
        env.update({k: str(v) for k, v in (spec.get("environment") or {}).items()})
        env.update({k: str(v) for k, v in (spec.get("secrets") or {}).items()})
        job.proc = subprocess.Popen(command + list(spec.get("arguments") or []), env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        with self._lock:
            self.jobs[job.id] = job
        threading.Thread(target=self._follow, args=(job, spec.get("timeoutSeconds")), daemon=True).start()
        return self._json(job.info())

    def _follow(self, job: Job, timeout_s) -> None:
        """Collect the output; set the final stage when the process ends (or kill it at its timeout)."""
        timer = threading.Timer(float(timeout_s), self._kill, args=(job, "timeout")) if timeout_s else None
        if timer:
            timer.daemon = True
            timer.start()
        for raw in job.proc.stdout:
            job.lines.append((time.time(), raw.decode(errors="replace").rstrip("\n")))
        rc = job.proc.wait()
        if timer:
            timer.cancel()
        with self._lock:
            if job.stage == "RUNNING":
                job.stage = "COMPLETED" if rc == 0 else "ERROR"
                job.message = None if rc == 0 else f"exit code {rc}"
            job.finished = time.time()

    def _kill(self, job: Job, why: str) -> None:
        with self._lock:
            if job.stage != "RUNNING":
                return
            job.stage, job.message = ("CANCELED", None) if why == "cancel" else ("ERROR", "Job timeout")
        for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(job.proc.pid, sig)
                job.proc.wait(timeout=wait)
                return
            except (ProcessLookupError, subprocess.TimeoutExpired):
                continue

    def list(self, api, req, ns: str):
        self._owner(req, ns)
        want = [item.split("=", 1) for item in req.query.get("label", []) if "=" in item]
        stages = set(req.query.get("stage", []))
        out = [j.info() for j in list(self.jobs.values())
               if j.owner == ns and all((j.spec.get("labels") or {}).get(k) == v for k, v in want)
               and (not stages or j.stage in stages)]
        return self._json(out)

    def logs(self, req, ns: str, job_id: str):
        from tests.support.hub_emulator_api import Resp

        job = self._job(req, ns, job_id)
        events = [{"timestamp": iso(job.created), "data": "===== Job started ====="}]
        events += [{"timestamp": iso(t), "data": line} for t, line in list(job.lines)]
        body = "".join(f"data: {json.dumps(e)}\n\n" for e in events).encode()
        return Resp(200, body, {"Content-Type": "text/event-stream"})

    def cancel(self, req, ns: str, job_id: str):
        job = self._job(req, ns, job_id)
        threading.Thread(target=self._kill, args=(job, "cancel"), daemon=True).start()
        deadline = time.time() + 1.0
        while job.stage == "RUNNING" and time.time() < deadline:
            time.sleep(0.01)
        return self._json({})

    def stop_all(self) -> None:
        for job in list(self.jobs.values()):
            self._kill(job, "cancel")
