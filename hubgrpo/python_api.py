"""hubgrpo's Python API: a run from a script, the way the command line does it. Re-exported by the package::

    from hubgrpo import load_config, init_run, run_local, leaderboard, versions, push_adapter, load_adapter

    cfg = load_config("configs/tiny.yaml", overrides=["rounds.versions=3"])
    repo = init_run(cfg, "runs/my-run")            # a local folder, or user/name on the Hub (HF_TOKEN)
    status = run_local(cfg, repo, workers=2)        # coordinator + 2 worker processes on this machine
    print(leaderboard(repo))                        # [{"worker", "user", "accepted", "mean_reward", ...}, ...]
    push_adapter(repo, "user/my-adapter")           # a PEFT repo with a model card (or a local folder)
    model, tokenizer = load_adapter("user/my-adapter")

``repo`` arguments take a repo string (``user/name`` on the Hub, honouring ``HF_TOKEN``/``HF_ENDPOINT``, or a local
path) or the ``Store`` that ``init_run`` returns. Workers on other machines join the same run with
``hubgrpo worker --repo … --coordinator …``; this module runs everything here.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from hubgrpo.config import Config, load_config
from hubgrpo.store.base import Store

__all__ = ["init_run", "run_local", "leaderboard", "versions", "push_adapter", "load_adapter", "store_for"]


def store_for(repo: str | Path | Store) -> Store:
    """The store of a run repo string (Hub ``user/name`` or a local path); a ``Store`` is returned as is."""
    if isinstance(repo, Store):
        return repo
    from hubgrpo.store import open_store

    return open_store(str(repo), token=os.environ.get("HF_TOKEN"), endpoint=os.environ.get("HF_ENDPOINT"))


def _config(config: Config | str | Path) -> Config:
    """The config (a file is loaded), refused when its task would fail on every worker (``task.preflight``)."""
    from hubgrpo.task.preflight import check_task

    cfg = config if isinstance(config, Config) else load_config(config)
    check_task(cfg, "the config" if isinstance(config, Config) else str(config))
    return cfg


def init_run(
    config: Config | str | Path,
    repo: str | Path | Store,
    *,
    force: bool = False,
    echo=logging.getLogger("hubgrpo.init").warning,
) -> Store:
    """Create the run repo with its version-0 adapter (``hubgrpo init``); an existing run is kept (resumed)
    unless ``force``. On the Hub the config is first fitted to the commit quota (``cli.init_quota.fit_to_store``;
    ``echo`` gets each line saying what changed and why). Returns its store."""
    from hubgrpo.cli.embedded import ensure_repo
    from hubgrpo.cli.init_quota import fit_to_store, holds_run

    store = store_for(repo)
    if force or not holds_run(store):
        cfg, lines = fit_to_store(_config(config), store)
        for line in lines:
            echo(f"{store.location}: {line}")
        ensure_repo(store, cfg, force=force)
    return store


def run_local(
    config: Config | str | Path, repo: str | Path | Store, *, workers: int = 2, max_wall_s: float | None = None
) -> dict:
    """``hubgrpo run``: a coordinator in this process and ``workers`` worker processes, until
    ``rounds.versions`` versions exist (or ``max_wall_s``). Returns the final status (versions, leaderboard,
    ``wall_s``). ``repo`` must be a string (a local path or ``user/name``): the workers open it themselves."""
    from hubgrpo.cli.embedded import run

    if isinstance(repo, Store):
        raise TypeError(
            "run_local needs the repo as a string (its worker processes open it): pass the path or "
            "user/name you gave init_run"
        )
    cfg = _config(config)
    return run(cfg, store_for(repo), workers=workers, repo_arg=str(repo), max_wall_s=max_wall_s)


def leaderboard(repo: str | Path | Store) -> list[dict]:
    """One row per (user, worker): ``accepted``/``refused`` rounds, ``samples``, ``mean_reward`` of its merged
    rounds, best first."""
    from hubgrpo import runrepo
    from hubgrpo.coordinator.status import leaderboard as rows

    return rows(runrepo.read_state(store_for(repo)))


def versions(repo: str | Path | Store) -> list[dict]:
    """One row per global version: version, reward of its merged rounds, contributors, time."""
    from hubgrpo import runrepo
    from hubgrpo.coordinator.status import versions_table

    return versions_table(runrepo.read_state(store_for(repo)))


def push_adapter(
    repo: str | Path | Store, to: str | Path | Store, *, version: int | None = None, private: bool = False
) -> str:
    """Publish a version's adapter (default: the latest) as a standalone PEFT repo with a model card; returns the
    commit sha."""
    from hubgrpo.cli.report import push_adapter as push

    return push(store_for(repo), store_for(to), version=version, private=private)


def load_adapter(repo: str | Path | Store, *, revision: str | None = None, device: str = "cpu"):
    """``(PeftModel, tokenizer)``: the run's (or a pushed adapter's) base model with the adapter at ``revision``
    (a tag such as ``v000003``; default the head). Built-in base models load from hubgrpo's cache."""
    import json
    import tempfile

    from peft import PeftModel

    from hubgrpo import layout, runrepo
    from hubgrpo.worker.models import load_model

    store = store_for(repo)
    rev = _commit_for(store, revision)
    folder = runrepo.fetch_dir(
        store, {f: f for f in layout.ADAPTER_FILES}, rev, Path(tempfile.mkdtemp(prefix="hubgrpo-adapter-")) / "adapter"
    )

    base_name = json.loads((folder / layout.ADAPTER_CONFIG).read_text())["base_model_name_or_path"]
    base, tokenizer = load_model(_builtin_for(base_name), device=device)
    return PeftModel.from_pretrained(base, str(folder)).eval(), tokenizer


def _commit_for(store: Store, revision: str | None) -> str | None:
    """The commit ``revision`` names: a sha or a version tag as it is, ``None`` or ``"main"`` the head, another tag
    its commit (only commit ids name a folder of the cache: ``layout.is_commit_id``); None for an empty repo."""
    from hubgrpo import layout
    from hubgrpo.errors import NotFound

    if revision in (None, "main"):
        return store.head()
    if layout.is_commit_id(revision):
        return revision
    sha = store.tags().get(revision)
    if sha is None:
        raise NotFound(
            f"{store.location} has no revision {revision[:80]!r}",
            hint="use a version tag such as v000003, a commit sha, or leave revision out for the head",
        )
    return sha


def _builtin_for(name: str) -> str:
    """The built-in a Hub model name stands for (our exact weights), else the name itself."""
    from hubgrpo.card import BUILTIN_MODELS

    return next((b for b, hub in BUILTIN_MODELS.items() if hub == name), name)
