"""A worker started beside its run (``hubgrpo run``; a job launched while its Space builds): ``hubgrpo worker
--wait S`` imports the training stack first, then waits up to S seconds for the coordinator to answer and for the
run repo to hold a run, so the seconds a worker spends loading its libraries overlap the run's own start.

Without ``--wait`` a worker reads the run at once and fails fast when it is missing (the error says how to make
it). The wait never outlives the process that started the worker (``orphan_aware_sleep`` as ``sleep``).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from hubgrpo import runrepo
from hubgrpo.config import Config
from hubgrpo.errors import CoordinatorError, NotFound
from hubgrpo.store.base import Store

POLL_S = 0.25  # between two tries while the run comes up


def preload() -> None:
    """Import torch, transformers, peft and trl now (what ``RoundEngine`` needs), while the run comes up."""
    import hubgrpo.worker.engine  # noqa: F401


def wait_for_run(
    store: Store,
    url: str | None,
    seconds: float,
    *,
    token: str | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[Config, str | None]:
    """The run's config and the coordinator's URL (``url``, else the config's ``coordinator.url``) once the
    coordinator answers and the repo holds a run; ``CoordinatorError``/``NotFound`` naming what did not come up
    within ``seconds``. The coordinator is asked first when its URL is known: it serves only a run that is ready,
    so a run started over (``--force``) is not read before it is rewritten."""
    deadline = clock() + seconds
    if url:
        _coordinator(url, token, deadline, seconds, sleep, clock)
    cfg = _config(store, deadline, seconds, sleep, clock)
    if not url and cfg.coordinator.url:
        url = cfg.coordinator.url
        _coordinator(url, token, deadline, seconds, sleep, clock)
    return cfg, url


def _coordinator(url: str, token: str | None, deadline: float, seconds: float, sleep, clock) -> None:
    from hubgrpo.worker.client import CoordinatorClient

    with CoordinatorClient(url, token=token, retries=0, timeout=max(1.0, min(10.0, seconds))) as probe:
        while True:
            try:
                probe.status()
                return
            except CoordinatorError as e:
                if e.code != "unreachable":
                    raise
                if clock() >= deadline:
                    raise CoordinatorError(
                        f"the coordinator at {url} did not answer within --wait {seconds:g} s: {e}",
                        code="unreachable",
                        hint="start the coordinator (or check its URL), or wait longer with --wait",
                    ) from None
            sleep(POLL_S)


def _config(store: Store, deadline: float, seconds: float, sleep, clock) -> Config:
    while True:
        try:
            return runrepo.read_config(store)
        except NotFound as e:
            if clock() >= deadline:
                raise NotFound(
                    f"{store.location} held no run within --wait {seconds:g} s",
                    hint=e.hint or "create it with `hubgrpo init CONFIG --repo REPO`",
                ) from None
        sleep(POLL_S)
