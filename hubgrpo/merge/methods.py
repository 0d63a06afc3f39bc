"""Per-module merge methods with the outer optimizer (DiLoCo-style SGD with momentum / Nesterov).

Notation, per module (all in ΔW = s·B·A space): the outer "gradient" is the weighted mean update
``g = Σᵢ cᵢ·(ΔWᵢ − ΔW_base(i))`` (Σ cᵢ = 1 unless clipped); the global moves by
``ΔW′ = ΔW_G + lr·step`` with ``step = g`` (no momentum), ``step = m′`` (momentum, ``m′ = μ·m + g``) or
``step = g + μ·m′`` (Nesterov) — PyTorch's SGD convention, which is DiLoCo's outer optimizer with the sign
flipped (our g points towards the workers). With ``momentum_every`` k > 1 (delayed Nesterov, Liu et al. 2024,
asynchronous Local-SGD for language models) the momentum is updated once every k merges, with the mean of their
k outer gradients (kept in a buffer meanwhile), and the merges in between step by their own ``g``: with k
asynchronous workers the momentum then accelerates about once per round of the fleet instead of once per
submission.

- ``lowrank_module`` (methods ``svd`` and ``stack``): the new ΔW is a sum of rank-r terms, kept implicit.
  ``svd`` re-factorises it to the global's rank (exact or randomized, see ``lowrank``); ``stack`` (FLoRA)
  concatenates the scaled factors — exact, rank r′ = Σ term ranks — and falls back to ``svd`` at ``max_rank``.
  The momentum buffer ``m`` lives in ΔW space but is stored factored, ``m = B_m·A_m`` (scale 1), and is
  re-truncated to ``momentum_rank`` (default 2r) after each update with the same algorithm: it is exact while
  rank(μ·m + g) ≤ momentum_rank, otherwise the best rank-``momentum_rank`` approximation of it (exact path) —
  the error is reported as ``momentum_residual`` (the delayed-Nesterov buffer is kept and truncated likewise; at
  the merges in between, its residual is the one reported).
- ``ffa_module`` (FFA-LoRA): A is frozen and shared, so ``g = (Σ cᵢ sᵢ Bᵢ / s_G) · A``; B is averaged exactly
  and the momentum buffer is kept exactly in B space (``out × r``).
- ``naive_module``: factor averaging ``B′ = B_G + lr·Σ cᵢ (Bᵢ − B_base(i))``, likewise A — only a benchmark
  baseline: ``B̄·Ā ≠ mean(Bᵢ·Aᵢ)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from hubgrpo.errors import MergeError
from hubgrpo.merge.adapter import Adapter, ModuleSpec, factors
from hubgrpo.merge.lowrank import LowRankSum, Term, refactor

if TYPE_CHECKING:
    from hubgrpo.merge.core import MergeOptions  # core imports this module


@dataclass
class Context:
    """What every module merge needs: distinct adapters (index 0 is the current global), their specs, the
    outer-gradient coefficients ``g`` and the collapsed no-momentum coefficients ``final`` over those adapters."""

    adapters: list[Adapter]
    specs: list[dict[str, ModuleSpec]]
    g: dict[int, float]
    final: dict[int, float]
    options: MergeOptions
    momentum: dict[str, torch.Tensor] = field(default_factory=dict)
    buffered: int = 0  # delayed Nesterov: merges whose outer gradients are in the buffer

    def terms(self, coefs: dict[int, float], prefix: str) -> list[Term]:
        """``[(c_t·s_t, B_t, A_t)]`` for module ``prefix`` of each adapter with a non-zero coefficient."""
        out = []
        for idx, coef in coefs.items():
            if coef != 0.0:
                spec = self.specs[idx][prefix]
                out.append((coef * spec.scaling, *factors(self.adapters[idx], spec)))
        return out

    def generator(self, index: int) -> torch.Generator:
        return torch.Generator().manual_seed(int(self.options.seed) * 1_000_003 + index)


@dataclass
class ModuleResult:
    """New factors of one module. ``global_units``: already for the global's scaling (ffa, naive); otherwise
    ``B·A`` is the whole ΔW (scale 1) and the writer folds the output scaling in."""

    B: torch.Tensor
    A: torch.Tensor
    algorithm: str
    tail_sq: float = 0.0
    total_sq: float | None = None
    estimated: bool = False
    global_units: bool = False
    momentum: dict[str, torch.Tensor] = field(default_factory=dict)
    momentum_residual: float | None = None


def _randomized_kw(o) -> dict:
    return {"oversample": o.oversample, "passes": o.passes, "probes": o.probes}


def _stored(ctx: Context, prefix: str, name: str, coef: float = 1.0) -> list[Term]:
    """The stored factored state ``name`` (momentum or buffer) of a module as terms, [] when absent."""
    key = f"{prefix}.{name}_B"
    return [(coef, ctx.momentum[key], ctx.momentum[f"{prefix}.{name}_A"])] if key in ctx.momentum else []


def _momentum_step(ctx: Context, prefix: str, g: list[Term], gen: torch.Generator, dims: tuple[int, int]):
    """The outer step with momentum; returns (step terms, new state tensors, truncation residual of the state).

    Every merge (``momentum_every`` 1): ``m′ = μ·m + g`` re-truncated to ``momentum_rank``, step ``m′`` or
    ``g + μ·m′``. Delayed Nesterov (``momentum_every`` k > 1, Liu et al. 2024): the merges in between step by
    ``g`` and add it to a buffer; every k-th updates ``m′ = μ·m + mean(buffered g's)`` and steps by
    ``g + μ·m′`` (Nesterov) or ``g + μ·m``."""
    o, spec = ctx.options, ctx.specs[0][prefix]
    rank, kw = o.momentum_rank or 2 * spec.rank, _randomized_kw(o)
    k = o.momentum_every

    def truncate(terms: list[Term]):
        return refactor(LowRankSum.from_terms(terms, *dims), rank, o.svd_algorithm, gen, **kw)

    def state(name: str, f) -> dict[str, torch.Tensor]:
        return {f"{prefix}.{name}_B": f.B.contiguous(), f"{prefix}.{name}_A": f.A.contiguous()}

    n = ctx.buffered
    if k <= 1 and n == 0:  # every merge
        fm = truncate(g + _stored(ctx, prefix, "momentum", o.outer_momentum))
        step = [(1.0, fm.B, fm.A)] if not o.nesterov else g + [(o.outer_momentum, fm.B, fm.A)]
        return step, state("momentum", fm), fm.residual
    if n + 1 < k:  # in between: plain step, g joins the buffer
        kept = {key: v for key, v in ctx.momentum.items() if key.startswith(prefix + ".momentum_")}
        fb = truncate(g + _stored(ctx, prefix, "buffer"))
        return g, {**kept, **state("buffer", fb)}, fb.residual
    # the momentum update: the mean of the n buffered gradients and this one (n + 1 = k unless k was lowered)
    mean = [(c / (n + 1), b, a) for c, b, a in g + _stored(ctx, prefix, "buffer")]
    old = _stored(ctx, prefix, "momentum", o.outer_momentum)
    fm = truncate(mean + old)
    step = g + ([(o.outer_momentum, fm.B, fm.A)] if o.nesterov else old)
    return step, state("momentum", fm), fm.residual


def lowrank_module(ctx: Context, prefix: str, index: int) -> ModuleResult:
    """``svd`` / ``stack`` for one module: ΔW′ = ΔW_G + lr·step as an implicit low-rank sum, then factors."""
    o, spec = ctx.options, ctx.specs[0][prefix]
    gen, dims = ctx.generator(index), (spec.out_dim, spec.in_dim)
    momentum, mom_res = {}, None
    if o.outer_momentum > 0:
        step, momentum, mom_res = _momentum_step(ctx, prefix, ctx.terms(ctx.g, prefix), gen, dims)
        final = ctx.terms({0: 1.0}, prefix) + [(o.outer_lr * c, b, a) for c, b, a in step]
    else:
        final = ctx.terms(ctx.final, prefix)  # {G: 1} + lr·g with the fresh bases collapsed into G
    m = LowRankSum.from_terms(final, *dims)  # ΔW′ = B·diag(c)·A, (out × R)·(R × in)
    total_rank = m.shape[2]
    stacks = o.merge_method.stacks
    if stacks and 0 < total_rank and (o.max_rank is None or total_rank <= o.max_rank):
        return ModuleResult(m.b_cat() * m.c, m.A, "stack", momentum=momentum, momentum_residual=mom_res)
    target = o.max_rank if stacks and o.max_rank else (o.rank or spec.rank)
    f = refactor(m, target, o.svd_algorithm, gen, **_randomized_kw(o))
    return ModuleResult(
        f.B, f.A, f.algorithm, f.tail_sq, f.total_sq, f.estimated, momentum=momentum, momentum_residual=mom_res
    )


def _b_step(ctx: Context, coefs: dict[int, float], prefix: str) -> torch.Tensor:
    """``Σ_t c_t·(s_t / s_G)·B_t`` (out × r): a ΔW-space combination expressed in the global's B units."""
    s_g = ctx.specs[0][prefix].scaling
    out = torch.zeros_like(factors(ctx.adapters[0], ctx.specs[0][prefix])[0])
    for idx, coef in coefs.items():
        spec = ctx.specs[idx][prefix]
        out += (coef * spec.scaling / s_g) * factors(ctx.adapters[idx], spec)[0]
    return out


def _require_equal_rank(ctx: Context, prefix: str, method: str) -> None:
    ranks = {ctx.specs[idx][prefix].rank for idx in ctx.g} | {ctx.specs[0][prefix].rank}
    if len(ranks) > 1:
        raise MergeError(
            f"method {method!r} needs one rank per module, but {prefix} has ranks {sorted(ranks)}",
            hint="use method 'svd' or 'stack' to merge adapters of different ranks",
        )


def ffa_module(ctx: Context, prefix: str, index: int) -> ModuleResult:
    """FFA-LoRA: exact mean of B with the shared frozen A; momentum kept exactly in B space."""
    o, spec = ctx.options, ctx.specs[0][prefix]
    _require_equal_rank(ctx, prefix, "ffa")
    a_g = ctx.adapters[0].weights[spec.key_a]
    for idx in ctx.g:
        if not torch.equal(ctx.adapters[idx].weights[ctx.specs[idx][prefix].key_a], a_g):
            raise MergeError(
                f"method 'ffa' needs A frozen and shared, but {spec.path} has a different lora_A "
                "than the global adapter",
                hint="freeze lora_A in the workers or use method 'svd'",
            )
    b_g, a = factors(ctx.adapters[0], spec)
    g_b = _b_step(ctx, ctx.g, prefix)  # (out × r), g = g_b·A in the global's scaling
    b, momentum = ffa_outer_step(b_g, g_b, ctx.momentum, prefix, o, ctx.buffered)
    return ModuleResult(b, a, "ffa", global_units=True, momentum=momentum)


def ffa_outer_step(
    b_g: torch.Tensor, g_b: torch.Tensor, momentum: dict, prefix: str, o, buffered: int = 0
) -> tuple[torch.Tensor, dict]:
    """The new B of an FFA module, ``B_G + lr·step``, and its new state entries (empty without momentum): the
    same outer steps as ``_momentum_step`` (``buffered``: merges already in the delayed-Nesterov buffer), kept
    exactly in B space."""
    if o.outer_momentum <= 0:
        return b_g + o.outer_lr * g_b, {}
    mu, k, n = o.outer_momentum, o.momentum_every, buffered
    prev, buf = momentum.get(prefix + ".momentum_B"), momentum.get(prefix + ".buffer_B")
    old = mu * prev if prev is not None else 0.0
    if k <= 1 and n == 0:  # every merge
        m_b = g_b + old
        return b_g + o.outer_lr * (m_b if not o.nesterov else g_b + mu * m_b), {
            prefix + ".momentum_B": m_b.contiguous()
        }
    buf_sum = g_b + (buf if buf is not None else 0.0)
    if n + 1 < k:  # in between
        kept = {prefix + ".momentum_B": prev} if prev is not None else {}
        return b_g + o.outer_lr * g_b, {**kept, prefix + ".buffer_B": buf_sum.contiguous()}
    m_b = buf_sum / (n + 1) + old
    step = g_b + (mu * m_b if o.nesterov else old)
    return b_g + o.outer_lr * step, {prefix + ".momentum_B": m_b.contiguous()}


def naive_module(ctx: Context, prefix: str, index: int) -> ModuleResult:
    """Factor averaging (baseline only): B and A each move by lr·Σ cᵢ (Xᵢ − X_base(i))."""
    o, spec = ctx.options, ctx.specs[0][prefix]
    _require_equal_rank(ctx, prefix, "naive")
    b_g, a_g = factors(ctx.adapters[0], spec)
    step_a = torch.zeros_like(a_g)
    for idx, coef in ctx.g.items():
        step_a += coef * factors(ctx.adapters[idx], ctx.specs[idx][prefix])[1]
    b = b_g + o.outer_lr * _b_step(ctx, ctx.g, prefix)
    return ModuleResult(b, a_g + o.outer_lr * step_a, "naive", global_units=True)


METHODS = {"svd": lowrank_module, "stack": lowrank_module, "ffa": ffa_module, "naive": naive_module}
