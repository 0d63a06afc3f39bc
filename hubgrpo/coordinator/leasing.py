"""Leasing rounds: who may hold a lease, which prompts it gets, how long it lives, when the budget says wait.

Fairness and identity (a user is the authenticated HF user; None for a trusted local run):

- a user holds at most ``coordinator.max_leases_per_user`` live leases (code ``lease_cap``);
- a worker name is one live machine per user: a second process leasing under a name whose lease was renewed
  within two heartbeat intervals is refused (``duplicate_worker``); a name whose lease went quiet is a restarted
  worker, and its old lease is given back;
- when the commit budget is contended, a user gets at most an equal share of it (``budget``);
- a lease revived by a heartbeat after it expired gets its prompts back only if no live lease holds them
  (otherwise the heartbeat is refused: prompts are never handed out twice at once).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hubgrpo import layout
from hubgrpo.coordinator import lease_signing, verdicts
from hubgrpo.errors import LeaseError, Refused
from hubgrpo.layout import Lease

if TYPE_CHECKING:
    from hubgrpo.coordinator.core import Coordinator


def refused(code: str, message: str, wait_s: float | None = None, hint: str | None = None) -> Refused:
    """A refusal that says when to ask again: ``wait_s`` (carried over the wire by the server), also in the hint."""
    return Refused(code, message, hint=hint or (f"wait_s={wait_s:.1f}" if wait_s is not None else None), wait_s=wait_s)


def issue(c: Coordinator, worker: str, user: str | None) -> Lease:
    """A signed lease on the current version for ``worker`` of ``user`` (see the module docstring)."""
    layout.check_name(worker)
    now = c.clock()
    if c.state.finished:
        raise Refused(
            "finished",
            f"the run finished at version {c.state.version}",
            hint="nothing left to do; start a new run to train further",
        )
    _check_identity(c, worker, user, now)
    verdicts.refuse_lease(c, worker, user)  # a failed proof of rollouts excluded this participant
    m = c.cfg.merge
    if c.merging is not None and m.max_staleness == 0 and not m.staleness_per_worker:  # synchronous: wait
        raise refused(
            "merging",
            f"version {c.merging} is being merged; with max_staleness 0 a lease on "
            f"version {c.state.version} could not be submitted",
            wait_s=0.5,
        )
    wait = budget_wait(c, now, user)
    if wait > 0:
        raise refused(
            "budget",
            f"commit budget reached ({c.cfg.coordinator.commit_budget_per_hour}/hour, shared "
            f"fairly between users); retry in {wait:.0f} s",
            wait_s=wait,
        )
    key = c.worker_key(worker, user)
    stats = c.state.workers.get(key)
    steps = round_steps(c, key, first_round=stats is None or stats.accepted == 0)
    params = lease_params(c, key)
    p = c.cfg.params
    batch = params.get("per_device_train_batch_size", p.per_device_train_batch_size)
    per_step = max(1, batch * p.gradient_accumulation_steps // p.num_generations)
    lease = Lease(
        lease_id=c.new_lease_id(),
        run_id=c.state.run_id,
        round_id=len(c.state.merged_ids) + len(c.pending) + len(c.active),
        worker=worker,
        user=user,
        base_version=c.state.version,
        base_sha=c.ids[c.state.version],
        prompt_indices=c.pool.take(per_step * steps),
        steps=steps,
        seed=c.cfg.params.seed * 1_000_003 + c.pool.next_index,
        params=params,
        issued_at=now,
        deadline=now + c.cfg.coordinator.lease_timeout_s,
    )
    lease = lease_signing.sign(lease, c.secret)
    c.active[lease.lease_id] = lease
    c.touch_worker(worker, user, now)
    return lease


def lease_params(c: Coordinator, key: str) -> dict:
    """The hyper-parameters a lease for worker ``key`` sets for its round: the learning rate of the run's schedule
    (``scheduled_params``) and, with ``rounds.fleet_batch`` split, the worker's share of the fleet's batch (the
    coordinator's own count of live workers, this one included); nothing the worker's config already says."""
    params = scheduled_params(c.cfg, c.state.version)
    if c.cfg.rounds.fleet_batch == "split":
        batch = c.cfg.worker_batch(live_workers(c, key=key))
        if batch != c.cfg.params.per_device_train_batch_size:
            params["per_device_train_batch_size"] = batch
    return params


def live_workers(c: Coordinator, lease: Lease | None = None, key: str | None = None) -> int:
    """Distinct workers (user and name) that leased or renewed a lease within the last ``lease_timeout_s``, and
    the submitter of ``lease`` (or the worker ``key`` asking for one). Their last contact is kept in state.json, so
    a restarted coordinator counts the fleet it had (its live leases come back only with their heartbeats); a
    worker that released its lease still counts for a lease's lifetime, so the limit does not drop under the
    rounds it admitted. Worker names are free: the count is bounded only by the leases users may hold
    (``coordinator.max_leases_per_user``), so what it raises or lowers is capped (``merge.max_lease_age``, one
    prompt group per step)."""
    now, window = c.clock(), c.cfg.coordinator.lease_timeout_s
    keys = {k for k, ws in tuple(c.state.workers.items()) if now - ws.last_seen <= window}  # one C-level copy
    if lease is not None:
        keys.add(c.worker_key(lease.worker, lease.user))
    if key is not None:
        keys.add(key)
    return len(keys)


def scheduled_params(cfg, version: int) -> dict:
    """The hyper-parameters a lease on ``version`` sets for its round: the run's learning rate schedule
    (``rounds.lr_schedule``); none with a constant rate (the worker's config then applies)."""
    return {} if cfg.rounds.lr_schedule == "constant" else {"learning_rate": cfg.run_lr(version)}


def stagger_fraction(k: int) -> float:
    """The van der Corput sequence in base 2 with 1 first: 1, 1/2, 1/4, 3/4, 1/8, 5/8, 3/8, 7/8, ... — any
    prefix of it spreads round ends over one round about evenly."""
    if k <= 0:
        return 1.0
    x, denom = 0.0, 1.0
    while k:
        denom *= 2
        x += (k & 1) / denom
        k >>= 1
    return x


def round_steps(c: Coordinator, key: str, first_round: bool = False) -> int:
    """``rounds.steps``; with ``rounds.stagger``, a worker's first round while k other leases
    are live gets ``stagger_fraction(k)`` of it (at least 1 step), so that machines that start together do not
    deliver together (every round after theirs would start from one base and overlap fully); with
    ``rounds.balance`` the steps that make this worker's round last about as long as the median worker's
    (its seconds per step measured by the coordinator)."""
    r = c.cfg.rounds
    if r.stagger and first_round:
        live = sum(1 for lease in c.active.values() if c.worker_key(lease.worker, lease.user) != key)
        if live:
            return max(1, round(r.steps * stagger_fraction(live)))
    mine = c.step_seconds.get(key)
    if not r.balance or mine is None or len(c.step_seconds) < 2:
        return r.steps
    median = sorted(c.step_seconds.values())[len(c.step_seconds) // 2]
    return max(1, min(4 * r.steps, round(r.steps * median / mine)))


def measure(c: Coordinator, lease: Lease, now: float) -> None:
    """Record a delivered round's seconds per step (lease to submit) for ``round_steps`` (moving average)."""
    if lease.steps <= 0 or now <= lease.issued_at:
        return
    key, sps = c.worker_key(lease.worker, lease.user), (now - lease.issued_at) / lease.steps
    old = c.step_seconds.get(key)
    c.step_seconds[key] = sps if old is None else 0.5 * old + 0.5 * sps


def _check_identity(c: Coordinator, worker: str, user: str | None, now: float) -> None:
    co = c.cfg.coordinator
    live_window = 2 * co.heartbeat_interval_s
    mine = [
        (lid, old.deadline - co.lease_timeout_s)
        for lid, old in c.active.items()
        if (old.worker, old.user) == (worker, user)
    ]
    live = [renewed for _, renewed in mine if now - renewed < live_window]
    if len(live) >= co.leases_per_worker:
        raise refused(
            "duplicate_worker",
            f"worker name {worker!r} already holds {len(live)} live lease(s) (renewed {now - max(live):.0f} s ago; "
            f"coordinator.leases_per_worker = {co.leases_per_worker}): two machines cannot share a name",
            wait_s=co.heartbeat_interval_s,
            hint=f"give each machine its own --name; a restarted worker may lease again in "
            f"{live_window:.0f} s; wait_s={co.heartbeat_interval_s:.0f}",
        )
    for lid, renewed in mine:
        if now - renewed >= live_window:
            c.drop_lease(lid)  # a restarted worker: its old round is abandoned, the prompts go back first
    held = sum(1 for lease in c.active.values() if lease.user == user)
    if held >= co.max_leases_per_user:
        raise refused(
            "lease_cap",
            f"{user or 'this run'} already holds {held} live leases "
            f"(coordinator.max_leases_per_user = {co.max_leases_per_user})",
            wait_s=co.heartbeat_interval_s,
        )


def renew(c: Coordinator, lease: Lease) -> Lease:
    """Extend a live lease (re-signed with a later deadline); revive one issued before a restart or expired
    recently, unless another live lease holds its prompts now."""
    now = c.clock()
    c.check_lease(lease, now)
    renewed = lease_signing.sign(
        lease.model_copy(update={"deadline": now + c.cfg.coordinator.lease_timeout_s}), c.secret
    )
    sub_id = layout.submission_id(lease.worker, lease.lease_id)
    if sub_id in c.pending or sub_id in c.state.merged_ids or sub_id in c.in_flight():
        return renewed  # already submitted (or queued for its check): nothing to keep alive
    if lease.lease_id not in c.active:
        held = {i for lease in c.active.values() for i in lease.prompt_indices}
        if held.intersection(lease.prompt_indices):
            raise LeaseError(
                f"lease {lease.lease_id} expired and its prompts were leased again",
                hint="finish the round anyway (the submit says whether it counts) or lease again",
                code="expired",
            )
        c.pool.reclaim(lease.prompt_indices)
        c.pool.next_index = max(c.pool.next_index, max(lease.prompt_indices, default=-1) + 1)
    c.active[lease.lease_id] = renewed
    c.touch_worker(lease.worker, lease.user, now)
    return renewed


def budget_wait(c: Coordinator, now: float, user: str | None = None) -> float:
    """Seconds until one more round (its submission commit, when rounds are in the repo) fits in the hourly budget
    beside the next checkpoint, and in ``user``'s fair share of it when the budget is contended. Merges commit
    nothing (``checkpoint``); rounds submitted to an inbox (``hub.submissions``) cost no commit: then only checkpoints
    count, and they wait for room themselves."""
    budget = c.cfg.coordinator.commit_budget_per_hour
    c.commit_times = [t for t in c.commit_times if t > now - 3600]
    queued = len(c.in_flight())  # delivered, waiting for their check: their commits are not counted yet
    if not c.inbox.in_repo:
        return 0.0
    round_commits = len(c.active) + queued + 1  # + this round's commit
    planned = len(c.commit_times) + round_commits + 1  # + the next checkpoint
    if planned > budget:
        excess = planned - budget
        if excess > len(c.commit_times):
            return float(c.cfg.coordinator.lease_timeout_s)
        return max(1.0, c.commit_times[excess - 1] + 3600 - now)
    users = {lease.user for lease in c.active.values()} | {user}
    if planned > budget // 2 and len(users) > 1:  # contended: at most an equal share of live rounds per user
        share = max(1, (budget - len(c.commit_times)) // (2 * len(users)))
        if sum(1 for lease in c.active.values() if lease.user == user) >= share:
            return float(c.cfg.coordinator.heartbeat_interval_s)
    return 0.0
