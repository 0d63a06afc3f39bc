"""Mid-round rebase (``merge.rebase``, FFA-LoRA runs): move a round that is training onto a newer global version.

With lora_A frozen (``merge.method: ffa``) an adapter's update ΔW = s·B·A is linear in B. A round that leased
version b and has trained B = B_b + δ (δ: its own progress so far) moves onto a newer version n by
B ← B + (B_n − B_b) = B_n + δ: its progress is kept exactly, and the steps after the move generate and learn on
the newer model. The submission names n (``Submission.rebased_version``); the coordinator measures the round's
update against B_n (δ plus the steps after the move) and its staleness from n. AdamW's moments stay: they
belong to the parameters, which moved by a constant.

Between two optimizer steps (never after the last: that would change the staleness but not the update; with
``params.num_iterations`` k > 1 only every k steps, when TRL generates anew) and, with
``merge.rebase_after_generation``, between a step's generation and its backward (the gradient is then taken at
the newer model on completions sampled from the older one, as in-flight weight updates do; TRL computes any
old log-probabilities after the move, so the ratios stay consistent), the engine asks a ``Source`` for the
newest version it can see — the simulator from its virtual clock, a real worker from the coordinator
(``CoordinatorSource``: the status's version and its commit sha, at most every 10 s, or every heartbeat interval
if that is shorter). Never from the repo's tags: anyone with write access to the repo can move a tag, while the
coordinator's sha names exactly the commit it merged. A failed poll or move only means the round stays where it is.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from transformers import TrainerCallback

if TYPE_CHECKING:
    from hubgrpo.worker.engine import RoundEngine

log = logging.getLogger("hubgrpo.worker")

# (steps done, current base[, generated=True]) → (newer version, adapter) or None; generated=True: the next step's
# completions are sampled and its backward has not started (merge.rebase_after_generation)
Source = Callable[..., "tuple[int, Path] | None"]


def is_b(key: str) -> bool:
    return ".lora_B" in key or ".lora_embedding_B" in key


class Rebaser(TrainerCallback):
    """A TrainerCallback that applies ``source``'s newer versions to the model between steps."""

    def __init__(self) -> None:
        self.source: Source | None = None
        self.version: int | None = None  # the version the round is an update of now
        self.sha: str | None = None  # its adapter id, once the round moved (``Submission.rebased_sha``)
        self.moved: list[int] = []
        self.seconds = 0.0
        self._base: dict[str, torch.Tensor] = {}
        self._engine: RoundEngine | None = None

    def start(self, engine, source: Source | None, version: int) -> None:
        """A new round from ``version`` (the adapter just loaded into ``engine``'s model)."""
        self.source, self.version, self.moved, self.seconds, self._engine = source, version, [], 0.0, engine
        self.sha = None
        self._base = {k: v.detach().clone() for k, v in engine._adapter_state().items()} if source else {}

    def on_step_end(self, args, state, control, **kwargs):
        every = max(1, int(getattr(args, "num_iterations", 1) or 1))  # TRL reuses a generation for k steps
        if self.source is None or state.global_step >= state.max_steps or state.global_step % every:
            return
        self._poll(int(state.global_step), generated=False)

    def after_generation(self, steps_done: int) -> None:
        """Step ``steps_done + 1``'s completions are sampled; its backward has not started."""
        if self.source is not None:
            self._poll(int(steps_done), generated=True)

    def _poll(self, steps_done: int, *, generated: bool) -> None:
        source, version = self.source, self.version
        if source is None or version is None:  # (``start`` sets both)
            return
        t0 = time.perf_counter()
        try:
            found = source(steps_done, int(version), generated=True) if generated else source(steps_done, int(version))
            if found is not None and found[0] > version:
                self._move(*found)
        except Exception as e:  # noqa: BLE001 — a bad offer must not cost the round: it stays where it is
            where = f"the generation of step {steps_done + 1}" if generated else f"step {steps_done}"
            log.warning("not rebasing after %s: %s", where, e)
        finally:
            self.seconds += time.perf_counter() - t0

    def _move(self, version: int, folder: Path) -> None:
        from peft import set_peft_model_state_dict

        from hubgrpo.worker.adapter_io import check_adapter

        eng = self._engine
        assert eng is not None, "start() gave the round its engine"
        current = eng._adapter_state()
        new = check_adapter(Path(folder), current, eng.cfg.lora)
        if any(
            not is_b(k) and not torch.equal(new[k].to(v.device, v.dtype), self._base[k]) for k, v in current.items()
        ):
            log.warning("not rebasing onto v%d: its lora_A differs from the round's (is the run ffa?)", version)
            return
        state = {k: (v + (new[k].to(v.device, v.dtype) - self._base[k])) if is_b(k) else v for k, v in current.items()}
        # copies in place, so AdamW keeps its parameters and moments (peft annotates the result as a bare
        # ``namedtuple``: it is torch's ``_IncompatibleKeys``)
        result: Any = set_peft_model_state_dict(eng.trainer.model, state, adapter_name="default")
        if result.unexpected_keys:
            raise ValueError(f"peft did not place {sorted(result.unexpected_keys)[:3]}")
        self._base = {k: new[k].to(v.device, v.dtype) for k, v in current.items()}
        from hubgrpo import layout

        folder = Path(folder)
        self.sha = layout.adapter_id(
            (folder / layout.ADAPTER_WEIGHTS).read_bytes(), (folder / layout.ADAPTER_CONFIG).read_bytes()
        )
        self.version = version
        self.moved.append(version)

    @property
    def rebased_version(self) -> int | None:
        return self.version if self.moved else None

    @property
    def rebased_sha(self) -> str | None:
        return self.sha if self.moved else None


class CoordinatorSource:
    """A real worker's view of the run: the coordinator's current version and its adapter id (``status``), the
    adapter downloaded from the coordinator once (``CoordinatorClient.adapter``, checked against the id)."""

    def __init__(self, client, cache: Path, max_bytes: int, *, poll_s: float = 10.0, clock=time.monotonic):
        self.client, self.cache, self.max_bytes, self.poll_s, self.clock = client, Path(cache), max_bytes, poll_s, clock
        self._last = -float("inf")
        self.ids: dict[int, str] = {}  # version → adapter id of the versions offered (the submission names it)

    def __call__(self, step: int, current: int, generated: bool = False) -> tuple[int, Path] | None:
        from hubgrpo import layout
        from hubgrpo.errors import HubGrpoError

        if self.clock() - self._last < self.poll_s:
            return None
        self._last = self.clock()
        try:
            status = self.client.status()
            version, aid = status.get("version"), status.get("version_id")
            if not isinstance(version, int) or not isinstance(aid, str) or not current < version <= 10**9:
                return None  # (an older coordinator sends no id: no rebase)
            if not layout.is_commit_id(aid):  # a coordinator's word never names a folder unchecked
                log.warning(
                    "rebase: the coordinator's version_id %r is not an adapter id; staying on v%d", aid[:80], current
                )
                return None
            folder = self.client.adapter(version, aid, self.cache, self.max_bytes)
            self.ids[version] = aid
            return version, folder
        except (HubGrpoError, OSError) as e:
            log.info("rebase: could not read the newest version (%s); staying on v%d", e, current)
            return None
