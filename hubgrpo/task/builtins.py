"""The built-in rewards (``builtin:<name>``) and how they read a completion's answer.

- ``exact_answer``: 1 when the number in ``<answer>…</answer>`` (else the last number) equals the ``answer``
  column's number (after ``####`` when present, GSM8K style), else 0.
- ``close_answer``: partial credit by distance, 1 / (1 + |number - reference|); 0 without a number. Beside
  ``exact_answer`` it tells a group of wrong answers which were nearer.
- ``answer_format``: 1 for a non-empty ``<answer>…</answer>``; 0.5 for an answer cut short, begun with its tag and
  never closed (or closed, never begun), the tag at the completion's edge; else 0 (a tag named mid-sentence, as
  in an echo of the prompt's instruction, earns nothing).
- ``length_penalty``: 0 up to ``target_chars`` (default 100) characters, falling linearly to -1 at twice that.
- ``char_fraction``: share of the completion's characters equal to ``char`` (default "a"); a dense toy reward
  that a random tiny model improves within tens of steps (tests, CI).
- ``countdown``: 1 when the answer is an expression of + - * ( ) over the row's ``numbers`` (each used at most as
  often as given) that equals ``target``.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from hubgrpo.errors import RewardError

_TAG = re.compile(r"<answer>(.*?)</answer>", re.S)  # what extract_answer finds (it scans without the regex)
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


# ------------------------------------------------------------------------------------------ parsing


def completion_text(completion: Any) -> str:
    """The text of a completion: a string, or the contents of chat messages (TRL's conversational form)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        completion = [completion]
    if isinstance(completion, (list, tuple)):
        parts = []
        for m in completion:
            content = m.get("content", "") if isinstance(m, dict) else m
            parts.append(content if isinstance(content, str) else str(content))
        return "".join(parts)
    return "" if completion is None else str(completion)


def extract_answer(text: str) -> str | None:
    """The stripped content of the last ``<answer>…</answer>`` (``_TAG.findall(text)[-1]``), or None. A linear scan:
    the regex is quadratic on text with many opening tags and no closing one, and the coordinator scores
    completions a participant wrote (``hubgrpo.coordinator.verify``)."""
    found, pos = None, 0
    while (start := text.find("<answer>", pos)) >= 0:
        end = text.find("</answer>", start + 8)
        if end < 0:
            break
        found, pos = text[start + 8 : end], end + 9
    return found.strip() if found is not None else None


def _last_number(text: str) -> float | None:
    found = _NUMBER.findall(text)
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


def parse_number(text: str) -> float | None:
    """The number a completion answers: inside ``<answer>`` when tagged, else the last number in the text."""
    tagged = extract_answer(text)
    return _last_number(tagged if tagged is not None else text)


def reference_number(answer: Any) -> float | None:
    """The number of a reference answer (the part after ``####`` when present, GSM8K style)."""
    text = str(answer)
    return _last_number(text.split("####")[-1])


def _need(column: str, values: Any, name: str) -> Sequence:
    if values is None:
        raise RewardError(
            f"reward builtin:{name} needs a {column!r} column in the data",
            hint=f"map it with data.column_mapping.{column}, or choose another reward",
        )
    return values


# ------------------------------------------------------------------------------------------ built-ins


def _distances(completions, answer, name: str) -> list[float | None]:
    """|completion's number − reference ``answer``'s number| per completion; None where either has no number."""
    out: list[float | None] = []
    for c, ref in zip(completions, _need("answer", answer, name)):
        got, want = parse_number(completion_text(c)), reference_number(ref)
        out.append(None if got is None or want is None else abs(got - want))
    return out


def exact_answer(prompts, completions, answer=None, **kwargs) -> list[float]:
    """1.0 when the completion's number equals the reference ``answer``'s number, else 0.0."""
    return [1.0 if d is not None and d < 1e-6 else 0.0 for d in _distances(completions, answer, "exact_answer")]


def close_answer(prompts, completions, answer=None, **kwargs) -> list[float]:
    """Partial credit by distance: 1 / (1 + |number - reference|), 0.0 without a number. Added to
    ``exact_answer``, it gives a group whose completions are all wrong a signal (nearer is better)."""
    return [0.0 if d is None else 1.0 / (1.0 + d) for d in _distances(completions, answer, "close_answer")]


def answer_format(prompts, completions, **kwargs) -> list[float]:
    """1.0 for a non-empty ``<answer>…</answer>``; 0.5 for an answer begun and not closed (``<answer>12``) or closed
    and not opened (``12</answer>``); else 0.0. A tag named in a sentence (``…inside <answer> and…``, an echo of
    the instruction) earns nothing: a word, not an answer, stands next to it."""
    out = []
    for c in completions:
        text = completion_text(c)
        opened, closed = "<answer>" in text, "</answer>" in text
        begun = opened and not closed and _answer_edge(text[text.rfind("<answer>") + 8 :].lstrip()[:1])
        ended = closed and not opened and _answer_edge(text[: text.find("</answer>")].rstrip()[-1:])
        out.append(1.0 if extract_answer(text) else 0.5 if begun or ended else 0.0)
    return out


def _answer_edge(char: str) -> bool:
    return bool(char) and not char.isalpha() and char not in "<>"  # a digit, a sign, a bracket: not a word or tag


def length_penalty(prompts, completions, target_chars: int = 100, **kwargs) -> list[float]:
    """0.0 up to ``target_chars`` characters, then linearly down to -1.0 at twice that length."""
    return [-min(1.0, max(0, len(completion_text(c)) - target_chars) / target_chars) for c in completions]


def char_fraction(prompts, completions, char: str = "a", **kwargs) -> list[float]:
    """Share of the completion's characters equal to ``char`` (0.0 for an empty completion)."""
    out = []
    for c in completions:
        text = completion_text(c)
        out.append(text.count(char) / len(text) if text else 0.0)
    return out


def _eval_expr(node: ast.AST, used: list[int]) -> int:
    """Evaluate + - * over integer literals only, recording the literals used."""
    if isinstance(node, ast.Expression):
        return _eval_expr(node.body, used)
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        used.append(node.value)
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult)):
        a, b = _eval_expr(node.left, used), _eval_expr(node.right, used)
        return a + b if isinstance(node.op, ast.Add) else a - b if isinstance(node.op, ast.Sub) else a * b
    raise ValueError("only integers, + - * and parentheses are allowed")


def countdown(prompts, completions, numbers=None, target=None, **kwargs) -> list[float]:
    """1.0 when the answer is an expression over the row's ``numbers`` (each at most once) equal to ``target``."""
    numbers, target = _need("numbers", numbers, "countdown"), _need("target", target, "countdown")
    out = []
    for c, nums, tgt in zip(completions, numbers, target):
        expr = extract_answer(completion_text(c))
        used: list[int] = []
        try:
            value = _eval_expr(ast.parse(expr or "", mode="eval"), used) if expr and len(expr) < 200 else None
        except (SyntaxError, ValueError, RecursionError):
            value = None
        fits = not (Counter(used) - Counter(int(n) for n in nums))
        out.append(1.0 if value is not None and fits and value == int(tgt) else 0.0)
    return out


BUILTIN_REWARDS: dict[str, Callable[..., list]] = {
    f.__name__: f for f in (exact_answer, close_answer, answer_format, length_penalty, char_fraction, countdown)
}
