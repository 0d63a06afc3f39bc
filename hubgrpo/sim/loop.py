"""A discrete-event simulation of an asynchronous run: N machines on one, on a virtual clock.

Real parts: every round is a real GRPO round (``RoundEngine.run_round``: one model in memory, rounds one at a
time), the coordinator is the real ``Coordinator`` (leases, prompt pool, admission, staleness, merges) with its
clock injected, the bucket is a real ``LocalStore`` (``hubgrpo.sim.store``: its commits stamped on the virtual
clock, held to the Hub's hourly commit quota when one is given), and every version is scored on held-out prompts.
Rounds train from the versions the coordinator serves (``Coordinator.version_dir``, pinned by
``hubgrpo.sim.versions``), not from the run repo, and are handed in as a commit of the repo or, with
``hub.submissions`` set (whatever it names), into an inbox in the simulation's folder.
Simulated parts: the clock and the fleet (``hubgrpo.sim.fleet``: speeds, latencies, dropouts).

Events are processed in virtual-time order, so every merge before time t is visible to a lease at t and
staleness arises exactly as it would with N machines. A worker that becomes free at t leases at t; its round is
trained (in real time) when its delivery comes up, from the version it leased, and its submission is committed
and submitted at t + latencies + steps × step_s / speed. With ``merge.rebase`` the round moves, after each step,
onto the newest version published a latency before that step ended (``hubgrpo.worker.rebase``; with
``merge.rebase_after_generation`` also after each step's generation, ``generate_share`` into the step). Nothing
depends on this machine's wall time: a seed gives the same simulation (merges run synchronously at submit, as the
coordinator does without a server; merge and evaluation take no virtual time — they run on the coordinator's and
the evaluator's own machines).

Differences from a deployment, on purpose: without a quota (``commit_quota`` None) the commit budget is lifted
(``keep_budget`` keeps the config's); under one, a commit the quota refuses (429) is retried after the Hub's wait
and the coordinator's budget is the quota's figure unless the config sets one; lease ids are numbered
(deterministic). With ``rounds.reset_optimizer``
off, each simulated machine keeps its own AdamW moments across its rounds, as a real worker does (one engine
trains for all of them and swaps their optimizers); a machine that rejoins after a dropout starts fresh.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hubgrpo import layout
from hubgrpo.config import Config
from hubgrpo.errors import InvalidSubmission, LeaseError, RateLimited, Refused
from hubgrpo.sim.fleet import (
    CostModel,
    SimWorker,
    default_fixed_share,
    default_generate_share,
    default_step_s,
    make_fleet,
    parse_starts,
)
from hubgrpo.sim.options import SimOptions, sim_config
from hubgrpo.sim.records import Event, RoundRecord

STALL_ROUNDS = 200  # rounds without a new version after which a simulation gives up (reported as stalled)


class Simulation:
    """Runs until ``until_version`` / ``until_reward`` / ``max_virtual_s`` / ``max_rounds`` (at least one)."""

    def __init__(
        self,
        cfg: Config,
        opts: SimOptions,
        output: Path,
        *,
        engine=None,
        on_version: Callable[[dict], None] | None = None,
    ):
        if not (opts.until_version or opts.until_reward is not None or opts.max_virtual_s or opts.max_rounds):
            raise ValueError("give a stop condition: until_version, until_reward, max_virtual_s or max_rounds")
        self.opts, self.output, self.on_version = opts, Path(output), on_version
        self.cfg = sim_config(cfg, opts, self.output)
        step_s = opts.step_s or default_step_s(cfg.base_model)
        if step_s is None:
            raise ValueError(f"no built-in step cost for {cfg.base_model}: pass step_s (seconds per GRPO step)")
        self.cost = CostModel(step_s=step_s, latency_s=opts.latency_s, fixed_share=default_fixed_share(cfg.base_model))
        self.generate_share = (
            opts.generate_share if opts.generate_share is not None else default_generate_share(cfg.base_model)
        )
        self.fleet: list[SimWorker] = make_fleet(opts.workers, opts.speeds, opts.seed)
        self.starts = parse_starts(opts.starts, opts.workers, opts.seed)
        self.rejoin_s = opts.rejoin_s if opts.rejoin_s is not None else self.cost.train_s(self.cfg.rounds.steps, 1.0)
        self.now, self._seq = 0.0, itertools.count()
        self._events: list[Event] = []
        self.rounds: list[RoundRecord] = []
        self._rounds_at_last_version, self.stalled = 0, False
        self.prompts: dict[str, list[int]] = {}  # lease id → its prompt indices (not in the result: bulky)
        self.versions: list[dict] = []
        self.in_flight: dict[str, int] = {}  # lease id → base version of each round leased and not handed in
        self.compute = {"train_s": 0.0, "eval_s": 0.0, "merge_s": 0.0, "setup_s": 0.0}
        self.quota_waits = {"submission": 0, "coordinator": 0}  # commits the quota refused (429), by whom
        self.engine = engine
        self._setup()

    # ------------------------------------------------------------------------------------------ set-up

    def _setup(self) -> None:
        from hubgrpo.coordinator.core import Coordinator
        from hubgrpo.coordinator.repo_init import init_repo
        from hubgrpo.sim.store import SimStore
        from hubgrpo.sim.versions import PinnedVersions

        t0 = time.perf_counter()
        if self.engine is None:
            from hubgrpo.worker.engine import RoundEngine

            self.engine = RoundEngine(self.cfg, worker="sim")
        self.store = SimStore(self.output / "repo", clock=lambda: self.now, quota_per_hour=self.opts.commit_quota)
        init_repo(self.store, self.cfg, self.engine.init_adapter(self.output / "v0"), clock=lambda: 0.0)
        from hubgrpo.task.rewards import foreign_code

        ids = itertools.count()
        self.coord = Coordinator(
            self.store,
            f"hubgrpo-sim-{self.opts.seed}".encode(),
            clock=lambda: self.now,
            workdir=self.output / "coordinator",
            allow_code=foreign_code(self.cfg.rewards),
            new_lease_id=lambda: f"l{next(ids):06d}",
        )
        self.pins = PinnedVersions(self.coord, self.output / "adapters")
        self.compute["setup_s"] = time.perf_counter() - t0
        self._record_version(0)

    def _push(self, t: float, kind: str, worker: int = -1, data: Any = None) -> None:
        heapq.heappush(self._events, Event(t, next(self._seq), kind, worker, data))

    # ------------------------------------------------------------------------------------------ the loop

    def run(self) -> None:
        for i, t in enumerate(self.starts):
            self._push(t, "ready", i)
        self._push(self.cfg.coordinator.round_timeout_s + 1e-3, "tick")
        handlers = {
            "ready": self._ready,
            "deliver": self._deliver,
            "heartbeat": self._heartbeat,
            "tick": self._tick,
            "rejoin": self._ready,
        }
        while self._events and not self._done():
            ev = heapq.heappop(self._events)
            self.now = max(self.now, ev.t)
            handlers[ev.kind](ev)
            self._note_versions()
            if len(self.rounds) - self._rounds_at_last_version > STALL_ROUNDS:
                self.stalled = True  # e.g. every round refused: report it instead of looping for ever
                break

    def _done(self) -> bool:
        o, v = self.opts, self.coord.state.version
        last_eval = next((r["eval_reward"] for r in reversed(self.versions) if r["eval_reward"] is not None), None)
        return bool(
            (o.until_version and v >= o.until_version)
            or (
                o.until_reward is not None
                and last_eval is not None
                and last_eval >= o.until_reward
                and self.now >= o.min_virtual_s
            )
            or (o.max_virtual_s and self.now >= o.max_virtual_s)
            or (o.max_rounds and len(self.rounds) >= o.max_rounds)
            or self.coord.state.finished
        )

    def _ready(self, ev: Event) -> None:
        """A free worker asks for a lease; trains the round (real compute) unless it drops out of it."""
        w = self.fleet[ev.worker]
        self._coordinator(self.coord.tick)
        try:
            lease = self.coord.lease(w.process_name)
        except Refused as e:
            if e.code != "finished":
                self._push(self.now + max(1.0, float(e.wait_s or 30.0)), "ready", ev.worker)
            return
        rec = RoundRecord(
            worker=w.process_name, lease_id=lease.lease_id, base_version=lease.base_version, t_lease=self.now
        )
        self.rounds.append(rec)
        self.prompts[lease.lease_id] = list(lease.prompt_indices)
        lat = self.cost.latency_s
        start = self.now + 2 * lat  # the lease's answer, then the adapter download
        full = self.cfg.params.per_device_train_batch_size
        batch = lease.params.get("per_device_train_batch_size", full)
        assert isinstance(batch, int | float), "the coordinator's own lease sets a number"
        ratio = batch / full  # rounds.fleet_batch split
        train_s = self.cost.train_s(lease.steps, w.speed, ratio) * w.jitter(self.opts.jitter)
        w.rounds += 1
        crash = w.drops_this_round(self.opts.dropout)
        holder = {"lease": lease}
        self._schedule_heartbeats(ev.worker, holder, start, start + train_s * (crash if crash is not None else 1))
        if crash is not None:  # the machine is gone: no submission; its lease expires, its prompts return
            w.dropped += 1
            rec.status = "dropped"
            gone = start + train_s * crash
            self._push(gone + self.rejoin_s, "rejoin", ev.worker)
            self._push(gone + self.cfg.coordinator.lease_timeout_s + 1e-3, "tick")  # past its last renewal
            return
        # trained when it is delivered (every version before then is known: a rebase sees the ones it would)
        self.in_flight[lease.lease_id] = lease.base_version
        self._push(start + train_s + 2 * lat, "deliver", ev.worker, (holder, rec, start, train_s, None))  # upload

    def _train(self, lease, rec: RoundRecord, start: float, train_s: float):
        """The round's real training, from its leased version (and, with merge.rebase, onto the versions its
        machine would have seen published by the end of each step)."""
        t0 = time.perf_counter()
        base = self.pins.get(lease.base_version)  # downloaded from the coordinator when leased
        folder = self.output / "rounds" / layout.submission_id(lease.worker, lease.lease_id)

        share = self.generate_share

        def newest(step: int, current: int, generated: bool = False):
            done = step + (share if generated else 0.0)  # steps of the round done (a generation: share of a step)
            t = start + train_s * done / max(1, lease.steps) - self.cost.latency_s  # its download takes a latency
            v = max((r["version"] for r in self.versions if r["virtual_time_s"] <= t), default=current)
            return (v, self.pins.get(v)) if v > current else None

        sub = self.engine.run_round(base, lease, folder, optimizer_key=rec.worker, rebase=newest)
        self.compute["train_s"] += time.perf_counter() - t0
        rec.train_reward, rec.rebased_version = sub.reward_mean, sub.rebased_version
        return folder, sub

    def _schedule_heartbeats(self, worker: int, holder: dict, start: float, end: float) -> None:
        every = self.cfg.coordinator.heartbeat_interval_s
        t = start + every
        while t < end:
            self._push(t, "heartbeat", worker, holder)
            t += every

    def _heartbeat(self, ev: Event) -> None:
        holder = ev.data
        try:
            holder["lease"] = self.coord.heartbeat(holder["lease"])
        except LeaseError:
            pass  # expired: the submit will be refused and say why

    def _deliver(self, ev: Event) -> None:
        """Hand the round in (at its virtual arrival time) and submit it; maybe merge. A commit the Hub's quota
        refuses (429) is tried again after the wait, as a worker does, its lease kept alive meanwhile."""
        holder, rec, start, train_s, trained = ev.data
        lease = holder["lease"]
        folder, sub = trained or self._train(lease, rec, start, train_s)
        try:
            token = self._hand_in(lease, folder)
        except RateLimited as e:
            self.quota_waits["submission"] += 1
            self._schedule_heartbeats(ev.worker, holder, self.now, self.now + e.wait_s)
            self._push(self.now + e.wait_s, "deliver", ev.worker, (holder, rec, start, train_s, (folder, sub)))
            return
        self.in_flight.pop(lease.lease_id, None)
        rec.t_deliver, rec.staleness_at_delivery = self.now, self.coord.state.version - sub.trained_base
        self._coordinator(self.coord.tick)
        t0 = time.perf_counter()
        try:
            answer = self._coordinator(self.coord.submit, lease, token)
            rec.status = answer["status"] if answer else "admitted"  # None: its merge waits for the quota
        except (InvalidSubmission, LeaseError) as e:
            rec.status, rec.code = "refused", e.code
        self.compute["merge_s"] += time.perf_counter() - t0
        self._push(self.now + self.cost.latency_s, "ready", ev.worker)

    def _hand_in(self, lease, folder: Path) -> str:
        """A commit of the round to the run repo, or its files in the inbox (``hub.submissions``): what to submit."""
        if self.cfg.hub.submissions:
            from hubgrpo.worker.delivery import deliver

            return deliver(self.cfg.hub.submissions, lease, folder)
        adds = {
            layout.submission_path(lease.base_version, layout.submission_id(lease.worker, lease.lease_id), f): folder
            / f
            for f in layout.SUBMISSION_FILES
        }
        return self.store.commit(adds, message=f"hubgrpo: submission {lease.worker}-{lease.lease_id}")

    def _coordinator(self, call: Callable, *args):
        """``call(*args)`` on the coordinator; when one of its commits (a merge, a checkpoint) meets the Hub's
        quota, None, and a tick after the wait (its submissions stay pending)."""
        try:
            return call(*args)
        except RateLimited as e:
            self.quota_waits["coordinator"] += 1
            self._push(self.now + e.wait_s, "tick")
            return None

    def _tick(self, ev: Event) -> None:
        t0 = time.perf_counter()
        self._coordinator(self.coord.tick)  # lease expiry; a merge at the round deadline
        self.compute["merge_s"] += time.perf_counter() - t0

    # ------------------------------------------------------------------------------------------ versions

    def _note_versions(self) -> None:
        if len(self.versions) <= self.coord.state.version:  # new versions: the next round deadline moves
            self._rounds_at_last_version = len(self.rounds)
            self._push(self.coord.last_merge_at + self.cfg.coordinator.round_timeout_s + 1e-3, "tick")
        while len(self.versions) <= self.coord.state.version:
            self._record_version(len(self.versions))

    def _record_version(self, version: int) -> None:
        v = next(r for r in self.coord.state.versions if r.version == version)
        for rec in self.rounds:  # rounds merged into this version
            if any(m.submission_id.endswith("-" + rec.lease_id) for m in v.merged):
                rec.status = "merged"
        samples = (self.versions[-1]["samples"] if self.versions else 0) + v.samples
        folder = self.pins.pin(version)  # rounds in flight may rebase onto it
        self.pins.release(min([version, *self.in_flight.values()]))
        ev = None
        if version % max(1, self.opts.eval_every) == 0:  # --until-reward stops at the first scored version past it
            t0 = time.perf_counter()
            ev = self._evaluate(folder)
            self.compute["eval_s"] += time.perf_counter() - t0
        row = {
            "version": version,
            "virtual_time_s": round(self.now, 6),
            "samples": samples,
            "train_reward": v.reward_mean,
            "eval_reward": ev,
            "merged": len(v.merged),
            "max_staleness": max((m.staleness for m in v.merged), default=0),
            "staleness": [m.staleness for m in v.merged],
            "residual": v.residual,
        }
        self.versions.append(row)
        if self.on_version:
            self.on_version(row)

    def _evaluate(self, folder: Path) -> float:
        k, n = self.opts.eval_sampled, self.opts.eval_samples
        if k <= 0:
            return self.engine.evaluate(folder, n=n)
        self.engine.load_adapter(folder)
        return sum(self.engine.evaluate(n=n, greedy=False, seed=1000 + i) for i in range(k)) / k

    # ------------------------------------------------------------------------------------------ results

    def result(self) -> dict:
        """Everything ``hubgrpo.sim.report`` writes (``simulation_result``)."""
        from hubgrpo.sim.report import simulation_result

        return simulation_result(self)
