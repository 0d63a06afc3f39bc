"""Simulations without a model: a round engine whose adapters are drawn from the lease (``FakeSimEngine``), and
the part of a result that a seed decides (``deterministic_part``)."""

from __future__ import annotations

from pathlib import Path

from hubgrpo import layout
from tests.support.coord_helpers import submission_record, write_adapter, write_rollouts


class FakeSimEngine:
    """The round engine's interface without a model: adapters drawn from the lease, a score from the adapter."""

    def __init__(self, cfg=None):
        self.rounds, self.cfg, self.offers = [], cfg, []

    def init_adapter(self, out: Path) -> Path:
        return write_adapter(Path(out), seed=0, b_scale=0.0)

    def run_round(self, base: Path, lease, folder: Path, optimizer_key: str | None = None, rebase=None):
        from safetensors.torch import load_file, save_file

        self.rounds.append((lease.worker, lease.base_version))
        moved = None
        on = bool(rebase and self.cfg.merge.rebase)
        for done in range(lease.steps if on else 0):  # as the engine offers them: after each step's generation
            offers = [(done, True)] if self.cfg.merge.rebase_after_generation else []  # (before its backward),
            offers += [(done + 1, False)] if done + 1 < lease.steps else []  # then after the step (not the last)
            for step, generated in offers:
                found = (
                    rebase(step, moved or lease.base_version, generated=True)
                    if generated
                    else rebase(step, moved or lease.base_version)
                )
                if found is not None:
                    moved, base = found
                    self.offers.append((lease.lease_id, step + (0.5 if generated else 0.0), moved))
        start = load_file(Path(base) / layout.ADAPTER_WEIGHTS)  # trained from the leased (or moved-onto) version
        write_adapter(folder, seed=int(lease.lease_id[1:]) + 1, b_scale=0.01)
        delta = load_file(folder / layout.ADAPTER_WEIGHTS)
        save_file(
            {k: start[k] + delta[k] if "lora_B" in k else start[k] for k in start}, str(folder / layout.ADAPTER_WEIGHTS)
        )
        (folder / layout.ADAPTER_CONFIG).write_bytes((Path(base) / layout.ADAPTER_CONFIG).read_bytes())
        sub = submission_record(lease).model_copy(update={"rebased_version": moved})
        write_rollouts(folder, lease, self.cfg)
        (folder / layout.SUBMISSION_FILE).write_bytes(sub.to_json())
        return sub

    def evaluate(self, folder: Path | None = None, n: int = 16, **kw) -> float:
        from safetensors.torch import load_file

        weights = load_file(Path(folder) / layout.ADAPTER_WEIGHTS)
        return float(sum(v.abs().sum() for k, v in weights.items() if "lora_B" in k))

    def load_adapter(self, folder) -> None:
        pass


def deterministic_part(result: dict) -> dict:
    return {k: v for k, v in result.items() if k != "compute"}
