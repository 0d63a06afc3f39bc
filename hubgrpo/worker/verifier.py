"""``hubgrpo evaluate --verify``: replay a sample of every admitted round with its leased version (proof of rollouts).

The verifier runs where a model is (the evaluator role). It asks the coordinator's status which admitted rounds have
no verdict yet (``verify.todo``, with ``coordinator.verify`` other than off), gets each round's submission.json and
rollouts file from the coordinator as admission read them (``round_files``: its copy, whose sha256 the status lists
beside the round; a worker may have changed the round's folder since), and checks it (``check``):

- only the first generation batch is replayed: it is the one the leased version sampled (a later batch of a round
  of several steps was sampled by the worker's adapter after local steps, which nobody else holds);
- its completions are chosen with ``hubgrpo.proof.selection`` under a secret this verifier draws at start
  (``os.urandom``), keyed by the sha256 of the rollouts file: the worker, who submitted before, cannot know which;
- each chosen completion's prompt ids must be the leased prompt as TRL tokenises it (else a prompt could carry the
  answer), and its text must be what its token ids decode to (the rewards were computed on the text);
- ``hubgrpo.proof.verify.verify_completions`` replays them with the leased version (loaded into the engine's model,
  in eval mode, always in float32 whatever ``worker.dtype`` says) with the run's tolerance
  (``coordinator.verify_tolerance``: strict, the default, for float32 workers; wide for bfloat16 ones too), the
  lease's seed and sampling settings; every chosen completion must also end where
  generation ends (its first stop token last, or ``max_completion_length`` tokens: a worker cannot cut an honest
  completion short); the round passes by the rule for the verifier's precision.

It reports each verdict through ``record_verdict`` (on a Space only ``coordinator.evaluators`` may, and ask for
``round_files``). A round the coordinator no longer keeps (admitted before it restarted), or whose base version is
no longer loadable, is skipped. ``once=True`` checks what is listed and returns; otherwise it follows new rounds
until the run is finished.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from pathlib import Path

from hubgrpo import layout, runrepo
from hubgrpo.errors import CoordinatorError, HubGrpoError, StoreError, wire_text
from hubgrpo.proof.selection import BUDGET, choose, selection_key
from hubgrpo.store.base import Store
from hubgrpo.worker.evaluator import waiting_status

log = logging.getLogger("hubgrpo.verifier")
FILES = (layout.SUBMISSION_FILE, layout.ROLLOUTS_FILE)  # what a round is replayed from (``coordinator.kept``)
AGAIN = frozenset({"unknown_submission", "unreachable", "unavailable", "rate_limited"})  # not the round's fault


class Verifier:
    """Checks admitted rounds of one run and records verdicts with its coordinator."""

    def __init__(
        self,
        store: Store,
        client,
        *,
        engine=None,
        workdir: Path | None = None,
        secret: bytes | None = None,
        budget: float = BUDGET,
        poll_s: float = 5.0,
        sleep=time.sleep,
        threads: int | None = None,
        allow_code: list[str] | None = None,
    ):
        from hubgrpo.task.rewards import check_allowed

        self.store, self.client, self.budget = store, client, float(budget)
        self.cfg = runrepo.read_config(store)
        check_allowed(self.cfg.rewards, allow_code or [])
        if threads:
            self.cfg.worker.threads = threads
        self.cfg.worker.dtype = "float32"  # the precision the tolerance is measured for (hubgrpo.proof.verify)
        if self.cfg.coordinator.verify_tolerance == "strict":
            from hubgrpo.proof.verify import full_float32

            full_float32()
        self.engine, self.poll_s, self.sleep = engine, float(poll_s), sleep
        self.owns_engine = engine is None  # nobody else changes its model: the leased adapter can stay loaded
        self.loaded: tuple[int, str] | None = None  # (version, adapter id) of the adapter in the engine's model
        self.secret = secret if secret is not None else os.urandom(32)  # drawn after the rounds it checks
        self.workdir = Path(workdir or runrepo.cache_root() / "verifier" / self.cfg.project_name)
        self.skipped: set[str] = set()  # rounds that cannot be checked (files or base version gone)
        self.seconds: list[float] = []

    def ready(self):
        if self.engine is None:
            from hubgrpo.worker.engine import RoundEngine

            self.engine = RoundEngine(self.cfg, worker="verifier")
        return self.engine

    def todo(self, status: dict) -> list[tuple[str, int, dict | None]]:
        """(submission id, base version, sha256 of its files as admitted, when listed) of the rounds the status
        lists without a verdict (checked shapes)."""
        rows = (status.get("verify") or {}).get("todo") if isinstance(status.get("verify"), dict) else None
        out = []
        for r in rows if isinstance(rows, list) else ():
            if not isinstance(r, dict) or not layout.is_name(r.get("submission_id")):
                continue
            base, digests = r.get("base_version"), r.get("sha256")
            if not (isinstance(digests, dict) and sorted(digests) == sorted(FILES)):
                digests = None
            if type(base) is int and 0 <= base <= 10**9 and r["submission_id"] not in self.skipped:
                out.append((r["submission_id"], base, digests))
        return out

    def run(self, once: bool = False) -> list[dict]:
        """Check and record until nothing is left (``once``) or the run is finished."""
        results: list[dict] = []
        while True:
            status = waiting_status(self.client, self.sleep)  # outages waited out, as the evaluator does
            done = [r for r in (self._check_and_record(*t) for t in self.todo(status)) if r is not None]
            results += done
            if once or (status.get("finished") and not done):
                return results
            if not done:
                self.sleep(self.poll_s)

    def _check_and_record(self, sub_id: str, base_version: int, digests: dict | None = None) -> dict | None:
        t0 = time.perf_counter()
        try:
            report = self.check(sub_id, base_version, digests)
        except (HubGrpoError, OSError, ValueError, IndexError, RecursionError) as e:  # a round's files, not ours
            self._skip(sub_id, "cannot be checked", e)
            return None
        self.seconds.append(time.perf_counter() - t0)
        try:
            answer = self.client.record_verdict(sub_id, report)
        except HubGrpoError as e:
            self._skip(sub_id, "verdict not recorded", e)
            return None
        status = wire_text(answer.get("status"), 40)
        if status == "duplicate":  # another verifier's came first: never asked again
            self.skipped.add(sub_id)
        log.info("round %s: %s (%s)", sub_id, "passed" if report["passed"] else "FAILED", status)
        return {**report, "submission_id": sub_id, "status": status, "seconds": self.seconds[-1]}

    def _skip(self, sub_id: str, what: str, e: BaseException) -> None:
        """A round left for now (``AGAIN``: a round merging meanwhile, an outage) or for good; raises what stops."""
        from hubgrpo.worker.loop import STOP_CODES

        code = getattr(e, "code", None)
        if isinstance(e, CoordinatorError) and code in STOP_CODES:
            raise e
        log.info("round %s %s: %s", sub_id, what, getattr(e, "message", e))
        if code not in AGAIN:
            self.skipped.add(sub_id)

    def check(self, sub_id: str, base_version: int, digests: dict | None = None) -> dict:
        """The verdict on one round (a ``layout.VerdictReport`` as a dict), from its files as admission read them:
        the coordinator's copy (``round_files``), whose sha256 must be ``digests`` (``status.verify.todo``). A
        round the coordinator does not list with them (admitted before it restarted) cannot be judged as admitted."""
        from hubgrpo.task import rollouts as rl

        if digests is None:
            raise StoreError(f"round {sub_id} is not kept as admitted by this coordinator", code="not_kept")
        files = self.client.round_files(sub_id, base_version, FILES)
        for name, blob in files.items():
            if hashlib.sha256(blob).hexdigest() != digests[name]:
                raise StoreError(f"{name} of round {sub_id} is not the one admitted", code="changed")
        sub = layout.Submission.from_json(files[layout.SUBMISSION_FILE])
        if layout.submission_id(sub.lease.worker, sub.lease.lease_id) != sub_id:
            raise StoreError(f"the files given for round {sub_id} are another round's", code="corrupt")
        raw = files[layout.ROLLOUTS_FILE]
        local = self.workdir / "rounds" / sub_id
        local.mkdir(parents=True, exist_ok=True)
        (local / layout.ROLLOUTS_FILE).write_bytes(raw)
        bounded = sub.lease.model_copy(update={"steps": min(sub.lease.steps, 4 * self.cfg.rounds.steps), "params": {}})
        data = rl.read(local / layout.ROLLOUTS_FILE, rl.size_limit(self.cfg, bounded))  # the run's, not the record's
        (local / layout.ROLLOUTS_FILE).unlink()
        key = selection_key(self.secret, hashlib.sha256(raw).digest())
        return self.replay(sub.lease, data, key)

    def replay(self, lease: layout.Lease, data: layout.Rollouts, key: bytes) -> dict:
        """Replay the chosen completions of the round's first generation batch with the leased version."""
        from hubgrpo.proof.verify import run_tolerance, verify_completions
        from hubgrpo.task.rewards import completion_text
        from hubgrpo.task.rollouts import lease_params

        def failed(reason: str) -> dict:
            return {"passed": False, "completions": 0, "tokens": 0, "checked": 0, "mismatches": 0, "reason": reason}

        batch = data.batches[0] if data.batches else None
        if batch is None or batch.prompt_ids is None or batch.completion_ids is None:
            return failed("the round carries no token ids to replay")
        engine = self.ready()
        chosen = choose([len(c) for c in batch.completion_ids], key, self.budget)
        p = lease_params(self.cfg, lease)
        rows = engine.prompt_rows([batch.prompt_indices[i] for i in chosen], p["max_prompt_length"])
        rebuilt = engine.trainer._tokenize_prompts([r["prompt"] for r in rows])[0]
        vocab = engine.model.get_input_embeddings().weight.shape[0]
        for i, ids in zip(chosen, rebuilt):
            if [int(t) for t in ids] != batch.prompt_ids[i]:
                return failed(f"completion {i}: its prompt ids are not the leased prompt's")
            if any(t >= vocab for t in batch.completion_ids[i]):
                return failed(f"completion {i}: a token id outside the vocabulary ({vocab})")
            text = engine.tokenizer.decode(batch.completion_ids[i], skip_special_tokens=True)
            recorded = batch.completions[i]
            if text != completion_text(recorded if isinstance(recorded, str) else [m.model_dump() for m in recorded]):
                return failed(f"completion {i}: its text is not what its token ids decode to")
        self.load(lease)
        model = engine.trainer.model
        training = model.training
        model.eval()
        verdict = verify_completions(
            model,
            engine.tokenizer,
            [batch.prompt_ids[i] for i in chosen],
            [batch.completion_ids[i] for i in chosen],
            lease.seed,
            chosen,  # batch 0: a completion's index in the round is its row
            temperature=p["temperature"],
            top_p=p["top_p"],
            top_k=p.get("top_k"),
            tolerance=run_tolerance(self.cfg.coordinator.verify_tolerance),
            stop=engine.trainer.eos_token_ids,
            max_length=int(p["max_completion_length"]),
        )
        model.train(training)
        passed = verdict.passes()
        return {
            "passed": passed,
            "completions": verdict.completions,
            "tokens": verdict.tokens,
            "checked": verdict.checked,
            "mismatches": verdict.mismatches,
            "reason": None if passed else _reason(verdict),
        }

    def load(self, lease: layout.Lease) -> None:
        """The leased version's adapter into the engine's model; kept between rounds of the same version when this
        verifier built its engine (consecutive rounds of one version: one download and one load)."""
        key = (lease.base_version, lease.base_sha)
        if self.owns_engine and self.loaded == key:
            return
        self.loaded = None
        folder = self._base(lease)
        try:
            self.ready().load_adapter(folder)
        finally:
            runrepo.remove_tree(folder, self.workdir / "adapters")
        self.loaded = key if self.owns_engine else None

    def _base(self, lease: layout.Lease) -> Path:
        """The leased version's adapter: from the coordinator by its id, else at its checkpoint's tag."""
        from hubgrpo.worker.loop import STOP_CODES, adapter_limit

        try:
            return self.client.adapter(
                lease.base_version, lease.base_sha, self.workdir / "adapters", adapter_limit(self.cfg)
            )
        except CoordinatorError as e:
            if e.code in STOP_CODES:
                raise
            sha = runrepo.version_shas(self.store).get(lease.base_version)
            if sha is None:
                raise
            return runrepo.adapter_at(self.store, sha, self.workdir / "adapters")


def _reason(verdict) -> str:
    """Why a verdict failed, in words."""
    parts = []
    if verdict.mismatches:
        parts.append(f"{verdict.mismatches} of {verdict.checked} replayed tokens differ")
    if verdict.unended:
        parts.append(
            f"{verdict.unended} of {verdict.completions} completions do not end where generation ends "
            "(a stop token last, or max_completion_length tokens)"
        )
    return "; ".join(parts)
