"""Printing run status and reports, and publishing an adapter (``hubgrpo status``, ``run``, ``push``)."""

from __future__ import annotations

import json
import time

from hubgrpo import layout, runrepo
from hubgrpo.card import run_card
from hubgrpo.store.base import Store


def _fmt(x, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def _safe(x):
    """A value from a status (a coordinator's answer, a repo's state.json: the other side wrote it) as rich text:
    no terminal control characters (``errors.wire_text``), and never read as rich markup."""
    from rich.text import Text

    from hubgrpo.errors import wire_text

    return Text(wire_text(x if isinstance(x, str) else str(x), 400))


def _console():
    """A rich console; 160 columns wide when the output is not a terminal (a log file), so no column is cut."""
    import sys

    from rich.console import Console

    return Console() if sys.stdout.isatty() else Console(width=160)


def print_versions(status: dict) -> None:
    from rich.table import Table

    t = Table(title=_safe(status["project"]) + ": reward per version (training: recomputed from the rounds' rollouts)")
    for col in ("version", "reward", "held-out", "from", "submissions", "samples", "max τ", "residual"):
        t.add_column(col, no_wrap=True)
    t.add_column("contributors", overflow="fold", min_width=16)
    for v in status["versions"]:
        start = v.get("start_version")
        t.add_row(
            *map(
                _safe,
                (
                    v["version"],
                    _fmt(v["reward"]),
                    _fmt(v.get("eval_reward")),
                    "-" if start is None else f"v{start} (eval gate)",
                    v["submissions"],
                    v["samples"],
                    v["max_staleness"],
                    _fmt(v["residual"], ".2e"),
                    ", ".join(v["contributors"]),
                ),
            )
        )
    _console().print(t)


def print_leaderboard(status: dict) -> None:
    from rich.table import Table

    t = Table(title="leaderboard")
    cols = ["worker", "user", "accepted", "refused", "samples", "mean reward", "gain", "last seen", "verified"]
    for col in cols:
        t.add_column(col)
    now = time.time()
    for r in status["leaderboard"]:
        t.add_row(
            *map(
                _safe,
                (
                    r["worker"],
                    r["user"] or "-",
                    r["accepted"],
                    r["refused"],
                    r["samples"],
                    _fmt(r["mean_reward"]),
                    _fmt(r["reward_gain"], "+.3f"),
                    f"{now - r['last_seen']:.0f} s ago",
                    _verified(r),
                ),
            )
        )
    _console().print(t)
    verify = status.get("verify")
    if isinstance(verify, dict) and verify.get("checked"):
        _console().print(
            _safe(
                f"proof of rollouts: {verify['checked']} rounds checked, {verify['failed']} failed"
                + (f"; excluded: {', '.join(map(str, verify['excluded']))}" if verify.get("excluded") else "")
            )
        )


def _verified(row: dict) -> str:
    """Proof-of-rollouts verdicts of a leaderboard row: checked rounds and failures, EXCLUDED when a failure
    excluded its participant (a status of an older coordinator has no such keys: "-")."""
    if row.get("excluded"):
        return f"EXCLUDED ({row.get('failed', 0)} failed of {row.get('checked', 0)})"
    return f"{row['checked']} checked, {row['failed']} failed" if row.get("checked") else "-"


def print_checkpoint(status: dict, *, live: bool) -> None:
    """The live version and the last checkpoint (the version the run repo holds; a restart resumes there)."""
    cp = status.get("checkpoint")
    if not isinstance(cp, dict):
        return
    behind = status["version"] - cp["version"] if isinstance(cp.get("version"), int) else None
    where = f"live version {status['version']} at the coordinator, " if live else ""
    _console().print(
        _safe(
            f"{where}last checkpoint: version {cp.get('version')} ({cp.get('tag')}, commit "
            f"{str(cp.get('sha'))[:10]})"
            + (f"; {behind} version(s) since, not in the repo yet" if live and behind else "")
        )
    )


def print_status(store: Store, coordinator: str | None, as_json: bool) -> None:
    """Status from a live coordinator when given, else from the repo's state.json."""
    from hubgrpo.coordinator.status import state_status

    if coordinator:
        from hubgrpo.worker.client import CoordinatorClient

        status = CoordinatorClient(coordinator).status()
    else:
        cfg = runrepo.read_config(store)
        status = state_status(runrepo.read_state(store), cfg.rounds.versions)
        hour_ago = time.time() - 3600
        status["commits_last_hour"] = sum(c.created_at > hour_ago for c in store.history(limit=500))
        status["commit_budget_per_hour"] = cfg.coordinator.commit_budget_per_hour
        status["checkpoint"] = {
            "version": status["version"],
            "tag": layout.version_tag(status["version"]),
            "sha": store.head(),
            "at": None,
        }  # state.json is the last checkpoint's
    if as_json:
        print(json.dumps(status, indent=1, default=str))  # control characters escaped as \u001b
        return
    try:
        print_versions(status)
        print_leaderboard(status)
        leases = status.get("leases")
        extra = f", live leases {len(leases)}" if leases is not None else " (no live coordinator asked)"
        _console().print(
            _safe(
                f"commits in the last hour: {status['commits_last_hour']} / budget "
                f"{status['commit_budget_per_hour']}{extra}; finished: {status['finished']}"
            )
        )
        print_checkpoint(status, live=bool(coordinator))
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:  # not the shape a status has
        from hubgrpo.errors import CoordinatorError, wire_text

        raise CoordinatorError(
            f"the status from {wire_text(coordinator or store.location, 200)} is not a hubgrpo "
            f"status ({type(e).__name__}: {wire_text(str(e), 100)})",
            code="protocol",
            hint="check the URL: is it the run's coordinator, of this hubgrpo version?",
        ) from None


def print_run_report(status: dict, store: Store, cfg) -> None:
    """After ``hubgrpo run``: where the adapter is, reward per version, the plot."""
    from pathlib import Path

    from hubgrpo.cli.embedded import plot

    print_versions(status)
    print_leaderboard(status)
    root = Path(store.location)
    png = plot(status, (root if root.exists() else Path("runs") / cfg.project_name) / "reward.png")
    first = next((v["reward"] for v in status["versions"] if v["reward"] is not None), None)
    last = status["versions"][-1]["reward"] if status["versions"] else None
    print(
        f"final adapter: {store.location} (version {status['version']}, tag "
        f"{layout.version_tag(status['version'])}; load with PeftModel.from_pretrained)\n"
        f"reward: first merged round {_fmt(first)} → last {_fmt(last)}; wall {status.get('wall_s', 0):.0f} s\n"
        f"plot: {png}"
    )


def push_adapter(src: Store, dst: Store, *, version: int | None = None, private: bool = False) -> str:
    """Copy a version's adapter to ``dst`` with a model card (library_name peft, base_model, reward table)."""
    from hubgrpo.errors import NotFound

    cfg = runrepo.read_config(src)
    shas = runrepo.version_shas(src)
    version = max(shas) if version is None else version
    if version not in shas:
        raise NotFound(f"version {version} does not exist in {src.location}", hint=f"versions: {sorted(shas)}")
    state = runrepo.read_state(src, shas[version])
    dst.create(exist_ok=True, private=private)
    adds = {f: src.read(f, shas[version]) for f in layout.ADAPTER_FILES}
    adds[layout.MODEL_CARD] = run_card(cfg, state).encode()
    sha = dst.commit(adds, message=f"hubgrpo: {cfg.project_name} version {version}")
    return sha
