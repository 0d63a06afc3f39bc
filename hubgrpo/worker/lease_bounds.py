"""What a lease may ask of a worker's machine, checked before anything is downloaded or trained.

A coordinator is only a URL a participant was given. ``layout.Lease`` checks the form of a lease (commit ids,
names, upload URLs); this checks its size against the run's own config: a lease sets only what a coordinator
legitimately sets (``coordinator.leasing.lease_params``: the learning rate of the run's schedule, a worker's share
of the fleet's batch), never above the config's own values, and at most the steps ``rounds.balance`` can
give a round (4 × ``rounds.steps``) and the prompts those steps consume. Anything else is the error
``bad_lease``, which stops the worker: a hostile coordinator cannot make it generate for ever or fill its memory.
No torch here.
"""

from __future__ import annotations

from hubgrpo.config import Config
from hubgrpo.errors import CoordinatorError
from hubgrpo.layout import Lease

LEASE_PARAMS = ("learning_rate", "per_device_train_batch_size")  # what lease_params ever sets
MAX_STEPS_FACTOR = 4  # rounds.balance gives a slow machine's round at most 4 × rounds.steps


def check_lease_bounds(cfg: Config, lease: Lease, worker: str) -> None:
    """Raise ``CoordinatorError("bad_lease")`` unless ``lease`` is one for ``worker`` (its round's folder is named
    after both: another name could make two rounds share one) and stays within what ``cfg`` lets a coordinator ask."""
    if lease.worker != worker:
        _refuse(f"worker = {lease.worker!r}", f"this worker asked as {worker!r}")
    p = cfg.params
    for key, value in lease.params.items():
        if key not in LEASE_PARAMS:
            _refuse(f"params.{key}", "a coordinator sets only " + " and ".join(LEASE_PARAMS))
        limit = getattr(p, key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= limit * (1 + 1e-9):
            _refuse(f"params.{key} = {str(value)[:40]}", f"it must be above 0 and at most the run's {limit}")
    max_steps = MAX_STEPS_FACTOR * cfg.rounds.steps
    if lease.steps > max_steps:
        _refuse(f"steps = {lease.steps}", f"a round of this run has at most {max_steps} steps")
    max_prompts = max_steps * max(1, p.per_device_train_batch_size * p.gradient_accumulation_steps // p.num_generations)
    if len(lease.prompt_indices) > max_prompts:
        _refuse(
            f"prompt_indices: {len(lease.prompt_indices)} prompts", f"a round of this run uses at most {max_prompts}"
        )


def check_renewal(old: Lease, new: Lease) -> Lease:
    """``new``, a heartbeat's answer for ``old``, unless it is another round: only its deadline, signature and
    upload URLs may change (a new id or version would leave the worker's bookkeeping on the old one)."""
    changed = new.changed_from(old)
    if changed:
        raise CoordinatorError(
            f"the coordinator renewed lease {old.lease_id} as another round ({', '.join(changed)} changed)",
            code="bad_lease",
            hint="the worker keeps the lease it had; this coordinator is broken or hostile: check its URL",
        )
    return new


def _refuse(what: str, why: str) -> None:
    raise CoordinatorError(
        f"the coordinator sent a lease the worker refuses: {what}: {why}",
        code="bad_lease",
        hint="this coordinator is broken or hostile, or runs another config than the run repo's; "
        "check the URL you were given",
    )


def adapter_limit(cfg) -> int:
    """The most bytes one file of a version's adapter may weigh: what a submission of the run may (its config)."""
    return int(cfg.merge.max_submission_mb * 2**20)
