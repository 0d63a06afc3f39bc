"""Low-rank linear algebra for merging, never forming an ``out × in`` matrix.

A module's merged delta is a sum of scaled rank-r_k products, held implicitly as

    M = B · diag(c) · A        B: (out × R) stacked B_k,  A: (R × in) stacked A_k,  c: (R,) per-row coefficient

and re-factorised to rank k as balanced factors ``B′ = U_k·√S_k`` (out × k), ``A′ = √S_k·V_kᵀ`` (k × in):

- ``refactor_exact``: QR of both stacks, SVD of the small ``R × R`` core — the optimal rank-k truncation,
  O((out+in)·R²). The residual ``Σ_{j>k} S_j²`` is exact.
- ``refactor_randomized``: Halko–Martinsson–Tropp randomized SVD of the implicit product (Gaussian sketch of
  ``l = k + oversample`` columns, ``passes`` products with the factors alternating sides, then
  re-orthonormalisation by QR), O((out+in)·R·l) per pass. The residual is ``Σ_{k<j≤l} S_j²`` (exact) plus a
  Hutchinson estimate, from ``probes`` extra Gaussian columns independent of the basis, of the energy the
  basis misses; both are 0 whenever rank(M) ≤ l.

Singular directions whose value is 0 (rank(M) < k) get ``B′`` column 0 and a fresh random ``A′`` row (like
PEFT's LoRA init), so the product stays exact and those directions stay trainable.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hubgrpo.merge.frozen_a import same

Term = tuple[float, torch.Tensor, torch.Tensor]  # (coefficient, B (out × r), A (r × in))


@dataclass
class LowRankSum:
    """``M = Σ_k c_k·B_k·A_k``: the ``B_k`` (out × r_k) kept as a list (no copy), ``A`` (R × in) stacked, and
    ``c`` (R,) each term's coefficient repeated over its rows. Products loop over the B_k: as fast as one GEMM on
    a stacked ``(out × R)`` matrix here, and it avoids a strided copy of every submission."""

    Bs: list[torch.Tensor]
    A: torch.Tensor
    c: torch.Tensor
    out_dim: int

    @classmethod
    def from_terms(cls, terms: list[Term], out_dim: int, in_dim: int) -> LowRankSum:
        """``Σ_k coef_k · B_k · A_k`` (terms with coefficient 0 or rank 0 are dropped)."""
        device = terms[0][2].device if terms else None
        terms = [t for t in terms if t[0] != 0.0 and t[1].shape[1] > 0]
        if not terms:
            return cls([], torch.zeros(0, in_dim, device=device), torch.zeros(0, device=device), out_dim)
        a = torch.cat([t[2].float() for t in terms], dim=0)  # (R × in)
        c = torch.cat([torch.full((t[1].shape[1],), float(t[0]), device=a.device) for t in terms])  # (R,)
        return cls([t[1].float() for t in terms], a, c, out_dim)

    @property
    def shape(self) -> tuple[int, int, int]:
        """(out, in, R)."""
        return self.out_dim, self.A.shape[1], self.A.shape[0]

    def b_cat(self) -> torch.Tensor:
        """The stacked ``B`` (out × R) — a copy; for the exact path and ``stack`` outputs."""
        return torch.cat(self.Bs, dim=1) if self.Bs else torch.zeros(self.out_dim, 0, device=self.A.device)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """``M · x``: (in × l) → (out × l)."""
        z = self.c[:, None] * (self.A @ x)  # (R × l)
        y = torch.zeros(self.out_dim, x.shape[1], device=x.device)
        off = 0
        for b in self.Bs:
            y.addmm_(b, z[off : off + b.shape[1]])
            off += b.shape[1]
        return y

    def rmatmul(self, y: torch.Tensor) -> torch.Tensor:
        """``Mᵀ · y``: (out × l) → (in × l)."""
        if not self.Bs:
            return torch.zeros(self.A.shape[1], y.shape[1], device=y.device)
        w = torch.cat([b.T @ y for b in self.Bs], dim=0)  # (R × l)
        return self.A.T @ (self.c[:, None] * w)


@dataclass
class Factorization:
    """``B′ (out × k) · A′ (k × in)`` ≈ M; ``tail_sq`` = ‖M − B′A′‖², ``total_sq`` = ‖M‖² (see ``estimated``)."""

    B: torch.Tensor
    A: torch.Tensor
    tail_sq: float
    total_sq: float
    algorithm: str
    estimated: bool = False

    @property
    def residual(self) -> float:
        """``‖M − B′A′‖ / ‖M‖`` (0 for M = 0)."""
        return (self.tail_sq / self.total_sq) ** 0.5 if self.total_sq > 0 else 0.0


def orthonormal_basis(y: torch.Tensor) -> torch.Tensor:
    """Orthonormal basis (n × l) of a tall-skinny ``y`` (n × l) by Householder QR: orthogonal to float32
    precision whatever the conditioning; a rank-deficient ``y`` gets extra orthonormal columns, which only add
    ~0 singular values later."""
    return torch.linalg.qr(y)[0]


def _small_svd(c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SVD of a wide (l × n) matrix with l ≪ n from the float64 eigen-decomposition of ``c·cᵀ``:
    returns ``u`` (l × l), ``s`` (l,) descending, ``w = uᵀ·c`` (l × n, rows = s_j·v_jᵀ, never divided by s)."""
    cd = c.double()
    evals, u = torch.linalg.eigh(cd @ cd.T)  # ascending
    evals, u = evals.flip(0).clamp_min(0), u.flip(1)
    return u, evals.sqrt(), u.T @ cd


def _live_factors(left: torch.Tensor, s: torch.Tensor, right: torch.Tensor, rank: int):
    """Balanced factors of the top-``rank`` part of ``left·right`` where ``left`` (n × m) has orthonormal columns
    and ``right`` (m × p) holds rows ``s_j·v_jᵀ``: ``left·√s`` (n × k) and ``right/√s`` (k × p), keeping only the
    k ≤ rank directions with s_j > 1e-6·s_0; also returns the energy of the dropped ("dead") ones among the top."""
    s = s.double()
    top = float(s[0]) if s.numel() else 0.0
    live = int((s[:rank] > top * 1e-6).sum()) if top > 0 else 0
    root = s[:live].sqrt()
    return (
        (left[:, :live].double() * root).float(),
        (right[:live].double() / root[:, None]).float(),
        float((s[live:rank] ** 2).sum()),
    )


def pad_rank(b: torch.Tensor, a: torch.Tensor, rank: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad ``b`` (out × k), ``a`` (k × in) to ``rank`` with zero B columns and fresh A rows (PEFT's kaiming-uniform
    scale, std 1/√(3·in)): the product is unchanged and the new directions stay trainable, like a LoRA init."""
    extra = rank - b.shape[1]
    if extra <= 0:
        return b, a
    fresh = (torch.randn(extra, a.shape[1], generator=gen) / (3 * a.shape[1]) ** 0.5).to(a.device)  # CPU draw
    return torch.cat([b, torch.zeros(b.shape[0], extra, device=b.device)], dim=1), torch.cat([a, fresh], dim=0)


def refactor_exact(m: LowRankSum, rank: int, gen: torch.Generator) -> Factorization:
    """Optimal rank-``rank`` truncation of ``M`` via QR of the stacks and SVD of the small core, O((out+in)·R²)."""
    qb, rb = torch.linalg.qr(m.b_cat())  # qb: (out × p), rb: (p × R), p = min(out, R)
    qa, ra = torch.linalg.qr(m.A.T)  # qa: (in × q), ra: (q × R)
    core = (rb * m.c) @ ra.T  # (p × q) = Rb · diag(c) · Raᵀ
    uc, s, vch = torch.linalg.svd(core.double(), full_matrices=False)  # (p × t), (t,), (t × q)
    right = (s[:, None] * vch).float() @ qa.T  # (t × in), rows s_j·v_jᵀ
    b, a, dead_sq = _live_factors(qb @ uc.float(), s, right, rank)
    b, a = pad_rank(b, a, rank, gen)
    return Factorization(b, a, float((s[rank:] ** 2).sum()) + dead_sq, float((s**2).sum()), "exact")


def refactor_randomized(
    m: LowRankSum, rank: int, gen: torch.Generator, *, oversample: int = 5, passes: int = 3, probes: int = 4
) -> Factorization:
    """Randomized SVD of the implicit ``M`` (Halko–Martinsson–Tropp 2011, Alg. 4.4 with re-orthonormalisation).

    ``passes`` ≥ 2 products with the stacked factors: ``passes − 1`` sketch passes alternate ``M·`` and ``Mᵀ·``
    starting from a Gaussian (in × l) matrix, each followed by an orthonormal basis; the last pass projects M
    onto the final basis. 2 = plain range finder, 4 = HMT with one power iteration (range of (MMᵀ)M·Ω), 3 (the
    default) stops half-way: the row-space basis Z of MᵀM·Ω, then ``M ≈ (M·Z)·Zᵀ``. ``probes`` Gaussian columns
    appended to the last sketch pass estimate the energy the basis misses (they are independent of it)."""
    out_dim, in_dim, total_rank = m.shape
    sketch = min(rank + oversample, total_rank, out_dim, in_dim)  # l
    device = m.A.device  # Gaussian draws are made on the CPU generator, so every device gets the same sketch
    basis, on_out = torch.randn(in_dim, sketch, generator=gen).to(device), False  # current basis and its side
    probe_out: torch.Tensor | None = None
    for i in range(max(passes, 2) - 1):
        width = basis.shape[1]
        if i == passes - 2 and probes:  # last sketch pass: append the probes
            basis = torch.cat([basis, torch.randn(basis.shape[0], probes, generator=gen).to(device)], dim=1)
        prod = m.rmatmul(basis) if on_out else m.matmul(basis)  # (in or out) × (l + probes)
        prod, probe_out = prod[:, :width], prod[:, width:]
        basis, on_out = orthonormal_basis(prod), not on_out
    if on_out:  # basis Q (out × l′): M ≈ Q·(QᵀM)
        u, s, right = _small_svd(m.rmatmul(basis).T)  # QᵀM (l′ × in) = u·right
        b, a, dead_sq = _live_factors(basis @ u.float(), s, right.float(), rank)
    else:  # basis Z (in × l′): Mᵀ ≈ Z·(M·Z)ᵀ, factorised like the other side, then transposed back
        u, s, right = _small_svd(m.matmul(basis).T)  # (MZ)ᵀ (l′ × out) = u·right
        bt, at, dead_sq = _live_factors(basis @ u.float(), s, right.float(), rank)
        b, a = at.T, bt.T
    b, a = pad_rank(b, a, rank, gen)
    assert probe_out is not None  # the loop above ran at least once
    missed = probe_out - basis @ (basis.T @ probe_out)  # E‖(I − PPᵀ)·(M or Mᵀ)·ω‖² = the energy outside P
    missed_sq = float((missed.double() ** 2).sum()) / probes if probes else 0.0
    total_sq = float((s**2).sum()) + missed_sq
    tail_sq = float((s[rank:] ** 2).sum()) + dead_sq + missed_sq
    return Factorization(b, a, tail_sq, total_sq, "randomized", estimated=probes > 0)


def choose_algorithm(requested: str, total_rank: int, rank: int, oversample: int) -> str:
    """``auto``: exact QR+SVD while R ≤ rank + oversample, where a sketch would span all of range(M) anyway;
    randomized beyond. Householder QR of the (d × R) stacks runs far below GEMM speed on CPUs (2–5 ms for
    4864 × 32 here), so the randomized passes win from there on (see benchmarks/merge/merge.py)."""
    if requested != "auto":
        return requested
    return "exact" if total_rank <= rank + oversample else "randomized"


def refactor(m: LowRankSum, rank: int, algorithm: str, gen: torch.Generator, **randomized_kw) -> Factorization:
    """Rank-``rank`` factors of ``M`` with the requested algorithm (``auto`` | ``exact`` | ``randomized``)."""
    out_dim, in_dim, total_rank = m.shape
    if total_rank == 0:  # M = 0: zero B, fresh A (LoRA init)
        device = m.A.device
        b, a = pad_rank(torch.zeros(out_dim, 0, device=device), torch.zeros(0, in_dim, device=device), rank, gen)
        return Factorization(b, a, 0.0, 0.0, "exact")
    if choose_algorithm(algorithm, total_rank, rank, randomized_kw.get("oversample", 5)) == "exact":
        return refactor_exact(m, rank, gen)
    return refactor_randomized(m, rank, gen, **randomized_kw)


def gram_sq_norm(terms: list[Term], dtype: torch.dtype = torch.float32) -> float:
    """Exact ``‖Σ_k c_k B_k A_k‖_F²`` from Gram matrices, ``Σ_{k,l} c_k c_l ⟨B_kᵀB_l, A_k A_lᵀ⟩``,
    O((out+in)·R²) — for the small R of one or two adapters (Grams in ``dtype``, contracted in float64; pass
    float64 when the terms nearly cancel, or use ``difference_sq_norm``)."""
    m = LowRankSum.from_terms(terms, terms[0][1].shape[0], terms[0][2].shape[1])
    if m.shape[2] == 0:
        return 0.0
    b, a, c = m.b_cat().to(dtype), m.A.to(dtype), m.c.double()
    return float(((c[:, None] * (b.T @ b).double() * c[None, :]) * (a @ a.T).double()).sum())


def difference_sq_norm(
    s1: float, b1: torch.Tensor, a1: torch.Tensor, s2: float, b2: torch.Tensor, a2: torch.Tensor
) -> float:
    """``‖s1·B1·A1 − s2·B2·A2‖_F²`` without catastrophic cancellation when the two are close: for equal shapes
    it is ``‖(s1·B1 − s2·B2)·A1 + s2·B2·(A1 − A2)‖²``, whose factors are the small differences themselves; with
    one A shared (ffa: A frozen) the second term is exactly zero and left out (half the rank, one Gram less)."""
    b1, a1, b2, a2 = b1.float(), a1.float(), b2.float(), a2.float()
    if b1.shape == b2.shape and a1.shape == a2.shape:
        if same(a1, a2):
            d = s1 * b1 - s2 * b2
            return max(float(((d.T @ d).double() * (a1 @ a1.T).double()).sum()), 0.0)
        return max(gram_sq_norm([(1.0, s1 * b1 - s2 * b2, a1), (s2, b2, a1 - a2)]), 0.0)
    return max(gram_sq_norm([(s1, b1, a1), (-s2, b2, a2)]), 0.0)
