"""``hubgrpo evaluate``: score every global version that has no held-out score yet, and record it.

The evaluator asks the coordinator's status which versions lack an ``eval_reward``, downloads each one's adapter from
the coordinator (by its adapter id: versions between checkpoints are only there) or, once the coordinator no longer has
it, at its checkpoint's tag; scores it greedily on the first ``samples`` held-out prompts of the run
(``RoundEngine.evaluate``: the run's own reward functions) and reports ``(version, reward, samples)`` through the
``record_eval`` endpoint, authenticated like a worker (on a Space only ``coordinator.evaluators`` may). The newest
unscored version goes first (so a gate and the live curve see it soon), then the older ones. ``once=True`` scores what
is there and returns; otherwise it follows new versions until the run is finished and every version is scored.

Its disk stays bounded: each adapter is deleted once scored (and its HF cache entry is evicted on download).
Like a worker, it runs only reward code its owner allowed.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from hubgrpo import runrepo
from hubgrpo.errors import CoordinatorError, Refused, wire_text
from hubgrpo.store.base import Store

log = logging.getLogger("hubgrpo.evaluator")


class Evaluator:
    """Scores versions of one run and records the scores with its coordinator."""

    def __init__(
        self,
        store: Store,
        client,
        *,
        samples: int = 16,
        engine=None,
        workdir: Path | None = None,
        poll_s: float = 5.0,
        sleep=time.sleep,
        threads: int | None = None,
        allow_code: list[str] | None = None,
    ):
        from hubgrpo.task.rewards import check_allowed

        self.store, self.client, self.samples = store, client, int(samples)
        self.cfg = runrepo.read_config(store)
        check_allowed(self.cfg.rewards, allow_code or [])
        if threads:
            self.cfg.worker.threads = threads
        self.engine, self.poll_s, self.sleep = engine, float(poll_s), sleep
        self.workdir = Path(workdir or runrepo.cache_root() / "evaluator" / self.cfg.project_name)
        self.seconds: list[float] = []  # seconds per scored version (download + greedy generation + rewards)
        self.unavailable: set[int] = set()  # versions neither the coordinator nor a checkpoint has any more

    def todo(self, status: dict) -> list[int]:
        """Versions without a held-out score, newest first (what the coordinator lists: rows that are not a
        version number within bounds are skipped)."""
        rows = status.get("versions")
        return sorted(
            {
                v["version"]
                for v in rows
                if isinstance(v, dict)
                and type(v.get("version")) is int
                and 0 <= v["version"] <= 10**9
                and v.get("eval_reward") is None
            }
            if isinstance(rows, list)
            else (),
            reverse=True,
        )

    def ready(self):
        """The engine (base model + held-out prompts + rewards), built on first use."""
        if self.engine is None:
            from hubgrpo.worker.engine import RoundEngine

            self.engine = RoundEngine(self.cfg, worker="evaluator")
        return self.engine

    def score(self, version: int, sha: str | None, adapter_id: str | None = None) -> tuple[float, int]:
        """(held-out reward, prompts scored) of ``version``'s adapter — from the coordinator by ``adapter_id``, else
        at its checkpoint ``sha``; the downloaded copy is deleted after."""
        self.ready()
        folder = self._download(version, sha, adapter_id)
        try:
            reward = self.engine.evaluate(folder, n=self.samples, greedy=True)
        finally:
            runrepo.remove_tree(folder, self.workdir / "adapters")
        return float(reward), min(self.samples, self.engine.source.eval_size)

    def _download(self, version: int, sha: str | None, adapter_id: str | None) -> Path:
        if adapter_id is not None:
            from hubgrpo.worker.loop import STOP_CODES, adapter_limit

            try:
                return self.client.adapter(version, adapter_id, self.workdir / "adapters", adapter_limit(self.cfg))
            except CoordinatorError as e:
                if e.code in STOP_CODES or sha is None:
                    raise
        assert sha is not None, "a version comes with its adapter id, its checkpoint's sha or both"
        return runrepo.adapter_at(self.store, sha, self.workdir / "adapters")

    def sources(self, status: dict, todo: list[int]) -> dict[int, tuple[str | None, str | None]]:
        """version → (checkpoint sha, adapter id) of the versions of ``todo`` that can be loaded: a tag, or an
        adapter id the coordinator lists (checked: 40 hex digits, it names a folder)."""
        from hubgrpo import layout

        ids = {
            r["version"]: r.get("adapter_id")
            for r in status.get("versions") or []
            if isinstance(r, dict) and r.get("version") in todo and layout.is_commit_id(r.get("adapter_id"))
        }
        shas = runrepo.version_shas(self.store) if todo else {}
        return {v: (shas.get(v), ids.get(v)) for v in todo if v in shas or v in ids}

    def run(self, once: bool = False) -> list[dict]:
        """Score and record until nothing is left (``once``) or the run is finished and fully scored."""
        results: list[dict] = []
        while True:
            status = self._status()
            todo = self.todo(status)
            found = self.sources(status, [v for v in todo if v not in self.unavailable])
            scored = [
                r
                for r in (self._score_and_record(v, *found[v]) for v in todo if v in found)
                if r["status"] != "unavailable"
            ]
            results += scored
            if once or (status.get("finished") and not scored):
                return results
            if not scored:
                self.sleep(self.poll_s)

    def _score_and_record(self, version: int, sha: str | None, adapter_id: str | None = None) -> dict:
        self.ready()  # seconds per version: download + greedy generation + rewards, not the engine's setup
        t0 = time.perf_counter()
        try:
            reward, n = self.score(version, sha, adapter_id)
        except CoordinatorError as e:  # gone from the coordinator and never checkpointed: not loadable any more
            from hubgrpo.worker.loop import STOP_CODES

            if e.code in STOP_CODES:
                raise
            log.info("version %d cannot be scored: %s", version, e.message)
            self.unavailable.add(version)
            return {"status": "unavailable", "version": version}
        self.seconds.append(time.perf_counter() - t0)
        answer = self.client.record_eval(version, reward, n)
        status = wire_text(answer.get("status"), 40)  # the coordinator's word: shown as text, never over ours
        log.info(
            "version %d: held-out reward %.4f on %d prompts (%.1f s), %s", version, reward, n, self.seconds[-1], status
        )
        return {
            **answer,
            "status": status,
            "version": version,
            "eval_reward": reward,
            "samples": n,
            "seconds": self.seconds[-1],
        }

    def _status(self) -> dict:
        return waiting_status(self.client, self.sleep)


def waiting_status(client, sleep) -> dict:
    """The coordinator's status, waiting out outages (a refusal such as ``auth`` stops the evaluator)."""
    delay = 1.0
    while True:
        try:
            return client.status()
        except Refused:
            raise
        except CoordinatorError as e:
            from hubgrpo.worker.orphans import orphaned

            if e.code != "unreachable" or orphaned():  # stop with the `hubgrpo run` that started it
                raise
            log.warning("coordinator unreachable; retrying in %.0f s", delay)
            sleep(delay)
            delay = min(2 * delay, 60.0)
