"""``hubgrpo run CONFIG`` with ``backend: hf-jobs``: the run repo on the Hub, the coordinator on a Space (deployed
here unless ``backend_options.deploy`` is false or the coordinator is a URL), the workers as Hugging Face Jobs
(``backend_options``: workers, flavor, timeout, image, install). This process only watches the coordinator's
status; Ctrl-C, SIGTERM or the end of the run cancels the jobs still running."""

from __future__ import annotations

import logging
import os
import time

from hubgrpo.config import Config
from hubgrpo.config.recipe import pipeline_flag
from hubgrpo.errors import ConfigError, StoreError

log = logging.getLogger("hubgrpo.cli.jobs_run")
JOBS_POLL_S = 30.0  # how often the jobs' stages are read (the status is read every second)


class JobHandle:
    """A job seen like a local process by the status printer: ``poll()`` is None while it schedules or runs."""

    def __init__(self, job_id: str):
        self.id, self.stage = job_id, "SCHEDULING"

    def poll(self):
        return None if self.stage in ("SCHEDULING", "RUNNING") else self.stage


def run_on_jobs(
    cfg: Config, repo: str, *, on_status=None, max_wall_s: float | None = None, pipeline: bool | None = None
) -> dict:
    """Initialise ``repo`` (kept when it is already a run), deploy the Space, start the jobs, watch until the run
    finishes; return the final status (with ``wall_s`` and ``jobs``). ``pipeline``: the workers' ``--pipeline``
    (None: the config's ``worker.pipeline``)."""
    from huggingface_hub import get_token

    from hubgrpo.cli.embedded import coordinator_secret, ensure_repo
    from hubgrpo.launch import jobs
    from hubgrpo.store import open_store

    opts = cfg.backend_options
    token, endpoint = os.environ.get("HF_TOKEN") or get_token(), os.environ.get("HF_ENDPOINT")
    if not opts.coordinator:
        raise ConfigError(
            "backend hf-jobs needs backend_options.coordinator: the Space (user/name) that coordinates",
            hint="set backend_options.coordinator: you/run1-coordinator (deployed by hubgrpo run)",
        )
    specs = jobs.worker_specs(
        repo,
        opts.coordinator,
        workers=opts.workers,
        flavor=opts.flavor,
        timeout=opts.timeout,
        image=opts.image,
        install=opts.install,
        endpoint=endpoint,
        worker_args=pipeline_flag(pipeline),
    )
    api = jobs.hf_api(token, endpoint)
    store = open_store(repo, token=token, endpoint=endpoint)
    ensure_repo(store, cfg)
    if opts.deploy and jobs.is_space_id(opts.coordinator):
        from hubgrpo.space.deploy import deploy

        out = deploy(
            repo,
            opts.coordinator,
            token=token,
            secret=coordinator_secret(store).decode(),
            endpoint=endpoint,
            private=cfg.hub.private,
        )
        log.warning("coordinator Space %s deployed (commit %s)", out["url"], out["commit"][:12])
    import signal

    from hubgrpo.cli.embedded import _unwind_on_sigterm

    previous = _unwind_on_sigterm()  # SIGTERM unwinds like Ctrl-C, so the jobs are cancelled below
    handles = []
    try:
        assert token, "jobs.hf_api refuses a missing token"
        handles += [JobHandle(j.id) for j in jobs.start(specs, token=token, api=api)]
        status = _watch(cfg, opts.coordinator, token, api, repo, handles, on_status, max_wall_s)
    finally:
        cancelled = jobs.stop(api, repo)
        if cancelled:
            log.warning("cancelled %d job(s) still running", len(cancelled))
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    status["jobs"] = [h.id for h in handles]
    return status


def _watch(cfg, coordinator: str, token, api, repo: str, handles: list[JobHandle], on_status, max_wall_s) -> dict:
    from hubgrpo.launch.jobs import run_jobs
    from hubgrpo.worker.client import CoordinatorClient

    client = CoordinatorClient(coordinator, token=token, retries=30, max_backoff=10.0)  # a Space may be starting
    start, stages_at = time.time(), 0.0
    status = client.status()
    while not status["finished"]:
        time.sleep(1.0)
        status = client.status()
        if time.time() - stages_at > JOBS_POLL_S:
            stages = {j.id: j.status.stage for j in run_jobs(api, repo)}
            for h in handles:
                h.stage = stages.get(h.id, h.stage)
            stages_at = time.time()
            if all(h.poll() is not None for h in handles) and not status["finished"]:
                raise StoreError(
                    "every worker job ended before the run finished",
                    hint=f"`hubgrpo jobs logs --repo {repo}` shows why",
                )
        if on_status:
            on_status(status, handles)
        if max_wall_s and time.time() - start > max_wall_s:
            log.warning("stopping after max_wall_s=%s", max_wall_s)
            break
    status["wall_s"] = time.time() - start
    return status
