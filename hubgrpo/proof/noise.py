"""Keyed Gumbel noise: the same numbers on every device, from integers alone.

``gumbel(seed, completions, positions, vocab)`` is the noise ``g[n, v] = -log(-log(u))`` added to row ``n``'s
scores, where ``u`` comes from a counter-based hash of (seed, completion index, position, vocab index) — no
``torch.Generator``, whose streams differ between CPU and CUDA. The hash uses only integer tensor operations whose
results are exact on any device: 32-bit values held in int64, xor-shifts, and products of a 32-bit value with an
odd constant below 2**31 (so every product stays below 2**63: no overflow), reduced modulo 2**32. The mixing
function is Wellons' improved ``lowbias32`` (hash-prospector), whose multipliers are both below 2**31.

A row's key folds in the seed (two 32-bit words), the completion index and the position, one ``mix`` each; a vocab
entry's value is ``mix(row key ^ mix(vocab index))`` (the mixed vocab indices are computed once per vocab size).
``u`` takes the top 23 bits plus one half, over 2**23, so it is a float32 strictly inside (0, 1) and
``-log(-log(u))`` is finite. Only the final ``log`` calls are
floating point; devices may differ there by an ulp, which the verifier's tolerance absorbs.
"""

from __future__ import annotations

import torch

MASK32 = 0xFFFFFFFF
K1, K2 = 0x21F0AAAD, 0x735A2D97  # odd, below 2**31
DOMAIN = 0x68756270  # "hubp": keeps these keys apart from any other use of the same mixer
U_BITS = 23  # float32 holds (2**23 - 1) + 0.5 exactly, so u < 1 strictly


def mix(h: torch.Tensor) -> torch.Tensor:
    """lowbias32 on int64 tensors holding values in [0, 2**32): exact on every device."""
    h = h ^ (h >> 16)
    h = (h * K1) & MASK32
    h = h ^ (h >> 15)
    h = (h * K2) & MASK32
    return h ^ (h >> 15)


def _words(seed: int) -> tuple[int, int]:
    """A signed 64-bit seed as two 32-bit words."""
    seed &= (1 << 64) - 1
    return seed & MASK32, seed >> 32


def row_keys(seed: int, completions: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """One 32-bit key per row from (seed, completion index, position); both index tensors [N], int."""
    lo, hi = _words(seed)
    base = mix(torch.tensor([lo ^ DOMAIN], dtype=torch.int64, device=completions.device))
    base = mix(base ^ hi)
    key = mix(base ^ (completions.to(torch.int64) & MASK32))
    return mix(key ^ (positions.to(torch.int64) & MASK32))


_VOCAB_CACHE: dict[tuple[int, str], torch.Tensor] = {}


def vocab_words(vocab: int, device: torch.device | str) -> torch.Tensor:
    """mix(v) for v in [0, vocab), int64 [vocab], cached per (size, device)."""
    key = (vocab, str(device))
    words = _VOCAB_CACHE.get(key)
    if words is None:
        words = mix(torch.arange(vocab, dtype=torch.int64, device=device))
        _VOCAB_CACHE[key] = words
    return words


def mix_(h: torch.Tensor) -> torch.Tensor:
    """``mix`` in place (one temporary): the same values, for the large [rows, vocab] tensors."""
    t = torch.empty_like(h)
    for shift, k in ((16, K1), (15, K2)):
        torch.bitwise_right_shift(h, shift, out=t)
        h.bitwise_xor_(t).mul_(k).bitwise_and_(MASK32)
    torch.bitwise_right_shift(h, 15, out=t)
    return h.bitwise_xor_(t)


def hash_bits(seed: int, completions: torch.Tensor, positions: torch.Tensor, vocab: int) -> torch.Tensor:
    """The 32-bit hash of every (row, vocab index): int64 [N, vocab] in [0, 2**32)."""
    keys = row_keys(seed, completions, positions)  # [N]
    words = vocab_words(vocab, keys.device)  # [V]
    return mix_(keys[:, None] ^ words[None, :])


def uniform(bits: torch.Tensor) -> torch.Tensor:
    """float32 in (0, 1) strictly, from the top ``U_BITS`` of 32-bit hashes."""
    return (bits >> (32 - U_BITS)).to(torch.float32).add_(0.5).mul_(2.0**-U_BITS)


def gumbel(seed: int, completions: torch.Tensor, positions: torch.Tensor, vocab: int) -> torch.Tensor:
    """Standard Gumbel noise, float32 [N, vocab], on the device of ``completions``."""
    return uniform(hash_bits(seed, completions, positions, vocab)).log_().neg_().log_().neg_()
