"""What the Space shows, as plain tables: pure functions of ``Coordinator.status()`` and the run state.

No gradio here (``hubgrpo.space.app`` puts these tables into components); pandas only for the plots' data frames.
Everything reads the coordinator without its lock: ``status()`` copies what it iterates, and ``state`` is replaced
whole by a merge, never mutated in place while being read here.
"""

from __future__ import annotations

import html
import time
from datetime import datetime, timezone
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hubgrpo.coordinator.core import Coordinator

LEADERBOARD_COLUMNS = [
    "worker",
    "user",
    "rounds accepted",
    "rounds refused",
    "samples",
    "mean reward",
    "reward gain",
    "last seen",
    "verified",
]
VERSION_COLUMNS = [
    "version",
    "created (UTC)",
    "reward",
    "held-out reward",
    "started from",
    "submissions",
    "samples",
    "merge residual",
    "max staleness",
    "method",
    "contributors",
    "commit",
]
LEASE_COLUMNS = ["lease", "worker", "user", "base version", "expires in (s)"]
REFUSAL_COLUMNS = ["when (UTC)", "worker", "submission", "code", "reason"]


def _num(x, digits: int = 4):
    return None if x is None else round(float(x), digits)


def ago(ts: float | None, now: float | None = None) -> str:
    """'12 s ago', '3 min ago', '2.0 h ago' ('-' for never)."""
    if not ts:
        return "-"
    dt = max(0.0, (now if now is not None else time.time()) - ts)
    if dt < 90:
        return f"{dt:.0f} s ago"
    if dt < 5400:
        return f"{dt / 60:.0f} min ago"
    return f"{dt / 3600:.1f} h ago"


def utc(ts: float | None) -> str:
    """``2025-01-31 12:00:05`` (UTC), '-' for None."""
    return "-" if not ts else datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def commit_url(store, sha: str) -> str | None:
    """``{endpoint}/{repo_id}/commit/{sha}`` for a Hub repo (with ``datasets/``/``spaces/`` prefixes); None for a
    local store."""
    endpoint, repo_id = getattr(store, "endpoint", None), getattr(store, "repo_id", None)
    if not endpoint or not repo_id:
        return None
    repo_type = getattr(store, "repo_type", "model")
    prefix = "" if repo_type == "model" else f"{repo_type}s/"
    return f"{endpoint.rstrip('/')}/{prefix}{repo_id}/commit/{sha}"


def repo_url(store) -> str | None:
    """The run repo's page on the Hub (None for a local store)."""
    url = commit_url(store, "x")
    return url[: -len("/commit/x")] if url else None


def commit_cell(store, sha: str | None) -> str:
    """A markdown cell: a link to the commit on the Hub, or the short sha for a local store."""
    if not sha:
        return "-"
    url = commit_url(store, sha)
    return f"[{sha[:10]}]({url})" if url else f"`{sha[:12]}`"


def leaderboard_rows(status: dict, now: float | None = None) -> list[list]:
    """One row per worker (ranked by credited samples: ``status.leaderboard``), columns ``LEADERBOARD_COLUMNS``."""
    return [
        [
            r["worker"],
            r.get("user") or "-",
            r["accepted"],
            r["refused"],
            r["samples"],
            _num(r["mean_reward"]),
            _num(r["reward_gain"]),
            ago(r.get("last_seen"), now),
            verified(r),
        ]
        for r in status.get("leaderboard", [])
    ]


def verified(row: dict) -> str:
    """Proof-of-rollouts verdicts of a leaderboard row (``coordinator.verify``): checked rounds, failures, and
    EXCLUDED when a failure excluded its participant; '-' when none was checked."""
    if row.get("excluded"):
        return f"EXCLUDED ({row.get('failed', 0)} failed of {row.get('checked', 0)})"
    return f"{row['checked']} checked, {row['failed']} failed" if row.get("checked") else "-"


def version_rows(status: dict, shas: dict[int, str], store) -> list[list]:
    """One row per global version, newest first, columns ``VERSION_COLUMNS``."""
    rows = []
    for v in reversed(status.get("versions", [])):
        start = v.get("start_version")
        rows.append(
            [
                v["version"],
                utc(v["created_at"]),
                _num(v["reward"]),
                _num(v.get("eval_reward")),
                "-" if start is None else f"v{start} (eval gate)",
                v["submissions"],
                v["samples"],
                _num(v["residual"], 6),
                v["max_staleness"],
                v["method"],
                ", ".join(v["contributors"]) or "-",
                commit_cell(store, shas.get(v["version"])),
            ]
        )
    return rows


def lease_rows(status: dict) -> list[list]:
    """Live leases, columns ``LEASE_COLUMNS``."""
    return [
        [lease["lease_id"], lease["worker"], lease.get("user") or "-", lease["base_version"], lease["expires_in_s"]]
        for lease in status.get("leases", [])
    ]


def refusal_rows(status: dict) -> list[list]:
    """Refused submissions, newest first, columns ``REFUSAL_COLUMNS``."""
    return [
        [utc(r["at"]), r["worker"], r["submission_id"], r["code"], r["message"]]
        for r in reversed(status.get("refusals", []))
    ]


TRAINING, SMOOTHED, HELD_OUT = "training (recomputed)", "training (smoothed)", "held-out (greedy)"
SMOOTHING_POINTS = 20  # the smoothed line averages over about len(points) / SMOOTHING_POINTS versions


def smoothed(values: list[float]) -> list[float]:
    """A debiased exponential moving average (TensorBoard's smoothing) whose window grows with the run: about
    ``len(values) / SMOOTHING_POINTS`` points, at least 1 (short runs are drawn as they are)."""
    window = max(1.0, len(values) / SMOOTHING_POINTS)
    keep = 1.0 - 1.0 / window
    out, level, weight = [], 0.0, 0.0
    for x in values:
        level, weight = keep * level + (1 - keep) * x, keep * weight + (1 - keep)
        out.append(level / weight)
    return out


def reward_curve(status: dict):
    """DataFrame(version, reward, series): per global version the merged rounds' training reward (recomputed by
    the coordinator from their rollouts) — each version's few completions are noisy, so a smoothed line is drawn
    over them — and the held-out reward an evaluator recorded."""
    import pandas as pd

    training = [(v["version"], float(v["reward"])) for v in status.get("versions", []) if v["reward"] is not None]
    rows = [(version, reward, TRAINING) for version, reward in training]
    rows += [(version, reward, SMOOTHED) for (version, _), reward in zip(training, smoothed([r for _, r in training]))]
    rows += [
        (v["version"], float(v["eval_reward"]), HELD_OUT)
        for v in status.get("versions", [])
        if v.get("eval_reward") is not None
    ]
    return pd.DataFrame(rows, columns=["version", "reward", "series"])


def worker_curves(state):
    """DataFrame(version, worker, reward): each merged round's reward, from ``state.versions[].merged[]``."""
    import pandas as pd

    rows = [(v.version, m.worker, float(m.reward_mean)) for v in list(state.versions) for m in list(v.merged)]
    return pd.DataFrame(rows, columns=["version", "worker", "reward"])


def summary_html(status: dict, store) -> str:
    """The header cards: live version, last checkpoint (what the repo holds), samples, workers, leases, pending,
    commits in the last hour."""
    target = status.get("target_versions")
    state = "finished" if status.get("finished") else "running"
    cp = status.get("checkpoint") or {}
    cards = [
        ("version", f"{status['version']}" + (f" / {target}" if target else "")),
        ("state", state),
        ("last checkpoint", f"v{cp['version']}" if isinstance(cp.get("version"), int) else "-"),
        ("samples", f"{status.get('samples_total', 0):,}"),
        ("workers", str(len(status.get("leaderboard", [])))),
        # a finished run merges nothing more: what was still leased or pending is not waited for
        ("live leases", "-" if status.get("finished") else str(len(status.get("leases", [])))),
        ("pending", "-" if status.get("finished") else str(len(status.get("pending", [])))),
        ("commits / hour", f"{status.get('commits_last_hour', 0)} / {status.get('commit_budget_per_hour', '-')}"),
    ]
    body = "".join(
        f'<div class="hg-card"><div class="hg-k">{html.escape(k)}</div><div class="hg-v">{html.escape(v)}</div></div>'
        for k, v in cards
    )
    url = repo_url(store)
    where = (
        f'<a href="{html.escape(url)}" target="_blank">{html.escape(url)}</a>'
        if url
        else f"<code>{html.escape(str(store.location))}</code>"
    )
    return (
        f'<div class="hg-head"><h1>{html.escape(status.get("project") or "hubgrpo run")}</h1>'
        f'<div class="hg-sub">asynchronous GRPO + LoRA · run <code>{html.escape(status.get("run_id", "")[:12])}'
        f'</code> · bucket {where}</div></div><div class="hg-cards">{body}</div>'
    )


def snapshot(coord: Coordinator, now: float | None = None) -> dict:
    """Everything the UI shows, computed once per refresh from ``coord.status()`` (no lock taken)."""
    from hubgrpo.config import to_yaml

    status = coord.status()
    return {
        "summary": summary_html(status, coord.store),
        "leaderboard": leaderboard_rows(status, now),
        "reward": reward_curve(status),
        "workers": worker_curves(coord.state),
        "versions": version_rows(status, dict(coord.shas), coord.store),
        "leases": lease_rows(status),
        "refusals": refusal_rows(status),
        "config": to_yaml(coord.cfg),  # secrets shown as '***'
        "status": status,
    }


def install_line(space_id: str | None, endpoint: str | None) -> str:
    """How to install the hubgrpo this coordinator runs: its Space's published wheel, when on a Space."""
    from hubgrpo import __version__
    from hubgrpo.layout import space_wheel_url

    if space_id:
        return f"pip install {space_wheel_url(space_id, endpoint or 'https://huggingface.co', __version__)}"
    return f"install hubgrpo {__version__} (what `hubgrpo --version` prints on the coordinator's machine)"


def join_markdown(repo: str, space_id: str | None, endpoint: str | None) -> str:
    """How to join: the one-line install of the hubgrpo this Space runs (its published wheel, when on a Space),
    a worker on your machine, and workers on HF Jobs."""
    from hubgrpo import __version__

    target = space_id or "<this Space's id or URL>"
    install = (
        install_line(space_id, endpoint)
        if space_id
        else f"# install hubgrpo {__version__}, the version this coordinator runs"
    )
    return (
        f"**Join the run** (hubgrpo {__version__}):\n\n```bash\n{install}\n"
        f"HF_TOKEN=hf_... hubgrpo worker --repo {repo} --coordinator {target}\n"
        f"# or N workers on Hugging Face Jobs:\n"
        f"HF_TOKEN=hf_... hubgrpo launch --repo {repo} --coordinator {target} --workers 4 --flavor t4-small\n```\n"
        "Add `--upload-via coordinator` to a worker without write access to the run repo. A private Space's "
        "wheel needs your token: `hf download SPACE wheels/… --repo-type space`, then `pip install` the file."
    )
