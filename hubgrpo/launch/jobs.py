"""Workers as Hugging Face Jobs, through ``huggingface_hub``'s Jobs API (``HfApi.run_job``, ``list_jobs``,
``inspect_job``, ``fetch_job_logs``, ``cancel_job``).

``worker_specs`` builds one job spec per worker: an image, a command that installs hubgrpo (the wheel the run's
Space publishes, any pip spec, or nothing when the image has it) and runs ``hubgrpo worker --repo R
--coordinator C --name <unique>``, the flavor and timeout, and labels ``hubgrpo-run=<repo label>`` (plus
``hubgrpo-worker=<name>``) by which ``run_jobs`` finds exactly this run's jobs. On a flavor with several GPUs
(``a10g-largex2``, ``l4x4``, ``h100x8``: ``gpu_count``) the worker runs with ``--gpus all``: one worker per GPU.
The user's token travels only as the job secret ``HF_TOKEN``: never in ``env``, the command line, a label or a
printed spec.
"""

from __future__ import annotations

import hashlib
import re
import secrets as _secrets
import shlex
from dataclasses import asdict, dataclass, field

from hubgrpo import __version__, layout
from hubgrpo.errors import AuthError, ConfigError

RUN_LABEL = "hubgrpo-run"
WORKER_LABEL = "hubgrpo-worker"
DEFAULT_ENDPOINT = "https://huggingface.co"
CPU_IMAGE = "python:3.12"
GPU_IMAGE = "pytorch/pytorch:2.6.0-cuda12.4-cudnn9-runtime"
ACTIVE_STAGES = ("SCHEDULING", "RUNNING")
_SPACE_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_GPUS = re.compile(r"x(\d+)$")  # HF Jobs flavors end in xN for N GPUs: l4x1, l4x4, a10g-largex2, h100x8


@dataclass
class JobSpec:
    """One worker job, as ``HfApi.run_job`` takes it; ``secrets`` holds the secret NAMES shown, never values."""

    name: str
    image: str
    command: list[str]
    flavor: str
    timeout: str | None
    env: dict[str, str] = field(default_factory=dict)
    secrets: list[str] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)

    def shown(self) -> dict:
        """The spec as printed by ``--dry-run`` (secret names only)."""
        return asdict(self)


def run_label(repo: str) -> str:
    """The label value that marks a run's jobs: Hub labels allow letters, digits, ``-`` and ``_`` only, so the
    repo id is sanitised and a short hash of the exact id keeps two runs apart."""
    clean = re.sub(r"[^A-Za-z0-9_-]", "-", repo)[:48].strip("-") or "run"
    return f"{clean}-{hashlib.sha256(repo.encode()).hexdigest()[:8]}"


def is_space_id(coordinator: str) -> bool:
    return "://" not in coordinator and bool(_SPACE_ID.match(coordinator))


# The job's wheel download (python -c, stdlib only: the image may have nothing else). HF_TOKEN goes to the Space's
# own origin only: a redirect to another origin (the Hub's CDN) is followed without it, and any hop that is plain
# HTTP to a host other than loopback is refused (urllib alone copies Authorization to every redirect target).
_FETCH = """\
import os, sys, urllib.parse as p, urllib.request as u
url, target = @URL@, @TARGET@
def origin(x):
    s = p.urlsplit(x)
    return s.scheme, s.hostname, s.port or {"http": 80, "https": 443}.get(s.scheme)
def check(x):
    s = p.urlsplit(x)
    if s.scheme != "https" and not (s.scheme == "http" and s.hostname in ("127.0.0.1", "localhost", "::1")):
        sys.exit(f"hubgrpo: refusing to fetch the wheel from {s.scheme}://{s.hostname}: https (or loopback) only")
class Redirect(u.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        check(newurl)
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and origin(newurl) != origin(url):
            new.remove_header("Authorization")
        return new
check(url)
token = os.environ.get("HF_TOKEN")
req = u.Request(url, headers={"Authorization": "Bearer " + token} if token else {})
data = u.build_opener(Redirect).open(req, timeout=300).read()
open(target + ".part", "wb").write(data)
os.replace(target + ".part", target)
"""


def install_command(install: str, *, coordinator: str, endpoint: str) -> str:
    """Shell that installs hubgrpo in the job: ``space`` (the wheel the run's Space publishes; fetched with the
    job's HF_TOKEN, so private Spaces work, which goes to the Space's origin only: ``_FETCH``), ``none`` (the image
    has it), or a pip requirement / wheel URL."""
    if install == "none":
        return ""
    if install == "space":
        if not is_space_id(coordinator):
            raise ConfigError(
                f"--install space needs the coordinator as a Space id (user/name), not {coordinator!r}",
                hint="pass --install 'PIP SPEC OR WHEEL URL' (or none when the image has hubgrpo)",
            )
        url = layout.space_wheel_url(coordinator, endpoint, __version__)
        target = f"/tmp/{layout.wheel_name(__version__)}"
        fetch = _FETCH.replace("@URL@", repr(url)).replace("@TARGET@", repr(target))
        return f"python -c {shlex.quote(fetch)} && pip install -q {shlex.quote(target)} && "
    return f"pip install -q {shlex.quote(install)} && "


def gpu_count(flavor: str) -> int:
    """GPUs of an HF Jobs flavor, from its ``xN`` suffix (1 when there is none; 0 for ``cpu-*``)."""
    if flavor.startswith("cpu"):
        return 0
    m = _GPUS.search(flavor)
    return int(m.group(1)) if m else 1


def worker_names(workers: int, prefix: str = "job") -> list[str]:
    """Unique worker names: ``<prefix>-<i>-<4 hex>`` (the hex keeps relaunches apart)."""
    tag = _secrets.token_hex(2)
    return [f"{prefix}-{i:02d}-{tag}" for i in range(workers)]


def worker_specs(
    repo: str,
    coordinator: str,
    *,
    workers: int,
    flavor: str,
    timeout: str | None = "2h",
    image: str | None = None,
    install: str = "space",
    endpoint: str | None = None,
    worker_args: list[str] | None = None,
    prefix: str = "job",
) -> list[JobSpec]:
    """One ``JobSpec`` per worker of run ``repo`` coordinated by ``coordinator`` (a Space id or an https URL)."""
    if workers < 1:
        raise ConfigError(f"--workers must be at least 1, got {workers}")
    if repo.count("/") != 1 or repo.startswith((".", "/", "~")):
        raise ConfigError(
            f"the run repo {repo!r} is not a Hub repo id (user/name)",
            hint="a job reaches the run through the Hub: create it with `hubgrpo init --repo user/name`",
        )
    endpoint = (endpoint or DEFAULT_ENDPOINT).rstrip("/")
    setup = install_command(install, coordinator=coordinator, endpoint=endpoint)
    env = {"HF_HUB_DISABLE_TELEMETRY": "1", "PYTHONUNBUFFERED": "1"}
    if endpoint != DEFAULT_ENDPOINT:
        env["HF_ENDPOINT"] = endpoint
    per_gpu = ["--gpus", "all"] if gpu_count(flavor) > 1 else []  # one worker per GPU of the job's machine
    specs = []
    for name in worker_names(workers, prefix):
        argv = ["hubgrpo", "worker", "--repo", repo, "--coordinator", coordinator, "--name", name, *per_gpu]
        argv += worker_args or []
        command = ["bash", "-c", setup + "exec " + shlex.join(argv)]
        specs.append(
            JobSpec(
                name=name,
                image=image or (CPU_IMAGE if flavor.startswith("cpu") else GPU_IMAGE),
                command=command,
                flavor=flavor,
                timeout=timeout,
                env=dict(env),
                secrets=["HF_TOKEN"],
                labels={RUN_LABEL: run_label(repo), WORKER_LABEL: name},
            )
        )
    return specs


def hf_api(token: str | None, endpoint: str | None):
    from huggingface_hub import HfApi

    if not token:
        raise AuthError("HF Jobs need a Hugging Face token", hint="set HF_TOKEN (or run `hf auth login`)")
    return HfApi(endpoint=(endpoint or DEFAULT_ENDPOINT).rstrip("/"), token=token, library_name="hubgrpo")


def start(specs: list[JobSpec], *, token: str, api) -> list:
    """Start one job per spec; the token goes as the job secret HF_TOKEN. Returns the ``JobInfo`` list."""
    from hubgrpo.store.hub import HUB_ERRORS, map_error

    jobs = []
    for spec in specs:
        try:
            jobs.append(
                api.run_job(
                    image=spec.image,
                    command=spec.command,
                    env=spec.env,
                    secrets={"HF_TOKEN": token},
                    flavor=spec.flavor,
                    timeout=spec.timeout,
                    labels=spec.labels,
                    token=token,
                )
            )
        except HUB_ERRORS as e:
            raise map_error(
                e, what=f"start job {spec.name} ({len(jobs)} of {len(specs)} started)", repo="jobs"
            ) from None
    return jobs


def run_jobs(api, repo: str, *, active_only: bool = False) -> list:
    """This run's jobs (by label), newest first."""
    stages = list(ACTIVE_STAGES) if active_only else None
    # the namespace explicitly: huggingface_hub 2.4's list_jobs resolves it with the module-level whoami, which
    # ignores this HfApi's token and endpoint
    namespace = api.whoami()["name"]
    jobs = list(api.list_jobs(labels={RUN_LABEL: run_label(repo)}, status=stages, namespace=namespace))
    return sorted(jobs, key=lambda j: str(j.created_at or ""), reverse=True)


def stop(api, repo: str) -> list[str]:
    """Cancel every scheduling or running job of this run; returns their ids."""
    ids = []
    for job in run_jobs(api, repo, active_only=True):
        api.cancel_job(job_id=job.id)
        ids.append(job.id)
    return ids


def job_row(job) -> dict:
    """A job as one row of ``hubgrpo jobs ls``."""
    labels = job.labels or {}
    return {
        "id": job.id,
        "worker": labels.get(WORKER_LABEL, "?"),
        "stage": job.status.stage,
        "flavor": job.flavor,
        "created": str(job.created_at or "")[:19],
        "url": job.url,
    }
