"""The check: replay a round's sampled completions with one teacher-forced forward pass.

``verify_completions`` puts the completions (each after its prompt's tokens, prompts left-padded as ``generate``
gets them) through the model once, warps each position's scores as the worker's sampling did
(``hubgrpo.proof.sampling.Warp``) and adds the keyed noise of that completion and position. At every position the
recorded token's perturbed score must lie within the ``Tolerance`` of the top one (its *deficit*: 0 where the replay
picks the recorded token). Float rounding (another precision, thread count or device, the worker's cached decoding
against this full forward) moves scores a little, so an honest token can lie just below a near tie; a token the
leased policy and the lease's noise did not choose lies, nearly always, far below. The tolerance grows with the
position's largest warped score: rounding errors scale with the magnitude of what is rounded, and warped scores are
logits / temperature.

Each completion must also end where generation ends it (``endings``): its first stop token last, or exactly
``max_completion_length`` tokens without one. That stop token is replayed like every other token, so a worker
cannot cut an honest completion short (a shorter answer can score differently) unless the policy would have stopped
there.

``Verdict`` counts positions checked, tolerated and mismatched, and completions that end wrongly;
``Verdict.passes()`` applies a round's rule (``RoundRule``: at most so many mismatches, and no completion ending
wrongly), by default the one for the verifier's precision (``RULES``). The product's verifier computes in float32
(``hubgrpo.worker.verifier``) with the run's ``coordinator.verify_tolerance`` (``run_tolerance``): ``STRICT`` by
default, for float32 workers (rounding between processors and thread counts only), or the wide float32 entry of
``TOLERANCE``, which also covers bfloat16 workers and was chosen from the honest rounds of
``benchmarks/proof/proof_model.py`` (``benchmarks/proof/results/proof-smollm2-long-bf16.md``). The bfloat16 and
float16 entries are for experiments (``benchmarks/proof/proof_bench.py``): a lower-precision verifier needs a
tolerance so wide that it lets subtle forgeries through.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import torch

from hubgrpo.proof.noise import gumbel
from hubgrpo.proof.sampling import Warp


@dataclass(frozen=True)
class Tolerance:
    """How far below the replay's top perturbed score a recorded token may lie at a position: ``absolute`` +
    ``relative`` × the largest magnitude among the position's warped scores (logits / temperature: a rounding
    error grows with the magnitude of what is rounded, and with 1 / temperature)."""

    absolute: float = 0.0
    relative: float = 0.0

    def at(self, warped: torch.Tensor) -> torch.Tensor:
        """The tolerance of each of N positions, float32 [N], from their warped scores [N, V] (-inf: masked)."""
        if not self.relative:
            return torch.full(warped.shape[:1], self.absolute, device=warped.device)
        return self.absolute + self.relative * warped.nan_to_num(neginf=0.0, posinf=0.0).abs().amax(-1)


# by the verifier's dtype; float32 (the product's verifier, wide enough for a bfloat16 worker): chosen from honest
# bfloat16 rounds of long completions (benchmarks/proof/results/proof-smollm2-long-bf16.md)
TOLERANCE = {torch.float32: Tolerance(1e-3, 0.06), torch.bfloat16: Tolerance(1.0), torch.float16: Tolerance(0.25)}
# a float32 verifier of float32 workers (``coordinator.verify_tolerance: strict``, the default): rounding only, no
# bfloat16. The smaller a flip it tolerates, the more generations from the version before the lease's it catches
# (benchmarks/proof/results/proof-smollm2-long-s1.md, -long-2.md); honest float32 workers on other kernels:
# benchmarks/proof/results/proof-smollm2-other-cpu.md
STRICT = Tolerance(5e-4, 1e-5)
CHUNK = 256  # positions warped and perturbed at once (memory: CHUNK × vocab scores, and the hash's temporaries)


@dataclass(frozen=True)
class RoundRule:
    """A round fails when the mismatches of its checked completions exceed this, or when one ends wrongly."""

    max_mismatches: int = 0


RULES = {"float32": RoundRule(0), "bfloat16": RoundRule(1), "float16": RoundRule(1)}  # by the verifier's dtype


@dataclass
class Verdict:
    """What replaying some completions found."""

    completions: int = 0  # completions replayed
    tokens: int = 0  # completion tokens among them
    checked: int = 0  # positions compared (all of them)
    ambiguous: int = 0  # positions where another token is on top, within the tolerance (rounding can do that)
    mismatches: int = 0  # positions whose recorded token is more than the tolerance below the replayed choice
    unended: int = 0  # completions that do not end where generation ends (``endings``)
    seconds: float = 0.0
    per_completion: list[int] = field(default_factory=list)  # each completion's mismatches (+ 1 if unended)
    precision: str = "float32"  # the verifier's dtype: which rule applies by default
    max_deficit: float = 0.0  # the largest finite deficit (top perturbed score − the recorded token's) seen

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def passes(self, rule: RoundRule | None = None) -> bool:
        """Whether the round passes ``rule`` (default: the rule for the verifier's precision, ``RULES``)."""
        rule = rule or RULES.get(self.precision, RULES["bfloat16"])
        return self.mismatches <= rule.max_mismatches and self.unended == 0

    def to_dict(self) -> dict:
        return {**asdict(self), "tokens_per_s": self.tokens_per_s}


def default_tolerance(dtype: torch.dtype) -> Tolerance:
    """The tolerance for a verifier computing in ``dtype``."""
    return TOLERANCE.get(dtype, TOLERANCE[torch.bfloat16])


def run_tolerance(verify_tolerance: str) -> Tolerance:
    """The float32 verifier's tolerance for a run's ``coordinator.verify_tolerance``: ``strict`` (the default) for
    float32 workers only (every worker of such a run generates in float32), ``wide`` for bfloat16 or float32."""
    return STRICT if verify_tolerance == "strict" else TOLERANCE[torch.float32]


def full_float32() -> None:
    """float32 matrix products in float32, not TF32 (which a GPU may use for them): ``STRICT`` allows rounding only
    (measured with worker and verifier on one CPU). For a strict run's workers and verifier."""
    torch.set_float32_matmul_precision("highest")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def teacher_batch(
    prompts_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]], pad: int
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(ids [B, P+L], mask [B, P+L], L): prompts left-padded to P, completions right-padded to L."""
    width = max(len(p) for p in prompts_ids)
    length = max(1, max(len(c) for c in completion_ids))
    ids = torch.full((len(prompts_ids), width + length), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, (p, c) in enumerate(zip(prompts_ids, completion_ids, strict=True)):
        ids[i, width - len(p) : width] = torch.tensor(list(p), dtype=torch.long)
        mask[i, width - len(p) : width] = 1
        if len(c):
            ids[i, width : width + len(c)] = torch.tensor(list(c), dtype=torch.long)
            mask[i, width : width + len(c)] = 1
    return ids, mask, length


@torch.no_grad()
def completion_logits(model, ids: torch.Tensor, mask: torch.Tensor, length: int) -> torch.Tensor:
    """Scores before each of the ``length`` completion tokens: float32 [B, length, V] (one forward pass)."""
    device = next(model.parameters()).device
    ids, mask = ids.to(device), mask.to(device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # as generate computes them from the attention mask
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=length + 1)
    return out.logits[:, :length].float()


def replay(
    scores: torch.Tensor,
    tokens: torch.Tensor,
    seed: int,
    completions: torch.Tensor,
    positions: torch.Tensor,
    warp: Warp,
    tolerance: Tolerance | float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(tolerated, mismatch, deficit) for N positions: scores [N, V], recorded tokens, completion, position [N].

    ``deficit`` (float32 [N]): the top perturbed score minus the recorded token's (0 when the replay picks the
    recorded token; infinite for a token outside the vocabulary or masked by top-k/top-p); ``mismatch``: deficit >
    ``tolerance`` (a ``Tolerance``, or a float: an absolute one); ``tolerated``: another token on top, but within the
    tolerance."""
    vocab = scores.size(-1)
    tol = tolerance if isinstance(tolerance, Tolerance) else Tolerance(float(tolerance))
    warped = warp.apply(scores)
    perturbed = warped + gumbel(seed, completions.to(scores.device), positions.to(scores.device), vocab)
    tokens = tokens.to(scores.device)
    valid = (tokens >= 0) & (tokens < vocab)
    mine = perturbed.gather(-1, tokens.clamp(0, vocab - 1)[:, None])[:, 0]
    deficit = torch.where(valid, perturbed.max(-1).values - mine, torch.full_like(mine, torch.inf))
    deficit = deficit.nan_to_num(nan=torch.inf, posinf=torch.inf)  # -inf − -inf: a row all masked
    mismatch = deficit > tol.at(warped)
    return (deficit > 0) & ~mismatch, mismatch, deficit


def endings(completion_ids: Sequence[Sequence[int]], stop: Sequence[int], max_length: int) -> list[bool]:
    """Whether each completion ends where the policy's generation would have ended it: a stop token as its last
    token and nowhere before, or exactly ``max_length`` tokens without one (``generate`` stops at the first stop
    token or at ``max_new_tokens``, and TRL keeps each completion up to and including its first stop token)."""
    stops = set(stop)
    out = []
    for c in completion_ids:
        early = any(t in stops for t in c[:-1])
        out.append(0 < len(c) <= max_length and not early and (c[-1] in stops or len(c) == max_length))
    return out


def verify_completions(
    model,
    tokenizer,
    prompts_ids: Sequence[Sequence[int]],
    completion_ids: Sequence[Sequence[int]],
    seed: int,
    indices: Sequence[int],
    temperature: float = 1.0,
    top_p: float | None = 1.0,
    top_k: int | None = None,
    tolerance: Tolerance | float | None = None,
    *,
    stop: Sequence[int] | None = None,
    max_length: int | None = None,
) -> Verdict:
    """Replay ``completion_ids`` (each after ``prompts_ids[i]``, its completion index in the round ``indices[i]``)
    under the lease's ``seed`` and sampling settings; the model must be the leased version (adapter loaded).
    ``stop`` (the generation's stop token ids) and ``max_length`` (its ``max_completion_length``): each completion
    must also end where generation ends (``endings``); the check is off without them."""
    start = time.perf_counter()
    if not completion_ids:
        return Verdict()
    dtype = next(model.parameters()).dtype
    tol = default_tolerance(dtype) if tolerance is None else tolerance
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids, mask, length = teacher_batch(prompts_ids, completion_ids, pad)
    logits = completion_logits(model, ids, mask, length)
    lengths = torch.tensor([len(c) for c in completion_ids])
    valid = torch.arange(length)[None, :] < lengths[:, None]  # [B, L]
    rows, cols = valid.nonzero(as_tuple=True)
    tokens = ids[:, -length:][rows, cols]
    comp = torch.tensor(list(indices), dtype=torch.int64)[rows]
    warp = Warp(temperature, top_k or None, top_p)
    parts: list[tuple[torch.Tensor, ...]] = []
    for i in range(0, rows.numel(), CHUNK):
        part = slice(i, i + CHUNK)
        scores = logits[rows[part].to(logits.device), cols[part].to(logits.device)]
        parts.append(tuple(t.cpu() for t in replay(scores, tokens[part], seed, comp[part], cols[part], warp, tol)))
    tolerated, mis, deficit = (torch.cat(c) for c in zip(*parts))
    per = torch.zeros(len(completion_ids), dtype=torch.long).index_add_(0, rows, mis.long())
    ended = [True] * len(completion_ids)
    if stop is not None and max_length is not None:
        ended = endings(completion_ids, stop, max_length)
    finite = deficit[deficit.isfinite()]
    return Verdict(
        completions=len(completion_ids),
        tokens=int(rows.numel()),
        checked=int(rows.numel()),
        ambiguous=int(tolerated.sum()),
        mismatches=int(mis.sum()),
        unended=ended.count(False),
        seconds=time.perf_counter() - start,
        per_completion=[int(m) + (not e) for m, e in zip(per.tolist(), ended)],
        precision=str(dtype).removeprefix("torch."),
        max_deficit=float(finite.max()) if finite.numel() else 0.0,
    )
