"""The worker loop behind ``hubgrpo worker``: lease → download → train a round → commit → submit.

A worker writes only its own submission folder and never pins ``parent_commit``. It heartbeats while training,
gives its lease back on Ctrl-C, and survives everything short of a bad config: every refusal that carries a wait
(budget, rate, merging, lease cap, a duplicate name) is waited out, every store or transport error is retried
with backoff, and a round committed but never submitted is left for the coordinator's repo scan. It stops when
the run is finished, when the coordinator refuses its token (``auth``), on a config, model or data error, and
when the ``hubgrpo run`` that started it is gone.

It runs only code its owner allowed: built-in reward functions, and those named with ``allow_code``.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hubgrpo import layout, runrepo
from hubgrpo.config.recipe import PIPELINING_NEEDS, allows_pipelining
from hubgrpo.error_codes import stop_codes
from hubgrpo.errors import (
    ConfigError,
    CoordinatorError,
    HubGrpoError,
    InvalidSubmission,
    LeaseError,
    RateLimited,
    Refused,
    StoreError,
    wait_seconds,
)
from hubgrpo.layout import Lease
from hubgrpo.store.base import Store
from hubgrpo.worker.delivery import check_inbox_is_ours, commit_round, deliver
from hubgrpo.worker.heartbeat import Heartbeat
from hubgrpo.worker.lease_bounds import adapter_limit, check_lease_bounds
from hubgrpo.worker.orphans import stop_if_orphaned
from hubgrpo.worker.piped import run_piped

if TYPE_CHECKING:
    from hubgrpo.tracking import Tracker

log = logging.getLogger("hubgrpo.worker")
# coordinator answers a worker cannot wait out; the last three: an answer it must never act on (a lease naming
# paths or revisions that are not names and commit ids, a redirect, an oversized answer: hubgrpo.worker.client)
STOP_CODES = stop_codes()  # hubgrpo/error_codes.py: the answers after which a worker stops
MIN_REFUSAL_WAIT_S = 0.1  # a refusal asking for no wait (or a negative one) does not make the worker spin


@dataclass
class Trained:
    """A round trained and saved, not yet delivered: its heartbeat (holding the latest lease), submission, folder
    and clock readings."""

    hb: Heartbeat
    sub: Any
    out: Path
    sub_id: str
    t0: float
    t_download: float
    t_trained: float


class Worker:
    """Runs rounds until the run finishes or ``max_rounds`` is reached."""

    def __init__(
        self,
        store: Store,
        client,
        *,
        name: str,
        user: str | None = None,
        engine=None,
        max_rounds: int | None = None,
        workdir: Path | None = None,
        sleep=time.sleep,
        progress: bool = True,
        threads: int | None = None,
        device: str | None = None,
        upload_via: str | None = None,
        allow_code: list[str] | None = None,
        pipeline: bool | None = None,
    ):
        """``upload_via="coordinator"``: send submissions to the coordinator's ``upload`` endpoint instead of
        committing them (for workers without write access to the run repo; see ``hubgrpo.space.upload``); None:
        the route the run's config implies (``delivery.upload_route``: the coordinator for ``hub.submissions:
        coordinator``, else the store). ``allow_code``: the non-built-in reward functions (``module:function``,
        ``file.py:function``) of the run's config that this worker's owner allows to run; any other one stops
        the worker before it trains. ``pipeline``: deliver each round while the next one trains
        (``hubgrpo.worker.pipeline``; ``hubgrpo worker --pipeline``); None: the run config's ``worker.pipeline``.
        ``threads``, ``device``: this machine's, over the run config's ``worker.threads`` and ``worker.device``."""
        from hubgrpo.worker.delivery import upload_route

        self.store, self.client, self.name, self.user = store, client, layout.check_name(name), user
        self.cfg = runrepo.read_config(store)
        self.upload_via = upload_route(self.cfg.hub.submissions, upload_via)
        from hubgrpo.task.rewards import check_allowed

        check_allowed(self.cfg.rewards, allow_code or [])
        if threads:  # this machine's share of cores wins over the run config
            self.cfg.worker.threads = threads
        if device:  # so does its device (checked when the engine loads the model)
            self.cfg.worker.device = device
        self.engine = engine
        self.max_rounds, self.sleep, self.progress = max_rounds, sleep, progress
        self.workdir = Path(workdir or runrepo.cache_root() / "worker" / name)
        self.results: list[dict] = []
        self.tracker: Tracker | None = None  # made in run()
        self.steps_done = 0
        self.pipeline = self.cfg.worker.pipeline if pipeline is None else pipeline
        self.in_use: list[str] = []  # adapter ids a round trains from or a lease fetched ahead will: never pruned
        self._record_lock = threading.Lock()

    def run(self) -> list[dict]:
        """The loop. Returns the coordinator's answer (or the refusal) for every round."""
        if self.engine is None:
            self.engine = make_engine(self.cfg, self.name)
        if self.tracker is None:
            from hubgrpo.tracking import make_tracker

            self.tracker = make_tracker(self.cfg.log, project=self.cfg.project_name, name=self.name)
        tracker = self.tracker
        if self.upload_via == "store":
            check_inbox_is_ours(self.cfg.hub.submissions, self.store, getattr(self.client, "target", ""))
        if self.pipeline and allows_pipelining(self.cfg):
            run_piped(self)
        else:
            if self.pipeline:
                log.warning("pipelined rounds asked for, but %s: rounds run in sequence", PIPELINING_NEEDS)
            while self.max_rounds is None or len(self.results) < self.max_rounds:
                t0 = time.time()
                lease = self._lease()
                if lease is None:
                    break
                lease_s = time.time() - t0
                answer = self._guarded(lease, lambda: self.round(lease))
                answer["lease_s"] = lease_s
                self.collect(answer)
        tracker.close()
        return self.results

    def collect(self, answer: dict) -> None:
        """A round's answer (or why it did not count): kept, logged to rounds.jsonl and the tracker."""
        self.results.append(answer)
        self._record(answer)
        if self.tracker is not None:
            self.tracker.log({f"round/{k}": v for k, v in answer.items()}, step=self.steps_done)

    def _guarded(self, lease: Lease, work) -> Any:
        """``work()`` for ``lease`` (its round, or a part of it), or why the round did not count; raises only what
        the worker cannot survive."""
        try:
            return work()
        except KeyboardInterrupt:
            self._release(lease)
            raise
        except (LeaseError, InvalidSubmission, Refused) as e:  # this round is refused; the next one may not be
            if isinstance(e, Refused) and e.code in STOP_CODES:
                raise
            log.warning("round refused (%s): %s", e.code, e.message)
            return {"status": "refused", "code": e.code, "message": e.message}
        except (StoreError, CoordinatorError) as e:
            if isinstance(e, CoordinatorError) and e.code in STOP_CODES:
                raise
            log.warning(
                "round not delivered (%s): %s; a committed round is found by the coordinator's scan", e.code, e.message
            )
            self._release(lease)  # this process abandons the lease: the next one is not a duplicate of it
            self.sleep(self._backoff())
            return {"status": "error", "code": e.code, "message": e.message}

    def _backoff(self) -> float:
        self._failures = getattr(self, "_failures", 0) + 1
        return min(60.0, 2.0**self._failures)

    def _record(self, answer: dict) -> None:
        """Append the round's answer and timings to <workdir>/rounds.jsonl (read by benchmarks/round/overhead.py)."""
        import json

        self.workdir.mkdir(parents=True, exist_ok=True)
        with self._record_lock, open(self.workdir / "rounds.jsonl", "a") as f:
            f.write(json.dumps({"worker": self.name, "at": time.time(), **answer}, default=str) + "\n")

    def _lease(self) -> Lease | None:
        """A lease, waiting out refusals and outages; None when the run is finished."""
        delay = 1.0
        while True:
            try:
                lease = self.client.lease(self.name, self.user)
                self._failures = 0
                return lease
            except (Refused, RateLimited) as e:  # RateLimited: the coordinator's store is busy
                if e.code == "finished":
                    log.info("run finished: %s", e.message)
                    return None
                if e.code in STOP_CODES:
                    raise
                wait = _wait_hint(e, default=delay)
                (log.debug if e.code == "merging" else log.info)(
                    "coordinator asks to wait %.1f s (%s): %s", wait, e.code, e.message
                )
                self.sleep(wait)
                delay = min(delay * 2, 60.0)
            except CoordinatorError as e:
                if e.code in STOP_CODES:
                    raise
                stop_if_orphaned(e)
                log.warning("coordinator unreachable (%s); retrying in %.0f s", e.message, delay)
                self.sleep(delay)
                delay = min(delay * 2, 60.0)

    def round(self, lease: Lease) -> dict:
        """Train one leased round and submit it."""
        return self.finish(self.train(lease))

    def train(self, lease: Lease) -> Trained:
        """Download the lease's version and train the round; its folder waits for ``finish``."""
        t0 = time.time()
        check_lease_bounds(self.cfg, lease, self.name)  # nothing downloaded or trained for a lease not ours
        self.in_use.append(lease.base_sha)
        sub_id = layout.submission_id(lease.worker, lease.lease_id)
        out, hb = self.workdir / "rounds" / sub_id, None
        try:  # the download too: a failed one leaves its version protected from pruning no longer (finally)
            adapter_dir = self.client.adapter(
                lease.base_version, lease.base_sha, self.workdir / "adapters", adapter_limit(self.cfg)
            )  # from the coordinator: no repo read
            t_download = time.time() - t0
            # the heartbeat runs until the round is delivered (``finish``): a round waiting for it stays live
            hb = Heartbeat(self.client, lease, self.cfg.coordinator.heartbeat_interval_s).__enter__()
            bare = lease.model_copy(update={"uploads": {}})  # upload URLs never go into submission.json
            sub = self.engine.run_round(
                adapter_dir, bare, out, on_step=self._progress(lease, hb), rebase=self._rebase_source()
            )
        except BaseException:
            if hb is not None:
                hb.__exit__()
            runrepo.remove_tree(out, self.workdir / "rounds")
            raise
        finally:
            self.in_use.remove(lease.base_sha)  # loaded into the model (or given up): the folder may go
        return Trained(hb, sub, out, sub_id, t0, t_download, time.time())

    def drop(self, tr: Trained) -> None:
        """A trained round that will not be delivered (the worker stops): its heartbeat, lease and folder go."""
        tr.hb.__exit__()
        self._release(tr.hb.lease)
        runrepo.remove_tree(tr.out, self.workdir / "rounds")

    def finish(self, tr: Trained) -> dict:
        """Deliver a trained round (commit, inbox or upload) and submit it; its answer with the round's seconds."""
        t1 = time.time()
        try:
            if self.upload_via == "coordinator":  # the coordinator checks, commits (batched) and submits it
                answer = self._submit(tr.hb.lease, None, folder=tr.out)
                t_upload, t2 = time.time() - t1, time.time()
            else:
                commit = self._deliver(tr.out, tr.hb, tr.sub_id)
                t_upload = time.time() - t1
                t2 = time.time()
                answer = self._submit(tr.hb.lease, commit)
        finally:  # delivered or given up: the round's folder is not needed again (the disk stays bounded)
            tr.hb.__exit__()
            runrepo.remove_tree(tr.out, self.workdir / "rounds")
            # the newest versions (the next round's, one fetched ahead, a rebase's) stay; never anything outside
            # the worker's folder; after the delivery, off the training's path
            runrepo.prune_revisions(
                self.workdir / "adapters", keep=3, root=self.workdir / "adapters", protect=frozenset(self.in_use)
            )
        answer.update(
            submission_id=tr.sub_id,
            reward_mean=tr.sub.reward_mean,
            download_s=tr.t_download,
            train_s=tr.t_trained - tr.t0 - tr.t_download,
            upload_s=t_upload,
            submit_s=time.time() - t2,
            round_s=time.time() - tr.t0,
            started_at=tr.t0,  # (a pipelined round's answer is kept after the next round trained)
        )
        log.info("round %s: reward %.3f, %s", tr.sub_id, tr.sub.reward_mean, answer.get("status"))
        return answer

    def _rebase_source(self):
        """merge.rebase: the coordinator's newest version, polled between steps (``hubgrpo.worker.rebase``)."""
        if not self.cfg.merge.rebase:
            return None
        from hubgrpo.worker.rebase import CoordinatorSource

        return CoordinatorSource(
            self.client,
            self.workdir / "adapters",
            adapter_limit(self.cfg),
            poll_s=min(10.0, self.cfg.coordinator.heartbeat_interval_s),
        )

    def _deliver(self, out: Path, hb: Heartbeat, sub_id: str) -> str:
        """Commit the round to the run repo, or put it in the inbox ``hub.submissions`` names (through the lease's
        upload URLs; expired ones are renewed with one heartbeat); what to submit."""
        spec = self.cfg.hub.submissions
        if not spec:
            return commit_round(self.store, out, hb.lease, sub_id, sleep=self.sleep)
        from hubgrpo.errors import AuthError

        try:
            return deliver(spec, hb.lease, out, sleep=self.sleep)
        except AuthError:
            if not hb.lease.uploads:
                raise
            hb.lease = self.client.heartbeat(hb.lease)
            return deliver(spec, hb.lease, out, sleep=self.sleep)

    def _submit(self, lease: Lease, commit: str | None, folder: Path | None = None) -> dict:
        """``submit(lease, commit)``, or ``upload(lease, folder)`` when a folder is given; refusals with a wait
        (rate, budget…) are waited out and outages retried, then the error goes to the loop (the commit stays in
        the repo for the coordinator's scan)."""

        def send() -> dict:
            if folder is None:
                return self.client.submit(lease, commit)
            return self.client.upload(lease, folder, frozen_a=self.cfg.merge.merge_method.frozen_a)

        delay = 2.0
        for attempt in range(8):
            try:
                return send()
            except (Refused, RateLimited) as e:
                if e.wait_s is None or e.code in STOP_CODES:
                    raise  # a verdict on this round (or on this worker), not a request to wait
                wait = wait_seconds(e.wait_s, 30.0)
                log.info("submit: coordinator asks to wait %.1f s (%s)", wait, e.code)
                self.sleep(wait)
            except CoordinatorError as e:
                if e.code in STOP_CODES:
                    raise
                stop_if_orphaned(e)  # the commit is in the repo: the restarted run's coordinator finds it
                log.warning("submit failed (%s); retrying in %.0f s", e.message, delay)
                self.sleep(delay)
                delay = min(delay * 2, 60.0)
        return send()

    def _release(self, lease: Lease) -> None:
        try:
            self.client.release(lease)
            log.info("gave lease %s back", lease.lease_id)
        except Exception as e:  # best effort on the way out; the lease expires anyway
            log.warning("could not give the lease back: %s", e)

    def _progress(self, lease: Lease, hb: Heartbeat | None = None):
        """on_step: the progress line (when enabled) and the tracker's per-step GRPO metrics; it stops the round
        (raises CoordinatorError ``orphaned``) once ``hb`` found that the `hubgrpo run` that started us is gone."""
        show = None
        if self.progress:
            from hubgrpo.worker.progress import round_progress

            show = round_progress(self.name, lease)

        def on_step(step: int, metrics: dict) -> None:
            if hb is not None and hb.orphaned is not None:
                raise hb.orphaned
            self.steps_done += 1
            if self.tracker is not None:
                self.tracker.log({f"train/{k}": v for k, v in metrics.items()}, step=self.steps_done)
            if show:
                show(step, metrics)

        return on_step


def strict_verify(cfg) -> bool:
    """Whether the run's verifier replays strictly (``coordinator.verify_tolerance: strict``): float32 rounds only."""
    return cfg.coordinator.verify != "off" and cfg.coordinator.verify_tolerance == "strict"


def make_engine(cfg, name: str):
    """The worker's round engine; in a strictly verified run in float32 (``worker.dtype: auto`` would be bf16 on a
    GPU), checked (``check_precision``)."""
    from hubgrpo.proof.verify import full_float32
    from hubgrpo.worker.engine import RoundEngine

    if strict_verify(cfg):
        full_float32()
        if cfg.worker.dtype == "auto":
            cfg.worker.dtype = "float32"
    engine = RoundEngine(cfg, worker=name)
    check_precision(cfg, engine)
    return engine


def check_precision(cfg, engine) -> None:
    """A worker of a strictly verified run whose model is not float32 stops before its first lease instead of
    being excluded by its first verdict (``worker.dtype: auto`` resolves to float32 there)."""
    dtype = str(next(engine.model.parameters()).dtype).removeprefix("torch.")
    if strict_verify(cfg) and dtype != "float32":
        raise ConfigError(
            f"this run verifies rollouts strictly (coordinator.verify_tolerance: strict) and this worker's model is "
            f"{dtype}: the verifier would reject its honest rounds",
            hint="the run's config must leave worker.dtype at auto or float32, or set verify_tolerance: wide",
        )


def _wait_hint(err: HubGrpoError, default: float) -> float:
    """Seconds to wait, from a RateLimited error or a refusal's ``wait_s`` or 'wait_s=N' hint: always within
    [0, ``errors.MAX_WAIT_S``] (the coordinator's word is not trusted with the worker's time)."""
    if isinstance(err, RateLimited) or err.wait_s:
        return max(MIN_REFUSAL_WAIT_S, wait_seconds(err.wait_s, default))
    hint = err.hint or ""
    if "wait_s=" in hint:
        return max(MIN_REFUSAL_WAIT_S, wait_seconds((hint.split("wait_s=")[1].split() or [""])[0], default))
    return default
