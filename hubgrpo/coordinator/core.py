"""The coordinator: leases rounds, admits submissions, merges versions. No gradio, no network, clock injected.

Everything durable lives in the run repo, so the coordinator is a function of repo contents + clock:
- leases are HMAC-signed (``hubgrpo.coordinator.leases``) and need no storage; heartbeats re-sign them with a later deadline;
- a submission is a folder the worker committed under ``submissions/``; admitted ones wait in memory and are
  re-discovered from the repo after a restart (every folder not yet merged or refused);
- a merge writes the new root adapter, ``state.json`` (merged ids, weights, staleness, residual, leaderboard) and
  the model card in ONE compare-and-swap commit, then tags ``vNNNNNN``. On CommitConflict it re-reads the head:
  if only worker commits landed it retries on the new head; if another coordinator merged, it reloads.
Commits per hour are counted (worker submissions + merges); leases are refused with a wait while a new round
would push the repo over ``coordinator.commit_budget_per_hour``.
"""

from __future__ import annotations

import logging
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from hubgrpo import layout, runrepo
from hubgrpo.coordinator import leases
from hubgrpo.config import Config
from hubgrpo.errors import CommitConflict, InvalidSubmission, LeaseError, NotFound, Refused
from hubgrpo.layout import Lease, Refusal, RunState, Submission, WorkerStats
from hubgrpo.store.base import Store

log = logging.getLogger("hubgrpo.coordinator.core")
MAX_REFUSALS_KEPT = 500


@dataclass
class Pending:
    """An admitted submission waiting for the next merge."""

    sub: Submission
    adapter: object  # hubgrpo.merge.Adapter
    commit: str


class Coordinator:
    """Leases, admission, staleness, merging and run state for one run repo."""

    def __init__(self, store: Store, secret: bytes, *, clock=time.time, workdir: Path | None = None):
        self.store, self.secret, self.clock = store, secret, clock
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="hubgrpo-coord-"))
        self.active: dict[str, Lease] = {}
        self.pending: dict[str, Pending] = {}
        self.new_refusals: list[Refusal] = []
        self.commit_times: list[float] = []
        self._adapters: dict[int, object] = {}
        self.tracker = None
        self.merging: int | None = None  # the version a merge is computing right now
        self.background_merges = False  # set by the server: submit/tick leave merges to plan_merge/finish_merge
        self.new_lease_id = leases.new_lease_id  # injectable: the simulator numbers leases for determinism
        self.reload()
        from hubgrpo.tracking import make_tracker

        self.tracker = make_tracker(self.cfg.log, project=self.cfg.project_name, name="coordinator")
        self._rediscover()

    # ------------------------------------------------------------------------------------------ loading state

    def reload(self) -> None:
        """(Re)build everything from the repo: config, state, version tags, commit log."""
        self.head = self.store.head()
        if self.head is None:
            raise NotFound(f"{self.store.location} is empty", hint="create the run with `hubgrpo init`")
        self.cfg: Config = runrepo.read_config(self.store, self.head)
        self.state: RunState = runrepo.read_state(self.store, self.head)
        self.shas = runrepo.version_shas(self.store)
        self._reconcile_tags()
        self.pool = leases.PromptPool(self.state.next_prompt)
        self.last_merge_at = self.state.versions[-1].created_at if self.state.versions else self.clock()
        hour_ago = self.clock() - 3600
        self.commit_times = sorted(c.created_at for c in self.store.history(limit=200) if c.created_at > hour_ago)
        self._adapters = {v: a for v, a in self._adapters.items() if v in self.shas}
        self.pending = {k: p for k, p in self.pending.items() if k not in set(self.state.merged_ids)}

    def _reconcile_tags(self) -> None:
        """A coordinator that died between the merge commit and its tag: tag that commit now."""
        if self.state.version in self.shas:
            return
        want = f"hubgrpo: version {self.state.version} "
        for c in self.store.history(limit=200):
            if c.message.startswith(want):
                self.store.tag(layout.version_tag(self.state.version), c.sha, exist_ok=True)
                self.shas[self.state.version] = c.sha
                return
        raise NotFound(f"state.json says version {self.state.version} but no commit or tag for it was found",
                       hint="the run repo was edited by hand; restore state.json from the last tagged version")

    def _rediscover(self) -> None:
        """Admit submission folders already in the repo that are neither merged nor refused (restart path)."""
        done = set(self.state.merged_ids) | {r.submission_id for r in self.state.refused}
        seen: dict[str, int] = {}
        latest = self.store.head()
        for path in self.store.list_files(layout.SUBMISSIONS, latest):
            parsed = layout.parse_submission_path(path)
            if parsed and parsed[2] == layout.SUBMISSION_FILE and parsed[1] not in done:
                seen[parsed[1]] = parsed[0]
        for sub_id, base in sorted(seen.items()):
            try:
                raw = self.store.read(layout.submission_path(base, sub_id, layout.SUBMISSION_FILE), latest)
                lease = Submission.from_json(raw).lease
                self._admit(lease, latest, verify_deadline=False)
            except Exception as e:  # a broken folder must not stop the coordinator from starting
                log.warning("rediscovered submission %s refused: %s", sub_id, e)

    # ------------------------------------------------------------------------------------------------ leases

    @property
    def prompts_per_round(self) -> int:
        p = self.cfg.params
        per_step = max(1, p.per_device_train_batch_size * p.gradient_accumulation_steps // p.num_generations)
        return per_step * p.steps_per_round

    def lease(self, worker: str, user: str | None = None) -> Lease:
        """A signed lease on the current version; refused when the run is finished or the budget is spent."""
        layout.check_name(worker)
        now = self.clock()
        if self.state.finished:
            raise Refused("finished", f"the run finished at version {self.state.version}",
                          hint="nothing left to do; start a new run to train further")
        for lid, old in list(self.active.items()):
            if old.worker == worker:  # a worker asking again lost its lease: give the shard back first
                self._drop_lease(lid)
        if self.merging is not None and self.cfg.merge.max_staleness == 0:  # synchronous: wait for the version
            err = Refused("merging", f"version {self.merging} is being merged; with max_staleness 0 a lease on "
                          f"version {self.state.version} could not be submitted", hint="wait_s=0.5")
            err.wait_s = 0.5
            raise err
        wait = self._budget_wait(now)
        if wait > 0:
            err = Refused("budget", f"commit budget reached ({self.cfg.coordinator.commit_budget_per_hour}/hour); "
                          f"retry in {wait:.0f} s", hint=f"wait_s={wait:.0f}")
            err.wait_s = wait  # carried over the wire by the server
            raise err
        lease = Lease(
            lease_id=self.new_lease_id(), run_id=self.state.run_id, round_id=len(self.state.merged_ids)
            + len(self.pending) + len(self.active), worker=worker, user=user, base_version=self.state.version,
            base_sha=self.shas[self.state.version], prompt_indices=self.pool.take(self.prompts_per_round),
            steps=self.cfg.params.steps_per_round, seed=self.cfg.params.seed * 1_000_003 + self.pool.next_index,
            issued_at=now, deadline=now + self.cfg.coordinator.lease_timeout_s)
        lease = leases.sign(lease, self.secret)
        self.active[lease.lease_id] = lease
        self._touch(worker, user, now)
        return lease

    def heartbeat(self, lease: Lease) -> Lease:
        """Extend a live lease (re-signed with a later deadline). Re-adopts leases issued before a restart."""
        now = self.clock()
        self._verify(lease, now)
        renewed = leases.sign(lease.model_copy(update={"deadline": now + self.cfg.coordinator.lease_timeout_s}),
                              self.secret)
        self.active[lease.lease_id] = renewed
        self._touch(lease.worker, lease.user, now)
        return renewed

    def release(self, lease: Lease) -> None:
        """A worker gives its lease back (Ctrl-C): its prompts return to the pool."""
        self._verify(lease, self.clock(), check_deadline=False)
        self._drop_lease(lease.lease_id)

    def _verify(self, lease: Lease, now: float, check_deadline: bool = True) -> Lease:
        """Signature and run always; the deadline with a grace of one round: a lease whose heartbeats were lost
        while the coordinator was down (its prompts may already be re-leased) is still honoured, a lease that
        expired longer ago than ``round_timeout_s`` is refused."""
        grace = self.cfg.coordinator.round_timeout_s
        return leases.verify(lease, self.secret, run_id=self.state.run_id, now=now - grace,
                             check_deadline=check_deadline)

    def _drop_lease(self, lease_id: str) -> None:
        old = self.active.pop(lease_id, None)
        if old is not None:
            self.pool.give_back(old.prompt_indices)

    def _touch(self, worker: str, user: str | None, now: float) -> WorkerStats:
        ws = self.state.workers.get(worker)
        if ws is None:
            ws = self.state.workers[worker] = WorkerStats(worker=worker, user=user, first_seen=now)
        ws.last_seen = now
        return ws

    def _budget_wait(self, now: float) -> float:
        """Seconds until one more round (a submission commit + a share of a merge) fits in the hourly budget."""
        self.commit_times = [t for t in self.commit_times if t > now - 3600]
        rounds = len(self.active) + len(self.pending) + 1  # rounds still to be merged, this one included
        merges = -(-rounds // self.cfg.merge.quorum)  # one merge commit per quorum of them (ceil)
        planned = len(self.commit_times) + len(self.active) + 1 + merges  # + this round's commit + merges
        if planned <= self.cfg.coordinator.commit_budget_per_hour:
            return 0.0
        excess = planned - self.cfg.coordinator.commit_budget_per_hour
        if excess > len(self.commit_times):
            return float(self.cfg.coordinator.lease_timeout_s)
        return max(1.0, self.commit_times[excess - 1] + 3600 - now)

    # ----------------------------------------------------------------------------------------- submissions

    def submit(self, lease: Lease, commit: str, *, count_commit: bool = True) -> dict:
        """Admit the submission the worker committed at ``commit``; merge when the quorum is reached (unless
        ``background_merges``: then the answer says ``merge_due`` and the server's merge thread does it).

        ``count_commit=False`` for the 2nd..Nth submission of a batch commit made by the coordinator itself."""
        now = self.clock()
        self._verify(lease, now, check_deadline=False)  # a genuine lease: its commit is in the repo, count it
        sub_id = layout.submission_id(lease.worker, lease.lease_id)
        if sub_id in self.state.merged_ids or sub_id in self.pending:
            return {"status": "duplicate", "submission_id": sub_id, "version": self.state.version}
        self.active.pop(lease.lease_id, None)
        if count_commit:
            self.commit_times.append(now)
        try:
            pending = self._admit(lease, commit)  # deadline (with grace), staleness, every admission check
        except (InvalidSubmission, LeaseError) as e:
            self._refuse(sub_id, lease.worker, e, now)
            raise
        merged = False if self.background_merges else self.maybe_merge()
        status = "merged" if merged else "admitted"
        return {"status": status, "submission_id": sub_id, "version": self.state.version,
                "staleness": self.state.version - pending.sub.base_version if not merged else None,
                "merge_due": not merged and self.merge_due()}

    def _admit(self, lease: Lease, commit: str, *, verify_deadline: bool = True) -> Pending:
        """Run every admission check on a committed submission folder; keep it pending on success."""
        from hubgrpo.merge.admission import check_submission

        self._verify(lease, self.clock(), check_deadline=verify_deadline)
        sub_id = layout.submission_id(lease.worker, lease.lease_id)
        tau = self.state.version - lease.base_version
        if tau > self.cfg.merge.max_staleness:
            raise InvalidSubmission("stale", f"submission {sub_id} is {tau} versions old (base "
                                    f"{lease.base_version}, current {self.state.version}; max_staleness "
                                    f"{self.cfg.merge.max_staleness})", hint="lease again and train on the new version")
        dest = self.workdir / "submissions" / f"{sub_id}-{commit[:12]}"
        try:
            folder = runrepo.submission_at(self.store, lease.base_version, sub_id, commit, dest)
        except NotFound as e:
            raise InvalidSubmission("not_found", e.message, hint=e.hint) from None
        sub = self._read_record(folder, lease, sub_id)
        adapter = check_submission(folder, self._global(), max_bytes=int(self.cfg.merge.max_submission_mb * 2**20),
                                   known_versions=set(self.shas), base_version=lease.base_version)
        pending = Pending(sub=sub, adapter=adapter, commit=commit)
        self.pending[sub_id] = pending
        return pending

    def upload_facts(self, lease: Lease) -> dict | None:
        """For uploads through the coordinator: verify the lease; None when this submission is already in,
        else what ``admission.check_submission`` needs (so the upload is checked before anything is committed)."""
        self._verify(lease, self.clock())
        sub_id = layout.submission_id(lease.worker, lease.lease_id)
        if sub_id in self.state.merged_ids or sub_id in self.pending:
            return None
        return {"global_": self._global(), "known_versions": set(self.shas), "current_version": self.state.version,
                "max_staleness": self.cfg.merge.max_staleness}

    def record_refusal(self, lease: Lease, err: InvalidSubmission) -> None:
        """Keep a refusal decided outside ``submit`` (an upload refused before commit) for the leaderboard."""
        self._refuse(layout.submission_id(lease.worker, lease.lease_id), lease.worker, err, self.clock())

    def check_record(self, folder: Path, lease: Lease) -> Submission:
        """The submission.json in ``folder``, checked against its lease."""
        return self._read_record(folder, lease, layout.submission_id(lease.worker, lease.lease_id))

    def _read_record(self, folder: Path, lease: Lease, sub_id: str) -> Submission:
        try:
            sub = Submission.from_json((folder / layout.SUBMISSION_FILE).read_bytes())
        except FileNotFoundError:
            raise InvalidSubmission("no_record", f"submission {sub_id} has no {layout.SUBMISSION_FILE}") from None
        except ValueError as e:
            raise InvalidSubmission("bad_record", f"{layout.SUBMISSION_FILE} of {sub_id} is invalid: "
                                    f"{str(e).splitlines()[0]}", hint="upgrade hubgrpo on the worker") from None
        if (sub.lease.lease_id, sub.worker, sub.base_version) != (lease.lease_id, lease.worker, lease.base_version):
            raise InvalidSubmission("lease_mismatch", f"{layout.SUBMISSION_FILE} of {sub_id} does not match its lease")
        if sub.samples <= 0:
            raise InvalidSubmission("no_samples", f"submission {sub_id} reports no samples")
        return sub

    def _refuse(self, sub_id: str, worker: str, err: InvalidSubmission | LeaseError, now: float) -> None:
        self.new_refusals.append(Refusal(submission_id=sub_id, worker=worker, code=err.code, message=err.message,
                                         at=now, version=self.state.version))
        self._touch(worker, None, now).refused += 1
        log.info("refused %s: %s", sub_id, err.message)

    # -------------------------------------------------------------------------------------------- merging

    def _global(self):
        return self._adapter(self.state.version)

    def _adapter(self, version: int):
        """The global adapter of ``version`` (cached; read from its tag)."""
        if version not in self._adapters:
            from hubgrpo.merge import load_adapter_dir

            folder = runrepo.adapter_at(self.store, self.shas[version], self.workdir / "adapters")
            self._adapters[version] = load_adapter_dir(folder)
            for old in [v for v in self._adapters if v < self.state.version - self.cfg.merge.max_staleness]:
                del self._adapters[old]
        return self._adapters[version]

    def tick(self) -> None:
        """Housekeeping: expire leases (their prompts go back to the pool), merge at the round deadline (unless
        ``background_merges``)."""
        now = self.clock()
        for lid, lease in list(self.active.items()):
            if now > lease.deadline:
                log.info("lease %s of %s expired", lid, lease.worker)
                self._drop_lease(lid)
        if not self.background_merges:
            self.maybe_merge()

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
        """A ``merge_step.MergePlan`` when a merge is due, else None. Call under the lock, then run
        ``plan.compute()`` without it and ``finish_merge`` under it again."""
        if not self.merge_due():
            return None
        from hubgrpo.coordinator.merging import plan_merge

        return plan_merge(self)

    def finish_merge(self, plan, result) -> bool:
        """Commit and adopt the merge computed from ``plan``; False if the run moved on meanwhile."""
        from hubgrpo.coordinator.merging import finish_merge

        return finish_merge(self, plan, result)

    def abort_merge(self, plan) -> None:
        """Forget a plan whose compute failed; its submissions stay pending."""
        self.merging = None

    # ---------------------------------------------------------------------------------------------- status

    def status(self) -> dict:
        """JSON-serialisable run status: versions, leaderboard, leases, pending, budget."""
        from hubgrpo.coordinator.status import run_status

        return run_status(self)
