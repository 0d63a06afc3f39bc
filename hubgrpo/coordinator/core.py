"""The coordinator: leases rounds, admits submissions, merges versions. No gradio, no network of its own, clock
injected.

Everything durable lives in the run repo, so the coordinator is a function of repo contents + clock:
- leases are HMAC-signed (``hubgrpo.coordinator.lease_signing``) and need no storage; heartbeats re-sign them with a
  later deadline (``leasing``: per-user caps, unique live worker names, a fair share of the commit budget);
- a submission is a folder the worker committed under ``submissions/``; admission (``admission``) reads and checks it
  without touching the coordinator's state, then keeps it pending; folders committed but never submitted are
  found by a periodic scan of the repo, and after a restart (every folder neither merged nor refused);
- a merge (``merging``) makes a live version: in memory and in the version cache on disk (``versions``), served
  to workers by the ``adapter`` route under its adapter id; a ``checkpoint`` commits the current version (adapter,
  ``state.json``, model card; ONE compare-and-swap commit, tagged ``vNNNNNN``) every ``checkpoint.interval_s``
  seconds, with the refusals and held-out scores since. A restarted coordinator resumes from the last checkpoint.
Commits per hour are counted (worker submissions when rounds are in the repo, checkpoints); leases are refused
with a wait while a new round would push the repo over ``coordinator.commit_budget_per_hour``.

Thread safety: the coordinator holds its own ``lock``, the one every request needs, and takes it itself. Each public
method that changes state takes it for its bookkeeping only; a method with store I/O or tensor work runs in phases
(``submit``, ``scan_pass``, ``flush``, ``finish_merge``, ``prefold``, ``maybe_merge``): reads and checks without the
lock, the change under it; a commit is staged under it, made without it, adopted under it. Call none of them with
the lock held. ``status`` reads without it.
"""

from __future__ import annotations

import logging
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from hubgrpo import layout
from hubgrpo.coordinator import admission, checkpoint, evals, lease_signing, leasing, merging, reconcile, verdicts
from hubgrpo.coordinator.inflight import InFlight
from hubgrpo.coordinator.kept import KeptRounds
from hubgrpo.coordinator.repo_state import RepoStateMixin
from hubgrpo.coordinator.scan import prepare_unseen
from hubgrpo.coordinator.versions import AdapterCache, VersionCache, VersionsMixin
from hubgrpo.errors import HubGrpoError, InvalidSubmission, LeaseError
from hubgrpo.layout import Lease, Refusal, VerdictRecord, WorkerStats
from hubgrpo.store.base import Store

if TYPE_CHECKING:
    from hubgrpo.merge.fold import FfaFold
    from hubgrpo.tracking import Tracker

log = logging.getLogger("hubgrpo.coordinator")
Pending = admission.Pending


class Coordinator(RepoStateMixin, VersionsMixin):
    """Leases, admission, staleness, merging and run state for one run repo."""

    def __init__(
        self,
        store: Store,
        secret: bytes,
        *,
        clock=time.time,
        workdir: Path | None = None,
        allow_code: list[str] | None = None,
        new_lease_id: Callable[[], str] = lease_signing.new_lease_id,
    ):
        """``allow_code``: the non-built-in reward functions of the run's config that this coordinator may run
        to recompute rewards (``--allow-reward``); any other one is refused here, at startup. ``new_lease_id``:
        the ids of its leases (the simulator numbers them, for determinism)."""
        self.store, self.secret, self.clock = store, secret, clock
        self.lock = threading.Lock()  # what every request needs: held for bookkeeping, never across I/O
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="hubgrpo-coord-"))
        self.active: dict[str, Lease] = {}
        self.pending: dict[str, Pending] = {}
        self.fold: FfaFold | None = None  # merging.prefold: FFA submissions folded in before their merge is due
        self.new_refusals: list[Refusal] = []
        self.new_evals: dict[int, tuple] = {}  # version → (held-out reward, samples, when): not in state.json yet
        self.new_verdicts: dict[str, VerdictRecord] = {}  # submission id → proof verdict: not in state.json yet
        self.commit_times: list[float] = []
        self.adapters = AdapterCache()  # the global adapters in memory by version (``adapter``)
        self._flush_lock = threading.Lock()  # one checkpoint at a time (``flush``)
        self.tracker: Tracker | None = None
        self.merging: int | None = None  # the version a merge is computing right now
        self.background_merges = False  # under a server (``use_merge_thread``): merges are its merge thread's
        self.in_flight = InFlight()  # rounds queued for their check: the server's admission queue reports them
        self.new_lease_id = new_lease_id
        self.momentum: merging.Momentum = None  # outer momentum tensors, or a reader of the repo's (re-read lazily)
        self.step_seconds: dict[str, float] = {}  # measured seconds per step of each worker (rounds.balance)
        self.versions = VersionCache(self.workdir / "versions")  # live and recent versions (the adapter route)
        self.scratch = self.versions.root / "scratch"  # downloads being read or checked: go with this process's folder
        self.kept = KeptRounds(self.scratch / "kept")  # admitted rounds' record and rollouts, for the verifier
        self.checkpointing: int | None = None  # the version a checkpoint commit is reading from the cache now
        self.ids: dict[int, str] = {}  # version → adapter id (what leases carry as base_sha), this lineage only
        repo = self.read_repo()
        self.apply_repo(repo)
        from hubgrpo.coordinator.inbox import run_inbox

        self.inbox = run_inbox(self.cfg, store)  # where rounds are submitted: the repo, or hub.submissions
        from hubgrpo.coordinator.verify import RewardCheck

        self.reward_check = RewardCheck(self.cfg, allow_code)  # recomputes every round's rewards (verify)
        if len(repo["history"]) > 1:  # not a fresh run: leases of a previous process may hold the next prompts
            self.pool.next_index += self.restart_margin
        self.last_scan_at = self.clock()
        from hubgrpo.tracking import make_tracker

        self.tracker = make_tracker(self.cfg.log, project=self.cfg.project_name, name="coordinator")
        for prepared in prepare_unseen(self, check_deadline=False):  # submissions committed before a restart
            self.accept_quietly(prepared)

    @property
    def restart_margin(self) -> int:
        """Prompts a fresh process skips: with rounds in the repo every live lease of a previous process counted
        against the commit budget, so at most that many rounds' prompts can be out there (rounds in an inbox are
        not bounded by the budget: then 10,000 rounds)."""
        bound = self.cfg.coordinator.commit_budget_per_hour if self.cfg.hub.submissions is None else 10_000
        return min(bound, 10_000) * self.prompts_per_round

    # ------------------------------------------------------------------------------------------------ leases

    @property
    def prompts_per_round(self) -> int:
        p = self.cfg.params
        per_step = max(1, p.per_device_train_batch_size * p.gradient_accumulation_steps // p.num_generations)
        return per_step * self.cfg.rounds.steps

    def lease(self, worker: str, user: str | None = None) -> Lease:
        """A signed lease on the current version (``leasing.issue``)."""
        with self.lock:
            return leasing.issue(self, worker, user)

    def with_uploads(self, lease: Lease) -> Lease:
        """``lease`` with presigned upload URLs for its round when submissions go to an S3 inbox (``inbox``); local
        signing, but credentials may need refreshing: no lock. The URLs are not part of the lease's signature."""
        urls = self.inbox.upload_urls(lease, admission.submission_limit(self, lease))  # each file capped
        return lease.model_copy(update={"uploads": urls}) if urls else lease

    def heartbeat(self, lease: Lease) -> Lease:
        """Extend a live lease; revives one issued before a restart if its prompts are free (``leasing.renew``).
        The upload URLs a worker sends back are dropped (``with_uploads`` mints fresh ones)."""
        with self.lock:
            return leasing.renew(self, lease.model_copy(update={"uploads": {}}) if lease.uploads else lease)

    def release(self, lease: Lease) -> None:
        """A worker gives its lease back (Ctrl-C): its prompts return to the pool."""
        with self.lock:
            self.check_lease(lease, self.clock(), check_deadline=False)
            self.drop_lease(lease.lease_id)

    # The helpers below (to ``touch_worker``) and ``refuse`` are for this package's modules, under ``lock``.

    def check_lease(self, lease: Lease, now: float, check_deadline: bool = True) -> Lease:
        """Signature and run always; the deadline with a grace of one round: a lease whose heartbeats were lost
        while the coordinator was down is still honoured, one that expired longer ago than ``round_timeout_s``
        is refused."""
        grace = self.cfg.coordinator.round_timeout_s
        return lease_signing.verify(
            lease, self.secret, run_id=self.state.run_id, now=now - grace, check_deadline=check_deadline
        )

    def drop_lease(self, lease_id: str) -> None:
        """Forget a live lease; its prompts go back to the pool."""
        old = self.active.pop(lease_id, None)
        if old is not None:
            self.pool.give_back(old.prompt_indices)

    @staticmethod
    def worker_key(worker: str, user: str | None) -> str:
        """The leaderboard row of a worker: ``user/worker`` (a name is only unique within a user)."""
        return f"{user}/{worker}" if user else worker

    def touch_worker(self, worker: str, user: str | None, now: float) -> WorkerStats:
        """The leaderboard row of a worker, seen ``now`` (created at its first contact)."""
        key = self.worker_key(worker, user)
        ws = self.state.workers.get(key)
        if ws is None:
            ws = self.state.workers[key] = WorkerStats(worker=worker, user=user, first_seen=now)
        ws.last_seen = now
        return ws

    # ----------------------------------------------------------------------------------------- submissions

    def submit(self, lease: Lease, commit: str, *, count_commit: bool = True) -> dict:
        """Admit the submission the worker committed at ``commit``: read and checked without the lock
        (``prepare_submission``), kept pending (or refused) under it; without a server (``background_merges``
        off) the merge a quorum makes due runs here, in phases (``maybe_merge``). An id that was queued for its
        check (``in_flight``) is decided here. ``count_commit=False`` for the 2nd..Nth submission of a batch commit
        made by the coordinator itself."""
        prepared = self.prepare_submission(lease, commit)
        with self.lock:
            answer = admission.accept(self, prepared, count_commit=count_commit)
        if self.background_merges or answer["status"] != "admitted":
            return answer
        merged = self.maybe_merge()
        with self.lock:
            return admission.admitted(self, prepared, merged=merged)

    def precheck(self, lease: Lease) -> None:
        """The cheap part of ``submit`` for the request path: the lease's signature and run (``LeaseError``)."""
        self.check_lease(lease, self.clock(), check_deadline=False)

    def hand_in(self, lease: Lease) -> None:
        """A round delivered and queued for its check: its lease stops being live, as ``submit`` would make it
        (the worker's name may lease again; expiry gives no prompts back)."""
        with self.lock:
            self.active.pop(lease.lease_id, None)

    def prepare_submission(self, lease: Lease, commit: str) -> admission.Prepared:
        """Read and check a submission (store reads; no state change, no lock)."""
        self.check_lease(lease, self.clock(), check_deadline=False)  # forged leases get no further
        return admission.prepare(self, lease, commit)

    def accept_quietly(self, prepared: admission.Prepared, *, count_commit: bool = False) -> None:
        """Keep a prepared submission nobody waits for (scans) pending, under ``lock``: refusals are recorded, not
        raised, and a due merge is left to the next tick. ``count_commit``: a round a running coordinator's scan
        finds in the repo was committed since it started, and its submit (if one comes) is a duplicate: its commit
        counts here (at startup the history already holds it)."""
        if prepared.lease is None:
            log.warning("ignored %s: %s", prepared.sub_id, prepared.error and prepared.error.message)
            return
        try:
            admission.accept(self, prepared, count_commit=count_commit)
        except (InvalidSubmission, LeaseError) as e:
            log.info("scanned submission %s refused: %s", prepared.sub_id, e.message)

    def scan_due(self) -> bool:
        return self.clock() - self.last_scan_at >= self.cfg.coordinator.scan_interval_s

    def scan(self) -> list[admission.Prepared]:
        """Committed submissions nobody submitted (store reads, no lock; ``scan_pass`` then accepts each)."""
        self.last_scan_at = self.clock()
        return prepare_unseen(self)

    def upload_precheck(self, lease: Lease) -> bool:
        """For uploads through the coordinator: verify the lease; False when this submission is already in."""
        with self.lock:
            self.check_lease(lease, self.clock())
            sub_id = layout.submission_id(lease.worker, lease.lease_id)
            return sub_id not in self.state.merged_ids and sub_id not in self.pending

    def check_upload(self, lease: Lease, folder: Path) -> None:
        """Every check of an uploaded folder before it is committed (reads adapters; call without the lock)."""
        admission.check_local(self, lease, folder, commit="")

    def record_refusal(self, lease: Lease, err: InvalidSubmission) -> None:
        """Keep a refusal decided outside ``submit`` (an upload refused before commit) for the leaderboard."""
        with self.lock:
            self.refuse(
                layout.submission_id(lease.worker, lease.lease_id), lease.worker, err, self.clock(), user=lease.user
            )

    def refuse(self, sub_id: str, worker: str, err: HubGrpoError, now: float, user: str | None = None) -> None:
        """Record a refusal (the leaderboard, the next checkpoint's state.json; under ``lock``)."""
        self.new_refusals.append(
            Refusal(
                submission_id=sub_id,
                worker=worker,
                code=str(err.code)[:64],
                message=err.message[: layout.MAX_MESSAGE],
                at=now,
                version=self.state.version,
            )
        )
        self.touch_worker(worker, user, now).refused += 1
        log.info("refused %s: %s", sub_id, err.message)

    # -------------------------------------------------------------------------------------------- adapters

    def warm_up(self) -> None:
        """Load what the first admission would load lazily (``admission.warm_up``); a served coordinator calls it
        once."""
        admission.warm_up(self)

    # -------------------------------------------------------------------------------------------- ticks, merges

    def use_merge_thread(self) -> None:
        """Under a server: ``submit`` and ``tick`` leave merges, scans and checkpoints to its threads
        (``plan_merge``/``finish_merge``, ``scan_pass``, ``flush``)."""
        self.background_merges = True

    def tick(self) -> None:
        """Expire leases (their prompts go back to the pool). Without a server (``background_merges`` off) also
        the merge at the round deadline and ``housekeeping``, in this thread."""
        with self.lock:
            now = self.clock()
            for lid, lease in list(self.active.items()):
                if now > lease.deadline:
                    log.info("lease %s of %s expired", lid, lease.worker)
                    self.drop_lease(lid)
        if not self.background_merges:
            self.maybe_merge()
            self.housekeeping()

    def housekeeping(self) -> None:
        """The repo scan (when due) and the checkpoint (when due); store I/O runs outside the lock."""
        self.scan_pass()
        self.flush(force=False)

    def scan_pass(self, *, force: bool = False) -> int:
        """The repo scan when due (or now, ``force``): store reads without the lock, then each round found accepted
        under it. A served coordinator runs this in its own thread (``Ticker``): at 1000 workers one pass listed
        ~9000 inbox objects for 10–19 s, and merges must not wait for it. Returns how many rounds were found."""
        if not force and not self.scan_due():
            return 0
        reconcile.reload_if_rewritten(self)  # `hubgrpo gc` moved the tags: never lease deleted commits
        prepared = self.scan()
        with self.lock:
            for p in prepared:
                self.accept_quietly(p, count_commit=True)
        return len(prepared)

    def close(self) -> None:
        """The end of this coordinator (after its last ``flush``): its version folder and scratch are deleted."""
        self.versions.close()

    def flush(self, *, force: bool = True) -> bool:
        """Commit a checkpoint — now (``force``: whatever is unsaved: versions, refusals, held-out scores), or when
        one is due (``checkpoint.due``); store I/O outside the lock. True when something was written. One checkpoint
        at a time: the server's checkpoint thread, its merge thread and ``hubgrpo run`` at its end may all call it."""
        with self._flush_lock:
            return checkpoint.run(self, force=force)

    def record_eval(self, version, reward, samples) -> dict:
        """A held-out score of a version, reported by an evaluator: checked as hostile input, kept until the next
        state.json commit (``evals``)."""
        parsed = evals.parse(self.cfg, version, reward, samples)
        with self.lock:
            return evals.record(self, *parsed)

    def record_verdict(self, submission_id, report) -> dict:
        """A proof-of-rollouts verdict on an admitted round, reported by a verifier: checked as hostile input, kept
        until the next state.json commit; a failed one excludes the round's participant (``verdicts``)."""
        parsed = verdicts.parse(self, submission_id, report)
        with self.lock:
            return verdicts.record(self, *parsed)

    def round_files(self, submission_id, base_version) -> dict:
        """A round awaiting its verdict, for a verifier that cannot read the run's inbox (``verdicts.round_files``)."""
        return verdicts.round_files(self, submission_id, base_version)

    @property
    def merge_wait_s(self) -> float:
        """How long the server lets a lease wait for a due or running merge (``lease_waits_for_merge_s``)."""
        return self.cfg.coordinator.lease_waits_for_merge_s

    def merge_due(self) -> bool:
        """``quorum`` submissions are in, or the round deadline passed with at least one (and none merging)."""
        if not self.pending or self.state.finished or self.merging is not None:
            return False
        ready = len(verdicts.ready_pending(self))  # coordinator.verify: all | untrusted holds rounds for verdicts
        if not ready:
            return False
        deadline = self.last_merge_at + self.cfg.coordinator.round_timeout_s
        return ready >= self.cfg.merge.quorum or self.clock() >= deadline

    def maybe_merge(self) -> bool:
        """Merge now when a merge is due, in this thread: planned under the lock, computed without it, finished
        (``finish_merge``), then the checkpoint when one is due."""
        plan = self.plan_merge()
        return plan is not None and merging.run(self, plan)

    def plan_merge(self, on_planned: Callable[[bool], None] | None = None) -> merging.MergePlan | None:
        """A ``merging.MergePlan`` when a merge is due (the coordinator is merging from now on), else None.
        ``on_planned(planned)`` runs under the lock with it: a server marks leases as waiting for the merge
        before a submit can make one due."""
        with self.lock:
            plan = merging.plan_merge(self) if self.merge_due() else None
            if on_planned is not None:
                on_planned(plan is not None)
        return plan

    def finish_merge(self, plan: merging.MergePlan, result) -> bool:
        """Stage (under the lock), render (without it) and adopt (under it) a computed merge; False when the run
        moved on meanwhile."""
        return merging.finish(self, plan, result)

    def prefold(self) -> int:
        """Between merges (FFA): fold pending submissions into the running sum, off the request path, so the
        merge left when the quorum completes is small (``merging.prefold``)."""
        return merging.prefold(self)

    def abort_merge(self, plan: merging.MergePlan) -> None:
        """Forget a plan whose compute or commit failed; its submissions stay pending."""
        with self.lock:
            self.merging = None

    def rounds_via_upload(self) -> bool:
        """Whether the run's rounds come only through the server's upload route (``hub.submissions: coordinator``)."""
        from hubgrpo.store.inboxes import COORDINATOR

        return self.cfg.hub.submissions == COORDINATOR

    # ---------------------------------------------------------------------------------------------- status

    def status(self) -> dict:
        """JSON-serialisable run status: versions, leaderboard, leases, pending, budget."""
        from hubgrpo.coordinator.status import run_status

        return run_status(self)
