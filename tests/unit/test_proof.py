"""Keyed Gumbel noise and the choice of completions to replay (hubgrpo.proof): exact integers on every device,
argmax frequencies equal to softmax sampling, and a selection the worker cannot predict."""

from __future__ import annotations

import math

import pytest
import torch

from hubgrpo.proof.noise import gumbel, hash_bits
from hubgrpo.proof.sampling import Warp
from hubgrpo.proof.selection import BUDGET, choose, selection_key
from hubgrpo.proof.verify import endings, replay

M = 0xFFFFFFFF
CHI2_999 = {2: 13.816, 3: 16.266, 5: 20.515}  # chi-square quantile 0.999 by degrees of freedom


def ref_mix(x: int) -> int:
    """lowbias32 (hash-prospector's improved constants) on Python integers: the specification."""
    x ^= x >> 16
    x = (x * 0x21F0AAAD) & M
    x ^= x >> 15
    x = (x * 0x735A2D97) & M
    return x ^ (x >> 15)


def ref_hash(seed: int, completion: int, position: int, v: int) -> int:
    seed &= (1 << 64) - 1
    key = ref_mix(ref_mix((seed & M) ^ 0x68756270) ^ (seed >> 32))
    key = ref_mix(ref_mix(key ^ (completion & M)) ^ (position & M))
    return ref_mix(key ^ ref_mix(v))


COMPLETIONS, POSITIONS = [0, 1, 4095, 2**32 - 1], [0, 7, 1, 2**31]
GOLDEN = {  # hash_bits(seed, COMPLETIONS, POSITIONS, 5): any device computing the noise must give these integers
    1: [
        [2112399514, 2514075755, 3235636728, 3970359566, 481530763],
        [1459555156, 616476637, 3178380247, 1394863365, 708637714],
        [3838999622, 1372857467, 1357425297, 549103501, 4135185263],
        [2581679033, 868574886, 3889758633, 1605368652, 1922701759],
    ],
    -1: [
        [4070142463, 443438264, 858373246, 434029682, 2302623566],
        [2294762779, 3561173313, 2850998693, 2126339001, 1309663492],
        [4085823453, 3331441064, 1739371936, 1563902055, 1548072476],
        [1084608235, 470997489, 859195071, 2557193298, 389994656],
    ],
}
GOLDEN_G1 = [0.3430265188217163, 0.6244821548461914, 1.2615373134613037, 2.5435452461242676, -0.7830926775932312]


def _rows(device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    return torch.tensor(COMPLETIONS, device=device), torch.tensor(POSITIONS, device=device)


def test_the_hash_is_its_integer_specification_and_the_golden_numbers():
    for seed in (0, 1, -1, 2**63 - 1, -(2**63), 1234567890123):
        got = hash_bits(seed, *_rows(), 5).tolist()
        assert got == [[ref_hash(seed, c, p, v) for v in range(5)] for c, p in zip(COMPLETIONS, POSITIONS)]
    for seed, rows in GOLDEN.items():
        assert hash_bits(seed, *_rows(), 5).tolist() == rows
    assert gumbel(1, *_rows(), 5)[0].tolist() == pytest.approx(GOLDEN_G1, abs=1e-6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_computes_the_same_noise():
    for seed, rows in GOLDEN.items():
        assert hash_bits(seed, *_rows("cuda"), 5).cpu().tolist() == rows
    c, p = torch.arange(64), torch.arange(64) * 3
    assert torch.equal(hash_bits(9, c.cuda(), p.cuda(), 50_000).cpu(), hash_bits(9, c, p, 50_000))
    assert torch.allclose(gumbel(9, c.cuda(), p.cuda(), 50_000).cpu(), gumbel(9, c, p, 50_000), atol=1e-5)


def test_the_noise_is_finite_and_standard_gumbel():
    g = gumbel(3, torch.arange(4000), torch.zeros(4000, dtype=torch.long), 64)
    assert torch.isfinite(g).all()
    assert abs(g.mean().item() - 0.5772157) < 0.01  # Euler–Mascheroni
    assert abs(g.std().item() - math.pi / math.sqrt(6)) < 0.01


def _chi2(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    keep = probs > 0
    expected = probs[keep] * counts.sum()
    return float(((counts[keep] - expected) ** 2 / expected).sum()), int(keep.sum()) - 1


def _argmax_counts(logits: torch.Tensor, warp: Warp, n: int, seed: int = 11) -> torch.Tensor:
    """How often each token wins over ``n`` keys (completions 0..n-1 at varied positions)."""
    completions = torch.arange(n)
    positions = completions % 13
    scores = warp.apply(logits.expand(n, -1).clone()) + gumbel(seed, completions, positions, logits.numel())
    return torch.bincount(scores.argmax(-1), minlength=logits.numel()).float()


LOGITS = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, -3.0]])


def test_gumbel_max_samples_softmax_at_the_temperature_and_rejects_another():
    counts = _argmax_counts(LOGITS, Warp(temperature=0.7), 20_000)
    stat, df = _chi2(counts, torch.softmax(LOGITS[0] / 0.7, -1))
    assert stat < CHI2_999[df], stat
    stat, df = _chi2(counts, torch.softmax(LOGITS[0] / 1.0, -1))  # the test can fail: a wrong temperature
    assert stat > 10 * CHI2_999[df], stat


def test_gumbel_max_samples_what_top_k_and_top_p_keep():
    for warp in (Warp(temperature=1.0, top_k=3), Warp(temperature=1.3, top_p=0.8)):
        counts = _argmax_counts(LOGITS, warp, 20_000)
        probs = torch.softmax(warp.apply(LOGITS.clone())[0], -1)  # transformers' own warpers, renormalised
        assert counts[probs == 0].sum() == 0
        stat, df = _chi2(counts, probs)
        assert stat < CHI2_999[df], (warp, stat)
    stat, df = _chi2(_argmax_counts(LOGITS, Warp(top_k=3), 20_000), torch.softmax(LOGITS[0], -1))
    assert stat == math.inf or stat > CHI2_999[df]


def test_selection_fits_the_budget_and_the_worker_cannot_predict_it():
    lengths = [8, 12, 3, 12, 12, 7, 12, 9] * 4
    secret = b"s" * 32
    key = selection_key(secret, "digest-of-the-round")
    picked = choose(lengths, key)
    assert picked == choose(lengths, key)  # an audit replays the same completions
    assert 1 <= len(picked) and sum(lengths[i] for i in picked) <= BUDGET * sum(lengths)
    assert choose([40, 2], key) != [] and len(choose([400], key)) == 1  # at least one, even over the budget
    others = {tuple(choose(lengths, selection_key(b"t" * 31 + bytes([i]), "digest-of-the-round"))) for i in range(20)}
    assert len(others) > 15  # another secret, another choice
    seen = torch.zeros(len(lengths))
    for i in range(400):
        seen[choose(lengths, selection_key(secret, f"round-{i}"))] += 1
    assert seen.min() > 0  # every completion can be checked
    with pytest.raises(ValueError, match="16 bytes"):
        selection_key(b"short", "d")


def test_a_completion_ends_at_its_first_stop_token_or_at_the_length_limit():
    assert endings([[5, 6, 2], [5, 6, 7, 8], [5, 2], [2], [5, 6, 7, 2]], [2], 4) == [True] * 5
    cut_short, stop_inside, too_long = [5, 6], [5, 2, 6, 2], [5, 6, 7, 8, 9]
    assert endings([cut_short, stop_inside, too_long, [], [5, 6, 7, 2, 2]], [2], 4) == [False] * 5
    assert endings([[5, 0], [5, 2]], [2, 0], 4) == [True, True]  # any of the generation's stop tokens


def test_the_recorded_token_must_be_within_the_tolerance_of_the_replayed_choice():
    scores, zero = torch.zeros(4, 6), torch.zeros(4, dtype=torch.long)  # four copies of one position
    noise = gumbel(3, zero, zero, 6)[0]
    order = noise.argsort(descending=True)  # with flat scores the noise alone ranks the tokens
    gap = float(noise[order[0]] - noise[order[1]])
    tokens = torch.stack([order[0], order[1], order[-1], torch.tensor(99)])
    tolerated, mismatch, deficit = replay(scores, tokens, 3, zero, zero, Warp(), tolerance=gap + 1e-4)
    assert deficit[0] == 0 and not mismatch[0] and not tolerated[0]  # the replay's own choice
    assert tolerated[1] and not mismatch[1]  # the runner-up, within the tolerance: rounding may do that
    assert mismatch[2] and deficit[2] > gap + 1e-4  # far below the top: no rounding does that
    assert mismatch[3] and deficit[3] == math.inf  # outside the vocabulary
    _, strict, _ = replay(scores, tokens, 3, zero, zero, Warp(), tolerance=gap / 2)
    assert strict[1]


def test_a_strict_run_catches_a_token_a_wide_one_tolerates():
    """coordinator.verify_tolerance: the wide rule lets a token lie 6 % of the position's largest |score| below the
    replayed choice (bfloat16 rounding does that); the strict one 0.001 %: a flip that a lower temperature makes at
    a near tie is a mismatch there."""
    from hubgrpo.proof.verify import run_tolerance

    zero = torch.zeros(1, dtype=torch.long)
    noise = gumbel(3, zero, zero, 6)[0]
    order = noise.argsort(descending=True)
    scores = torch.zeros(1, 6)
    scores[0, order[1]] = float(noise[order[0]] - noise[order[1]]) - 0.2  # the runner-up 0.2 below the top
    scores[0, order[-1]] = -20.0  # the largest |score|: 20, so wide tolerates 1.201, strict 0.0007
    runner_up = order[1:2]
    for rule, caught in (("wide", False), ("strict", True)):
        _, mismatch, deficit = replay(scores, runner_up, 3, zero, zero, Warp(), tolerance=run_tolerance(rule))
        assert float(deficit[0]) == pytest.approx(0.2, abs=1e-4) and bool(mismatch[0]) is caught, rule
