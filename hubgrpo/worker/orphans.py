"""A worker (or evaluator) whose ``hubgrpo run`` / ``worker --gpus`` parent is gone stops instead of retrying."""

from __future__ import annotations

import os
import time

from hubgrpo.errors import CoordinatorError


def orphaned() -> bool:
    """True for a worker started by ``hubgrpo run`` or ``worker --gpus`` (``HUBGRPO_PARENT_PID``) whose parent
    process is gone."""
    parent = os.environ.get("HUBGRPO_PARENT_PID", "")
    return parent.isdigit() and os.getppid() != int(parent)


def orphan_aware_sleep(seconds: float) -> None:
    """The coordinator client's backoff sleep for ``hubgrpo worker`` / ``evaluate``: in slices of at most a second,
    each after checking ``orphaned()``, so that a process whose ``hubgrpo run`` was killed stops within a second of
    its next failed call (CoordinatorError ``orphaned``) instead of sleeping out the client's retries (~70 s)."""
    end = time.monotonic() + max(0.0, seconds)
    while True:
        if orphaned():
            raise orphaned_error()
        left = end - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(1.0, left))


def orphaned_error() -> CoordinatorError:
    return CoordinatorError(
        "the `hubgrpo run` (or `worker --gpus`) that started this process is gone",
        code="orphaned",
        hint="start the run again; it resumes from the repo",
    )


def stop_if_orphaned(err: CoordinatorError) -> None:
    """Called when the coordinator is unreachable: give up instead of retrying if our ``hubgrpo run`` is gone."""
    if orphaned():
        raise orphaned_error() from err
