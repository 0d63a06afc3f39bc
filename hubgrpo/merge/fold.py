"""FFA merges folded in one submission at a time, so that little work is left when a quorum completes.

With FFA-LoRA every adapter shares the global's frozen A, so the outer gradient is linear in the B factors:
``g_B = Σᵢ wᵢ·(sᵢ·Bᵢ − s_base(i)·B_base(i)) / (s_G·Σᵢ wᵢ)``. ``FfaFold`` keeps the running weighted sum and the
raw weights per submission id; a coordinator folds each admitted submission in as it arrives (off the request
path) and ``result`` finishes the merge with one division and the outer step per module — the same new adapter
as ``merge(..., MergeOptions(method="ffa"))`` on the same submissions, up to float32 summation order.

``result`` answers None (the caller runs the full ``merge``) whenever the fold cannot stand for it: other
submissions or weights than were folded, robust options (clipping and trimming need every norm first), another
method, or a fold that failed its compatibility checks (the full merge then raises the error itself).
"""

from __future__ import annotations

import time

import torch

from hubgrpo.config.methods import merge_method
from hubgrpo.errors import MergeError
from hubgrpo.merge.adapter import Adapter, factors, parse_modules
from hubgrpo.merge.frozen_a import same
from hubgrpo.merge.methods import ffa_outer_step

FFA = merge_method("ffa")  # the method whose merge a fold stands for


class FfaFold:
    """Running ``Σ wᵢ·(sᵢ·Bᵢ − s_base·B_base)/s_G`` per module against the global adapter of ``version``."""

    def __init__(self, global_: Adapter, version: int):
        self.global_, self.version = global_, version
        self._g = parse_modules(global_)
        self.specs = self._g[0]
        self.sums = {p: torch.zeros(s.out_dim, s.rank) for p, s in self.specs.items()}
        self.weights: dict[str, float] = {}
        self.broken: str | None = None  # why the fold cannot stand for the merge (the full merge reports it)
        self.fold_s = 0.0  # seconds spent folding

    def add(self, sub_id: str, submission: Adapter, base: Adapter, weight: float) -> None:
        """Fold one submission (trained from ``base``) in with raw weight ``weight``; idempotent per id."""
        if sub_id in self.weights or self.broken:
            return
        from hubgrpo.merge.core import _check_compatible

        start = time.perf_counter()
        try:
            sub_specs = _check_compatible(self._g, self.global_, submission, f"submission {sub_id}")
            base_specs = (
                self.specs
                if base is self.global_
                else _check_compatible(self._g, self.global_, base, f"base of {sub_id}")
            )
            for prefix, spec in self.specs.items():
                ss, bs = sub_specs[prefix], base_specs[prefix]
                a_g = self.global_.weights[spec.key_a]
                if (
                    ss.rank != spec.rank
                    or not same(submission.weights[ss.key_a], a_g)
                    or not same(base.weights[bs.key_a], a_g)
                ):
                    raise MergeError(f"method 'ffa' needs A frozen and shared, but {spec.path} differs")
            for prefix, spec in self.specs.items():
                b_sub, b_base = factors(submission, sub_specs[prefix])[0], factors(base, base_specs[prefix])[0]
                self.sums[prefix].add_(b_sub, alpha=weight * sub_specs[prefix].scaling / spec.scaling)
                self.sums[prefix].add_(b_base, alpha=-weight * base_specs[prefix].scaling / spec.scaling)
        except MergeError as e:
            self.broken = e.message
            return
        finally:
            self.fold_s += time.perf_counter() - start
        self.weights[sub_id] = float(weight)

    def result(self, weights: dict[str, float], options, momentum: dict | None = None):
        """The merge of exactly ``weights`` (submission id → raw weight, as folded) with ``options``; None when
        the fold does not stand for that merge."""
        from hubgrpo.merge.core import MergeResult, _check_momentum, build_report, with_count

        o = options
        if (
            self.broken
            or o.merge_method is not FFA
            or not FFA.foldable(o.clip_factor, o.trim_fraction)
            or weights != self.weights
            or not weights
        ):
            return None
        start = time.perf_counter()
        total = sum(weights.values())
        mom, buffered = _check_momentum(momentum, self.specs, FFA) if o.outer_momentum > 0 else ({}, 0)
        new, new_momentum = dict(self.global_.weights), {}
        for prefix, spec in self.specs.items():
            b, m = ffa_outer_step(factors(self.global_, spec)[0], self.sums[prefix] / total, mom, prefix, o, buffered)
            new_momentum.update(m)
            new[spec.key_b] = b.to(self.global_.weights[spec.key_b].dtype).contiguous()
        if o.outer_momentum > 0:
            with_count(new_momentum, buffered, o)
        adapter = Adapter(weights=new, config=dict(self.global_.config))
        robust = {"weights": [w / total for w in weights.values()], "clipped": 0, "trimmed": 0, "clip_bound": None}
        report = build_report(o, self.specs, {}, robust, None, len(weights), time.perf_counter() - start)
        report.update(
            algorithm="ffa",
            algorithm_counts={"ffa": len(self.specs)},
            merged=len(weights),
            folded=True,
            fold_seconds=round(self.fold_s, 4),
            update_norm=_b_norm(self, adapter),
        )
        report["seconds"] = round(time.perf_counter() - start, 4)
        return MergeResult(adapter, new_momentum or None, report)


def _b_norm(fold: FfaFold, new: Adapter) -> float:
    """``‖ΔW_new − ΔW_G‖_F`` = ``‖s·(B′ − B)·A‖`` per module, from the r × r Grams (A is shared)."""
    total = 0.0
    for spec in fold.specs.values():
        b_new, a = factors(new, spec)
        d = (b_new - factors(fold.global_, spec)[0]).double() * spec.scaling
        total += float(((d.T @ d) * (a.double() @ a.double().T)).sum())
    return max(total, 0.0) ** 0.5
