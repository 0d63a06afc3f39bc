"""``merge``: validate, weight, combine and write one new global adapter. See ``hubgrpo.merge`` for the API."""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from hubgrpo.config.merge_section import OUTER_LR_MAX
from hubgrpo.config.methods import BY_NAME, MergeMethod
from hubgrpo.errors import MergeError
from hubgrpo.merge.adapter import Adapter, ModuleSpec, factors, parse_modules
from hubgrpo.merge.lowrank import difference_sq_norm, pad_rank
from hubgrpo.merge.methods import METHODS, Context, ModuleResult
from hubgrpo.merge.robust import robust_coefficients, update_norm

_ZERO = 1e-12  # coefficients this small after collapsing (e.g. 1 − Σcᵢ) are exact zeros


class MergeOptions(BaseModel):
    """How to merge. Defaults: exact weighted mean of the updates, plain outer step (lr 1, no momentum)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    method: Literal["svd", "stack", "ffa", "naive"] = "svd"
    outer_lr: float = Field(1.0, gt=0, le=OUTER_LR_MAX, description="outer learning rate (DiLoCo: 0.7)")
    outer_momentum: float = Field(0.0, ge=0, lt=1, description="outer SGD momentum μ (DiLoCo: 0.9)")
    nesterov: bool = Field(False, description="Nesterov momentum: step = g + μ·m′")
    momentum_every: int = Field(
        1,
        ge=1,
        le=1024,
        description="delayed Nesterov (Liu et al. 2024): update the "
        "momentum every k merges with the mean of their outer gradients; plain steps between",
    )
    rank: int | None = Field(None, ge=1, description="svd: output rank (None = the global's rank per module)")
    max_rank: int | None = Field(None, ge=1, description="stack: rank limit; beyond it, svd to max_rank")
    momentum_rank: int | None = Field(None, ge=1, description="rank of the stored momentum (None = 2·r)")
    clip_factor: float | None = Field(None, gt=0, description="clip ‖uᵢ‖ to clip_factor × median norm")
    trim_fraction: float = Field(0.0, ge=0, lt=0.5, description="drop this fraction of smallest/largest norms")
    svd_algorithm: Literal["auto", "exact", "randomized"] = "auto"
    oversample: int = Field(5, ge=0, description="randomized: extra sketch columns (l = rank + oversample)")
    passes: int = Field(3, ge=2, description="randomized: products with the factors (4 = one power iteration)")
    probes: int = Field(4, ge=0, description="randomized: Gaussian probes estimating the missed energy")
    seed: int = Field(0, description="seed of the randomized sketches and of re-initialised dead A rows")
    compute_norms: bool = Field(False, description="report every update's exact norm (always on with clip/trim)")
    factor_split: Literal["balanced", "keep_a"] = Field(
        "balanced",
        description="how a re-factorised ΔW is split into B and A: balanced (√ of each singular value "
        "on each side) or keep_a (A rows keep the global A's norm, B carries the magnitude)",
    )

    @property
    def merge_method(self) -> MergeMethod:
        """The ``MergeMethod`` that ``method`` names (``hubgrpo.config.methods``)."""
        return BY_NAME[self.method]


@dataclass
class MergeResult:
    """The new global ``adapter``, the outer ``momentum`` state (None without momentum; save it as safetensors
    and pass it back next time) and a JSON-serialisable ``report``."""

    adapter: Adapter
    momentum: dict[str, torch.Tensor] | None
    report: dict


def _same_weights(a: Adapter, b: Adapter) -> bool:
    return a is b or (
        a.weights.keys() == b.weights.keys() and all(torch.equal(a.weights[k], b.weights[k]) for k in a.weights)
    )


def _check_compatible(
    g: tuple[dict[str, ModuleSpec], list[str]], global_: Adapter, other: Adapter, what: str
) -> dict[str, ModuleSpec]:
    """Specs of ``other`` after checking it has the global's modules, dims, orientation and frozen tensors."""
    gspecs, gpass = g
    specs, passthrough = parse_modules(other)
    if specs.keys() != gspecs.keys():
        diff = sorted(specs.keys() ^ gspecs.keys())
        raise MergeError(
            f"{what} targets other modules than the global adapter (differing: {diff[:3]}…)",
            hint="submissions must be trained from the global adapter's LoRA config",
        )
    for prefix, spec in specs.items():
        gs = gspecs[prefix]
        if (spec.kind, spec.out_dim, spec.in_dim) != (gs.kind, gs.out_dim, gs.in_dim):
            raise MergeError(
                f"{what}: module {spec.path} is {spec.kind} {spec.out_dim}×{spec.in_dim}, the global's "
                f"is {gs.kind} {gs.out_dim}×{gs.in_dim}",
                hint="was it trained on another base model?",
            )
    if bool(other.config.get("fan_in_fan_out")) != bool(global_.config.get("fan_in_fan_out")):
        raise MergeError(f"{what} and the global adapter disagree on fan_in_fan_out")
    if passthrough != gpass or any(not torch.equal(other.weights[k], global_.weights[k]) for k in gpass):
        raise MergeError(
            f"{what} changes a frozen base weight saved with the adapter ({gpass or passthrough})",
            hint="frozen base weights must equal the global adapter's",
        )
    return specs


def gradient_coefficients(global_: Adapter, items: list, coefs: list[float]) -> tuple[list[Adapter], dict]:
    """``g = Σᵢ cᵢ·(Xᵢ − X_base(i))`` as coefficients over distinct adapters; index 0 is the global, and a base
    with the global's weights (a fresh submission) is counted as the global so that ``1 + lr·g₀`` can cancel."""
    adapters, g = [global_], {}
    bases: dict[int, int] = {id(global_): 0}
    base_slots = [0]
    for (sub, base, _), c in zip(items, coefs):
        if c == 0.0:
            continue
        adapters.append(sub)
        g[len(adapters) - 1] = c
        if id(base) not in bases:
            match = next((j for j in base_slots if _same_weights(adapters[j], base)), None)
            if match is None:
                adapters.append(base)
                match = len(adapters) - 1
                base_slots.append(match)
            bases[id(base)] = match
        g[bases[id(base)]] = g.get(bases[id(base)], 0.0) - c
    return adapters, g


def _momentum_fits(key: str, value: torch.Tensor, spec: ModuleSpec, in_b_space: bool) -> bool:
    """ffa (A frozen) keeps m in B space (out × r); svd/stack keep m = B_m·A_m with B_m (out × k), A_m (k × in)."""
    if not value.is_floating_point() or not bool(torch.isfinite(value).all()):
        return False
    if in_b_space:
        return tuple(value.shape) == (spec.out_dim, spec.rank)
    if value.dim() != 2:
        return False
    return value.shape[0] == spec.out_dim if key.endswith("_B") else value.shape[1] == spec.in_dim


BUFFERED_KEY = "delayed_nesterov.buffered"  # scalar in the momentum state: merges in the buffer


def _count(value: torch.Tensor | None) -> int | None:
    """The buffered-merge count of a state, None when it is not a non-negative int32/int64 scalar."""
    if value is None:
        return 0
    if value.dtype not in (torch.int32, torch.int64) or value.numel() != 1 or not 0 <= int(value) < 1 << 20:
        return None
    return int(value)


def _check_momentum(momentum: dict | None, specs: dict[str, ModuleSpec], method: MergeMethod) -> tuple[dict, int]:
    """The caller's momentum state as float32 tensors and the count of merges in its delayed-Nesterov buffer,
    after checking it was written for this method and layout: finite float factors; the momentum and the buffer
    each present for every module or for none (B and A of one rank), the buffer exactly when the count is positive."""
    if not momentum:
        return {}, 0
    state = dict(momentum)
    count = _count(state.pop(BUFFERED_KEY, None))
    sides, in_b_space = method.momentum_sides(), method.frozen_a
    groups = {
        name: {f"{p}.{name}{side}": spec for p, spec in specs.items() for side in sides}
        for name in ("momentum", "buffer")
    }
    present = [g for g in groups.values() if set(g) & set(state)]
    ok = (
        count is not None
        and set(state) == {k for g in present for k in g}
        and bool(count) == bool(set(groups["buffer"]) & set(state))
        and all(_momentum_fits(k, v, g[k], in_b_space) for g in present for k, v in state.items() if k in g)
        and (
            in_b_space
            or all(
                state[f"{p}.{name}_B"].shape[1] == state[f"{p}.{name}_A"].shape[0]
                for name, g in groups.items()
                if g in present
                for p in specs
            )
        )
    )
    if not ok or count is None:  # (``ok`` holds only with a count)
        raise MergeError(
            f"the momentum state does not belong to method {method.name!r} and this adapter layout",
            hint="pass momentum=None to restart the outer momentum after changing method or layout",
        )
    return {k: v.float() for k, v in state.items()}, count


def with_count(new_momentum: dict, buffered: int, o: MergeOptions) -> dict:
    """The state after a merge that found ``buffered`` merges in the buffer: the count goes with it (k > 1)."""
    if o.momentum_every > 1:
        after = buffered + 1 if buffered + 1 < o.momentum_every else 0
        new_momentum[BUFFERED_KEY] = torch.tensor(after, dtype=torch.int64)
    return new_momentum


def merge(
    global_: Adapter,
    items: list[tuple[Adapter, Adapter, float]],
    options: MergeOptions | None = None,
    momentum: dict[str, torch.Tensor] | None = None,
) -> MergeResult:
    """New global adapter from ``items = [(submission, its base adapter, weight)]``; see the package docstring."""
    o = options or MergeOptions()
    start = time.perf_counter()
    g = parse_modules(global_)
    spec_cache: dict[int, dict[str, ModuleSpec]] = {id(global_): g[0]}

    def specs_of(adapter: Adapter, what: str) -> dict[str, ModuleSpec]:
        if id(adapter) not in spec_cache:
            spec_cache[id(adapter)] = _check_compatible(g, global_, adapter, what)
        return spec_cache[id(adapter)]

    pairs = [
        (specs_of(s, f"submission {i}"), specs_of(b, f"base of submission {i}")) for i, (s, b, _) in enumerate(items)
    ]
    if o.outer_momentum > 0 and not o.merge_method.outer_momentum:
        raise MergeError(f"method {o.method!r} has no outer momentum", hint="use method 'svd' or set outer_momentum=0")
    norms = None
    if o.compute_norms or o.clip_factor is not None or o.trim_fraction > 0:
        norms = [update_norm(s, ss, b, bs) for (s, b, _), (ss, bs) in zip(items, pairs)]
    coefs, robust = robust_coefficients([float(w) for _, _, w in items], norms, o.clip_factor, o.trim_fraction)
    adapters, grad = gradient_coefficients(global_, items, coefs)
    final = {0: 1.0}
    for idx, c in grad.items():
        final[idx] = final.get(idx, 0.0) + o.outer_lr * c
    final = {idx: c for idx, c in final.items() if abs(c) > _ZERO}
    # buffered ≥ k − 1 when k was lowered since: the momentum is updated now
    state, buffered = _check_momentum(momentum, g[0], o.merge_method) if o.outer_momentum > 0 else ({}, 0)
    ctx = Context(adapters, [spec_cache[id(a)] for a in adapters], grad, final, o, state, buffered)
    fn = METHODS[o.method]
    results = {prefix: fn(ctx, prefix, i) for i, prefix in enumerate(g[0])}
    adapter = assemble(global_, g[0], results, ctx)
    new_momentum = (
        with_count({k: v for r in results.values() for k, v in r.momentum.items()}, buffered, o)
        if o.outer_momentum > 0
        else None
    )
    report = build_report(o, g[0], results, robust, norms, len(items), time.perf_counter() - start)
    report["update_norm"] = applied_update_norm(global_, g[0], adapter)
    report["seconds"] = round(time.perf_counter() - start, 4)
    return MergeResult(adapter, new_momentum, report)


def assemble(global_: Adapter, specs: dict[str, ModuleSpec], results: dict[str, ModuleResult], ctx: Context) -> Adapter:
    """Write factors under PEFT's keys. Ranks unchanged: keep the global's config (r, alpha, patterns) and fold
    1/s into the factors (balanced, √s each, for refactored ones). Ranks changed (stack, or ``rank``): pad every
    module to r′ = max rank (zero B columns, fresh A rows) and write ``r = lora_alpha = r′``, no rsLoRA, no
    patterns, so that s = 1 and the factors carry the whole ΔW."""
    ranks = {p: r.A.shape[0] for p, r in results.items()}
    keep = all(ranks[p] == s.rank for p, s in specs.items())
    config = copy.deepcopy(global_.config)
    r_out = max(ranks.values()) if ranks else int(config.get("r", 8))
    if not keep:
        config.update(r=r_out, lora_alpha=r_out, use_rslora=False, rank_pattern={}, alpha_pattern={})
    weights = {k: v.clone() for k, v in global_.weights.items() if k.endswith(".base_layer.weight")}
    for i, (prefix, spec) in enumerate(specs.items()):
        res = results[prefix]
        b, a = res.B, res.A
        if keep and not res.global_units:
            if res.algorithm == "stack":
                b = b / spec.scaling
            elif ctx.options.factor_split == "keep_a":
                b, a = split_keep_a(b, a, factors(global_, spec)[1], spec.scaling)
            else:
                root = spec.scaling**0.5
                b, a = b / root, a / root
        elif not keep:
            b, a = pad_rank(b, a, r_out, ctx.generator(10_000 + i))
        weights[spec.key_b] = b.to(global_.weights[spec.key_b].dtype).contiguous()
        weights[spec.key_a] = a.to(global_.weights[spec.key_a].dtype).contiguous()
    return Adapter(weights=weights, config=config)


def split_keep_a(b: torch.Tensor, a: torch.Tensor, a_global: torch.Tensor, scaling: float):
    """Factors of ``b·a`` (= ΔW) stored with LoRA scaling ``s`` whose A rows keep the global A's median row norm
    (B carries the magnitude, as after LoRA's init): a balanced split would shrink A with a small ΔW, and the
    gradient of B is proportional to A — the next round would learn slowly. Each rank-one term is rescaled, so
    ``s·B′·A′ = b·a`` exactly."""
    alpha = float(a_global.float().norm(dim=1).median()) if a_global.numel() else 0.0
    norms = a.norm(dim=1)
    if alpha <= 0 or not bool((norms > 0).all()):
        root = scaling**0.5
        return b / root, a / root
    f = alpha / norms  # (k,)
    return b / f[None, :] / scaling, a * f[:, None]


def applied_update_norm(
    global_: Adapter, specs: dict[str, ModuleSpec], new: Adapter, max_rank: int = 256
) -> float | None:
    """Exact ``‖ΔW_new − ΔW_G‖_F`` over all modules (the step actually applied, after truncation), from Gram
    matrices of rank r_new + r_G; None when that rank exceeds ``max_rank`` (large ``stack`` outputs)."""
    new_specs, _ = parse_modules(new)
    total = 0.0
    for prefix, spec in specs.items():
        ns = new_specs[prefix]
        if ns.rank + spec.rank > max_rank:
            return None
        total += difference_sq_norm(ns.scaling, *factors(new, ns), spec.scaling, *factors(global_, spec))
    return max(total, 0.0) ** 0.5


def build_report(
    o: MergeOptions,
    specs: dict[str, ModuleSpec],
    results: dict[str, ModuleResult],
    robust: dict,
    norms: list[float] | None,
    n_items: int,
    seconds: float,
) -> dict:
    """JSON report: residual ‖ΔW − B′A′‖/‖ΔW‖ per module (0 where nothing was truncated: stack, ffa; naive's
    factor-averaging error is not measured) and overall over the re-factorised modules."""
    per_module: dict[str, float] = {}
    algorithms: dict[str, int] = {}
    tail = total = 0.0
    for prefix, res in results.items():
        algorithms[res.algorithm] = algorithms.get(res.algorithm, 0) + 1
        res_value = 0.0
        if res.total_sq is not None:
            tail, total = tail + res.tail_sq, total + res.total_sq
            res_value = (res.tail_sq / res.total_sq) ** 0.5 if res.total_sq > 0 else 0.0
        per_module[specs[prefix].path] = res_value
    mom = [r.momentum_residual for r in results.values() if r.momentum_residual is not None]
    return {
        "method": o.method,
        "algorithm": "+".join(sorted(algorithms)),
        "algorithm_counts": algorithms,
        "residual": (tail / total) ** 0.5 if total > 0 else 0.0,
        "residual_estimated": any(r.estimated for r in results.values()),
        "residual_per_module": per_module,
        "merged": sum(1 for w in robust["weights"] if w > 0),
        "submitted": n_items,
        "clipped": robust["clipped"],
        "trimmed": robust["trimmed"],
        "clip_bound": robust["clip_bound"],
        "weights": robust["weights"],
        "update_norms": norms,
        "outer_lr": o.outer_lr,
        "outer_momentum": o.outer_momentum,
        "nesterov": o.nesterov,
        "momentum_every": o.momentum_every,
        "momentum_residual": max(mom) if mom else None,
        "seconds": round(seconds, 4),
    }
