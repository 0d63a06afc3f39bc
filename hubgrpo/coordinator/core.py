"""The coordinator: leases rounds, admits submissions, merges versions. No gradio, no network of its own, clock
injected.

Everything durable lives in the run repo, so the coordinator is a function of repo contents + clock:
- leases are HMAC-signed (``hubgrpo.coordinator.leases``) and need no storage; heartbeats re-sign them with a
  later deadline (``leasing``: per-user caps, unique live worker names, a fair share of the commit budget);
- a submission is a folder the worker committed under ``submissions/``; admission (``admit``) reads and checks it
  without touching the coordinator's state, then keeps it pending; folders committed but never submitted are
  found by a periodic scan of the repo, and after a restart (every folder neither merged nor refused);
- a merge (``merging``) makes a live version: in memory and in the version cache on disk (``versions``), served
  to workers by the ``adapter`` route under its adapter id; a ``checkpoint`` commits the current version (adapter,
  ``state.json``, model card; ONE compare-and-swap commit, tagged ``vNNNNNN``) every ``checkpoint.interval_s``
  seconds, with the refusals and held-out scores since. A restarted coordinator resumes from the last checkpoint.
Commits per hour are counted (worker submissions when rounds are in the repo, checkpoints); leases are refused
with a wait while a new round would push the repo over ``coordinator.commit_budget_per_hour``.

Thread safety belongs to the server (``hubgrpo.space.api``): it calls the store-reading phases (``prepare_submission``,
``scan``, ``read_repo``, the merge commit) without its lock and everything else under it.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
import threading
import time
from pathlib import Path

from hubgrpo import layout, runrepo
from hubgrpo.config import Config
from hubgrpo.coordinator import admit, checkpoint, leases, leasing, norms, reconcile
from hubgrpo.coordinator.versions import AdapterCache, VersionCache, VersionsMixin
from hubgrpo.errors import HubGrpoError, InvalidSubmission, LeaseError, NotFound
from hubgrpo.layout import Lease, Refusal, RunState, WorkerStats
from hubgrpo.store.base import Store

log = logging.getLogger("hubgrpo.coordinator")
Pending = admit.Pending


class Coordinator(VersionsMixin):
    """Leases, admission, staleness, merging and run state for one run repo."""

    def __init__(self, store: Store, secret: bytes, *, clock=time.time, workdir: Path | None = None,
                 allow_code: list[str] | None = None):
        """``allow_code``: the non-built-in reward functions of the run's config that this coordinator may run
        to recompute rewards (``--allow-reward``); any other one is refused here, at startup."""
        self.store, self.secret, self.clock = store, secret, clock
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="hubgrpo-coord-"))
        self.active: dict[str, Lease] = {}
        self.pending: dict[str, Pending] = {}
        self.fold = None  # merging.prefold: FFA submissions folded in before their merge is due
        self.new_refusals: list[Refusal] = []
        self.new_evals: dict[int, tuple] = {}  # version → (held-out reward, samples, when): not in state.json yet
        self.commit_times: list[float] = []
        self.adapters = AdapterCache()  # the global adapters in memory by version (``adapter``)
        self._flush_lock = threading.Lock()  # one checkpoint at a time (``flush``)
        self.tracker = None
        self.merging: int | None = None  # the version a merge is computing right now
        self.background_merges = False  # set by the server: submit/tick leave merges to its merge thread
        self.in_flight = set  # set by the server: ids of submitted rounds its admission queue holds (scans skip them)
        self.new_lease_id = leases.new_lease_id  # injectable: the simulator numbers leases for determinism
        self.momentum = None
        self.step_seconds: dict[str, float] = {}  # measured seconds per step of each worker (balance_rounds)
        self.versions = VersionCache(self.workdir / "versions")  # live and recent versions (the adapter route)
        self.checkpointing: int | None = None  # the version a checkpoint commit is reading from the cache now
        self.ids: dict[int, str] = {}  # version → adapter id (what leases carry as base_sha), this lineage only
        repo = self.read_repo()
        self.apply_repo(repo)
        from hubgrpo.coordinator.inbox import open_inbox

        self.inbox = open_inbox(self.cfg, store)  # where rounds are submitted: the repo, or hub.submissions
        from hubgrpo.coordinator.verify import RewardCheck

        self.reward_check = RewardCheck(self.cfg, allow_code)  # recomputes every round's rewards (verify)
        if len(repo["history"]) > 1:  # not a fresh run: leases of a previous process may hold the next prompts
            self.pool.next_index += self.restart_margin
        self.last_scan_at = self.clock()
        from hubgrpo.tracking import make_tracker

        self.tracker = make_tracker(self.cfg.log, project=self.cfg.project_name, name="coordinator")
        for prepared in admit.scan(self, check_deadline=False):  # submissions committed before a restart
            self.accept_quietly(prepared)

    # ------------------------------------------------------------------------------------------ loading state

    def read_repo(self) -> dict:
        """Everything the coordinator loads from the repo (store reads only; no state changes)."""
        head = self.store.head()
        if head is None:
            raise NotFound(f"{self.store.location} is empty", hint="create the run with `hubgrpo init`")
        state = runrepo.read_state(self.store, head)
        shas = reconcile.version_shas(self.store, state.version)  # tags a crashed gc or merge left missing
        history = self.store.history(limit=200)
        adapter = runrepo.adapter_at(self.store, shas[state.version], self.workdir / "checkpoint")
        return {"head": head, "cfg": runrepo.read_config(self.store, head), "state": state, "shas": shas,
                "history": [c.created_at for c in history], "adapter": adapter,
                "head_at": next((c.created_at for c in history if c.sha == head), None)}

    def apply_repo(self, repo: dict) -> None:
        """Adopt what ``read_repo`` read: config, state, tags, commit log; outer momentum is re-read at the next
        merge; the prompt pool never goes back below a live lease's prompts."""
        self.head, self.cfg, self.state, self.shas = repo["head"], repo["cfg"], repo["state"], repo["shas"]
        old_ids = dict(self.ids)
        self._adopt_lineage(repo)
        old = getattr(self, "pool", None)
        self.pool = leases.PromptPool(self.state.next_prompt) if old is None else old
        live = [i for l in self.active.values() for i in l.prompt_indices]
        self.pool.next_index = max(self.pool.next_index, self.state.next_prompt, max(live, default=-1) + 1)
        self.momentum = None
        self.last_merge_at = self.state.versions[-1].created_at if self.state.versions else self.clock()
        now = self.clock()  # a commit stamped after now (the Hub's clock ahead, a virtual clock) counts as now
        self.commit_times = sorted(min(t, now) for t in repo["history"] if t > now - 3600)
        # only adapters of this lineage: a number merged again by another is another adapter
        self.adapters.retain(lambda v: v in self.ids and old_ids.get(v) == self.ids[v])
        if self.fold is not None and old_ids.get(self.fold.version) != self.ids.get(self.fold.version):
            self.fold = None
        self.pending = {k: p for k, p in self.pending.items() if k not in set(self.state.merged_ids)}
        self.norm_history = norms.rebuild(self.state.versions, self.cfg.merge.max_norm_factor)

    def reload(self) -> None:
        self.apply_repo(self.read_repo())

    @property
    def restart_margin(self) -> int:
        """Prompts a fresh process skips: with rounds in the repo every live lease of a previous process counted
        against the commit budget, so at most that many rounds' prompts can be out there (rounds in a box are
        not bounded by the budget: then 10,000 rounds)."""
        bound = self.cfg.coordinator.commit_budget_per_hour if self.cfg.hub.submissions is None else 10_000
        return min(bound, 10_000) * self.prompts_per_round

    # ------------------------------------------------------------------------------------------------ leases

    @property
    def prompts_per_round(self) -> int:
        p = self.cfg.params
        per_step = max(1, p.per_device_train_batch_size * p.gradient_accumulation_steps // p.num_generations)
        return per_step * p.steps_per_round

    def lease(self, worker: str, user: str | None = None) -> Lease:
        """A signed lease on the current version (``leasing.issue``)."""
        return leasing.issue(self, worker, user)

    def with_uploads(self, lease: Lease) -> Lease:
        """``lease`` with presigned upload URLs for its round when submissions go to an S3 box (``inbox``); local
        signing, but credentials may need refreshing: call it WITHOUT the server's lock. The URLs are not part of
        the lease's signature."""
        urls = self.inbox.upload_urls(lease, admit.submission_limit(self, lease))  # each file capped
        return lease.model_copy(update={"uploads": urls}) if urls else lease

    def heartbeat(self, lease: Lease) -> Lease:
        """Extend a live lease; revives one issued before a restart if its prompts are free (``leasing.renew``).
        The upload URLs a worker sends back are dropped (``with_uploads`` mints fresh ones)."""
        return leasing.renew(self, lease.model_copy(update={"uploads": {}}) if lease.uploads else lease)

    def release(self, lease: Lease) -> None:
        """A worker gives its lease back (Ctrl-C): its prompts return to the pool."""
        self.check_lease(lease, self.clock(), check_deadline=False)
        self.drop_lease(lease.lease_id)

    def check_lease(self, lease: Lease, now: float, check_deadline: bool = True) -> Lease:
        """Signature and run always; the deadline with a grace of one round: a lease whose heartbeats were lost
        while the coordinator was down is still honoured, one that expired longer ago than ``round_timeout_s``
        is refused."""
        grace = self.cfg.coordinator.round_timeout_s
        return leases.verify(lease, self.secret, run_id=self.state.run_id, now=now - grace,
                             check_deadline=check_deadline)

    def drop_lease(self, lease_id: str) -> None:
        old = self.active.pop(lease_id, None)
        if old is not None:
            self.pool.give_back(old.prompt_indices)

    @staticmethod
    def worker_key(worker: str, user: str | None) -> str:
        """The leaderboard row of a worker: ``user/worker`` (a name is only unique within a user)."""
        return f"{user}/{worker}" if user else worker

    def touch_worker(self, worker: str, user: str | None, now: float) -> WorkerStats:
        key = self.worker_key(worker, user)
        ws = self.state.workers.get(key)
        if ws is None:
            ws = self.state.workers[key] = WorkerStats(worker=worker, user=user, first_seen=now)
        ws.last_seen = now
        return ws

    # ----------------------------------------------------------------------------------------- submissions

    def submit(self, lease: Lease, commit: str, *, count_commit: bool = True, lock=None) -> dict:
        """Admit the submission the worker committed at ``commit``: ``prepare_submission`` (store reads) without
        ``lock``, ``accept_submission`` under it; merge when the quorum is reached, unless ``background_merges``.

        ``count_commit=False`` for the 2nd..Nth submission of a batch commit made by the coordinator itself."""
        prepared = self.prepare_submission(lease, commit)
        with lock or contextlib.nullcontext():
            return self.accept_submission(prepared, count_commit=count_commit)

    def precheck(self, lease: Lease) -> None:
        """The cheap part of ``submit`` for the request path: the lease's signature and run (``LeaseError``)."""
        self.check_lease(lease, self.clock(), check_deadline=False)

    def hand_in(self, lease: Lease) -> None:
        """A round delivered and queued for its check (under the server's lock): its lease stops being live, as
        ``accept_submission`` would make it (the worker's name may lease again; expiry gives no prompts back)."""
        self.active.pop(lease.lease_id, None)

    def prepare_submission(self, lease: Lease, commit: str) -> admit.Prepared:
        """Read and check a submission (store reads; no state change): call it WITHOUT the server's lock."""
        self.check_lease(lease, self.clock(), check_deadline=False)  # forged leases get no further
        return admit.prepare(self, lease, commit)

    def accept_submission(self, prepared: admit.Prepared, *, count_commit: bool = True) -> dict:
        """Keep a prepared submission pending, or record its refusal and raise it (under the lock)."""
        return admit.accept(self, prepared, count_commit=count_commit)

    def accept_quietly(self, prepared: admit.Prepared, *, count_commit: bool = False) -> None:
        """``accept_submission`` for submissions nobody waits for (scans): refusals are recorded, not raised, and
        a due merge is left to the next tick. ``count_commit``: a round a running coordinator's scan finds in the
        repo was committed since it started, and its submit (if one comes) is a duplicate: its commit counts here
        (at startup the history already holds it)."""
        if prepared.lease is None:
            log.warning("ignored %s: %s", prepared.sub_id, prepared.error and prepared.error.message)
            return
        try:
            admit.accept(self, prepared, count_commit=count_commit, merge=False)
        except (InvalidSubmission, LeaseError) as e:
            log.info("scanned submission %s refused: %s", prepared.sub_id, e.message)

    def scan_due(self) -> bool:
        return self.clock() - self.last_scan_at >= self.cfg.coordinator.scan_interval_s

    def scan(self) -> list[admit.Prepared]:
        """Committed submissions nobody submitted (store reads; call without the lock, then accept each)."""
        self.last_scan_at = self.clock()
        return admit.scan(self)

    def upload_precheck(self, lease: Lease) -> bool:
        """For uploads through the coordinator: verify the lease; False when this submission is already in."""
        self.check_lease(lease, self.clock())
        sub_id = layout.submission_id(lease.worker, lease.lease_id)
        return sub_id not in self.state.merged_ids and sub_id not in self.pending

    def check_upload(self, lease: Lease, folder: Path) -> None:
        """Every check of an uploaded folder before it is committed (reads adapters; call without the lock)."""
        admit.check_local(self, lease, folder, commit="")

    def record_refusal(self, lease: Lease, err: InvalidSubmission) -> None:
        """Keep a refusal decided outside ``submit`` (an upload refused before commit) for the leaderboard."""
        self.refuse(layout.submission_id(lease.worker, lease.lease_id), lease.worker, err, self.clock(),
                     user=lease.user)

    def refuse(self, sub_id: str, worker: str, err: HubGrpoError, now: float, user: str | None = None) -> None:
        self.new_refusals.append(Refusal(submission_id=sub_id, worker=worker, code=str(err.code)[:64],
                                         message=err.message[:layout.MAX_MESSAGE], at=now, version=self.state.version))
        self.touch_worker(worker, user, now).refused += 1
        log.info("refused %s: %s", sub_id, err.message)

    # -------------------------------------------------------------------------------------------- adapters

    def warm_up(self) -> None:
        """Load what the first admission would load lazily (``admit.warm_up``); a served coordinator calls it once."""
        admit.warm_up(self)

    # -------------------------------------------------------------------------------------------- ticks, merges

    def tick(self) -> None:
        """Expire leases (their prompts go back to the pool). Without a server (``background_merges`` off) also
        the merge at the round deadline and ``housekeeping``, in this thread."""
        now = self.clock()
        for lid, lease in list(self.active.items()):
            if now > lease.deadline:
                log.info("lease %s of %s expired", lid, lease.worker)
                self.drop_lease(lid)
        if not self.background_merges:
            self.maybe_merge()
            self.housekeeping()

    def housekeeping(self, lock=None) -> None:
        """The repo scan (when due) and the checkpoint (when due); store I/O runs outside ``lock``."""
        self.scan_pass(lock)
        self.flush(lock, force=False)

    def scan_pass(self, lock=None, *, force: bool = False) -> int:
        """The repo scan when due (or now, ``force``): store reads without ``lock``, then each round found accepted
        under it. A served coordinator runs this in its own thread (``Ticker``): at 1000 workers one pass listed
        ~9000 box objects for 10–19 s, and merges must not wait for it. Returns how many rounds were found."""
        if not force and not self.scan_due():
            return 0
        reconcile.reload_if_rewritten(self, lock)  # `hubgrpo gc` moved the tags: never lease deleted commits
        prepared = self.scan()
        with lock or contextlib.nullcontext():
            for p in prepared:
                self.accept_quietly(p, count_commit=True)
        return len(prepared)

    def flush(self, lock=None, *, force: bool = True) -> bool:
        """Commit a checkpoint — now (``force``: whatever is unsaved: versions, refusals, held-out scores), or when
        one is due (``checkpoint.due``); store I/O outside ``lock``. True when something was written. One checkpoint
        at a time: the server's checkpoint thread, its merge thread and ``hubgrpo run`` at its end may all call it."""
        with self._flush_lock:
            return checkpoint.run(self, lock, force=force)

    def record_eval(self, version, reward, samples) -> dict:
        """A held-out score of a version, reported by an evaluator: checked as hostile input, kept until the next
        state.json commit (``evals``). Call under the server's lock."""
        from hubgrpo.coordinator import evals

        return evals.record(self, *evals.parse(self.cfg, version, reward, samples))

    def adopt(self, staged) -> bool:
        from hubgrpo.coordinator.merging import adopt

        return adopt(self, staged)

    @property
    def merge_wait_s(self) -> float:
        """How long the server lets a lease wait for a due or running merge (``lease_waits_for_merge_s``)."""
        return self.cfg.coordinator.lease_waits_for_merge_s

    def merge_due(self) -> bool:
        """``quorum`` submissions are in, or the round deadline passed with at least one (and none merging)."""
        if not self.pending or self.state.finished or self.merging is not None:
            return False
        deadline = self.last_merge_at + self.cfg.coordinator.round_timeout_s
        return len(self.pending) >= self.cfg.merge.quorum or self.clock() >= deadline

    def maybe_merge(self) -> bool:
        """Merge now (plan, compute, commit) when a merge is due."""
        if not self.merge_due():
            return False
        from hubgrpo.coordinator.merging import merge_version

        return merge_version(self)

    def plan_merge(self):
        """A ``merging.MergePlan`` when a merge is due, else None (under the lock)."""
        if not self.merge_due():
            return None
        from hubgrpo.coordinator.merging import plan_merge

        return plan_merge(self)

    def finish_merge(self, plan, result, *, lock=None) -> bool:
        """Stage (under ``lock``), commit (without it: store writes) and adopt (under it) a computed merge; False
        when the run moved on meanwhile or another coordinator merged first (then the state is reloaded)."""
        from hubgrpo.coordinator.merging import finish

        return finish(self, plan, result, lock or contextlib.nullcontext())

    def prefold(self, lock=None) -> int:
        """Between merges (FFA): fold pending submissions into the running sum, off the request path, so the
        merge left when the quorum completes is small (``merging.prefold``)."""
        from hubgrpo.coordinator.merging import prefold

        return prefold(self, lock or contextlib.nullcontext())

    def abort_merge(self, plan) -> None:
        """Forget a plan whose compute or commit failed; its submissions stay pending."""
        self.merging = None

    # ---------------------------------------------------------------------------------------------- status

    def status(self) -> dict:
        """JSON-serialisable run status: versions, leaderboard, leases, pending, budget."""
        from hubgrpo.coordinator.status import run_status

        return run_status(self)
