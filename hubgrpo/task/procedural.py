"""Built-in tasks (``data.path: builtin:<task>``): problems generated in code from a seed, so that a run needs no
data download and every machine makes the same rows. Knobs come from ``data.options``; every task takes ``size``
(rows) and ``seed``. Each row has ``prompt`` and ``answer`` (score with ``builtin:exact_answer``) unless said.

- ``addition``: "What is 3 + 4?" — ``digits`` (per term), ``terms``.
- ``arithmetic``: "What is 7 * 3 - 4 + 2?" — mixed ``ops`` (any of ``+-*``) over ``terms`` numbers of up to
  ``digits`` digits, evaluated with the usual precedence (``*`` before ``+ -``).
- ``word_problems``: "Mia has 12 apples. Then Mia buys 3 bags with 4 apples in each. ..." — ``steps`` operations
  (gain, loss, groups of equal size, sharing equally) on a starting amount of up to ``max_number``; every
  intermediate amount is a whole number ≥ 0.
- ``countdown``: "Use 3, 5, 7 to make 22" — ``numbers``, ``max_number``; columns ``numbers``, ``target``; ``answer``
  is one valid expression (score with ``builtin:countdown``).
"""

from __future__ import annotations

import random
from collections.abc import Callable

from hubgrpo.errors import DataError

ANSWER_INSTRUCTION = "Put only the final answer inside <answer></answer>."
NAMES = ("Mia", "Leo", "Ava", "Noah", "Zoe", "Omar", "Lena", "Ravi", "Ines", "Kofi", "Yuki", "Sam")
ITEMS = (
    ("apple", "bag"),
    ("marble", "jar"),
    ("sticker", "sheet"),
    ("cookie", "tin"),
    ("pencil", "pack"),
    ("shell", "bucket"),
    ("card", "deck"),
    ("egg", "carton"),
)  # plurals: + "s"


def make_addition(size: int, seed: int, digits: int = 1, terms: int = 2, min_terms: int | None = None) -> list[dict]:
    """``size`` addition problems of up to ``digits`` digits per term; answer = the sum. Each has ``terms`` terms,
    or (``min_terms``) a number of terms drawn uniformly from ``min_terms`` to ``terms``: easy and hard mixed."""
    low = terms if min_terms is None else min_terms
    if digits < 1 or low < 2 or low > terms:
        raise DataError(
            f"builtin:addition needs digits >= 1 and 2 <= min_terms <= terms (got digits={digits}, terms={terms}, "
            f"min_terms={min_terms})"
        )
    rng = random.Random(seed)
    rows = []
    for _ in range(size):
        xs = [rng.randint(0, 10**digits - 1) for _ in range(rng.randint(low, terms) if low < terms else terms)]
        rows.append({"prompt": f"What is {' + '.join(map(str, xs))}? {ANSWER_INSTRUCTION}", "answer": str(sum(xs))})
    return rows


def make_arithmetic(size: int, seed: int, terms: int = 3, digits: int = 1, ops: str = "+-*") -> list[dict]:
    """``size`` expressions of ``terms`` numbers (up to ``digits`` digits) joined by operators drawn from ``ops``;
    answer = the value with ``*`` binding tighter than ``+`` and ``-``."""
    if terms < 2 or digits < 1 or not ops or set(ops) - set("+-*"):
        raise DataError(
            f"builtin:arithmetic needs terms >= 2, digits >= 1 and ops made of + - * "
            f"(got terms={terms}, digits={digits}, ops={ops!r})"
        )
    rng = random.Random(seed)
    rows = []
    for _ in range(size):
        xs = [rng.randint(0, 10**digits - 1) for _ in range(terms)]
        expr = str(xs[0])
        for x in xs[1:]:
            expr += f" {rng.choice(ops)} {x}"
        rows.append({"prompt": f"What is {expr}? {ANSWER_INSTRUCTION}", "answer": str(_value(expr))})
    return rows


def _value(expr: str) -> int:
    """The value of ``a op b op c ...`` (+ - * on whole numbers, * first), without eval."""
    tokens = expr.split()
    total, product, sign = 0, int(tokens[0]), 1
    for op, x in zip(tokens[1::2], map(int, tokens[2::2])):
        if op == "*":
            product *= x
        else:
            total += sign * product
            product, sign = x, 1 if op == "+" else -1
    return total + sign * product


def _count(n: int, item: str, more: str = "") -> str:
    """``3 more apples``, ``1 apple``."""
    return f"{n} {more}{item}{'' if n == 1 else 's'}"


def _word_step(rng: random.Random, amount: int, item: str, box: str, max_number: int) -> tuple[str, int]:
    """One sentence that changes ``amount`` and the amount after it (never below 0, always whole)."""
    parts = [d for d in range(2, 6) if amount >= d and amount % d == 0]
    kinds = ["gain", "groups"] + (["loss"] if amount > 0 else []) + (["share"] if parts else [])
    kind = rng.choice(kinds)
    if kind == "gain":
        k = rng.randint(1, max_number)
        return f"Then {{who}} finds {_count(k, item, 'more ')}.", amount + k
    if kind == "loss":
        k = rng.randint(1, amount)
        return f"Then {{who}} gives {_count(k, item)} to a friend.", amount - k
    if kind == "groups":
        n, each = rng.randint(2, 5), rng.randint(2, 6)
        return f"Then {{who}} buys {n} {box}s with {each} {item}s in each.", amount + n * each
    d = rng.choice(parts)
    return f"Then {{who}} splits them into {d} equal piles and keeps one pile.", amount // d


def make_word_problems(size: int, seed: int, steps: int = 2, max_number: int = 20) -> list[dict]:
    """``size`` word problems: a starting amount, ``steps`` changes to it, and the question how many are left."""
    if steps < 1 or max_number < 1:
        raise DataError(f"builtin:word_problems needs steps >= 1 and max_number >= 1 (got {steps}, {max_number})")
    rng = random.Random(seed)
    rows = []
    for _ in range(size):
        name, (item, box) = rng.choice(NAMES), rng.choice(ITEMS)
        amount = rng.randint(1, max_number)
        sentences = [f"{name} has {_count(amount, item)}."]
        for _ in range(steps):
            sentence, amount = _word_step(rng, amount, item, box, max_number)
            sentences.append(sentence.format(who=name))
        question = f"How many {item}s does {name} have now?"
        rows.append({"prompt": f"{' '.join(sentences)} {question} {ANSWER_INSTRUCTION}", "answer": str(amount)})
    return rows


def make_countdown(size: int, seed: int, numbers: int = 3, max_number: int = 10) -> list[dict]:
    """``size`` countdown puzzles: reach ``target`` with + - * on ``numbers`` integers (each used at most once)."""
    if numbers < 2 or max_number < 1:
        raise DataError(f"builtin:countdown needs numbers >= 2 and max_number >= 1 (got {numbers}, {max_number})")
    rng = random.Random(seed)
    rows = []
    for _ in range(size):
        xs = [rng.randint(1, max_number) for _ in range(numbers)]
        expr, target = str(xs[0]), xs[0]
        for j, x in enumerate(xs[1:], 1):
            op = rng.choice("+-*")
            target = target + x if op == "+" else target - x if op == "-" else target * x
            expr = f"{expr} {op} {x}" if j == 1 else f"({expr}) {op} {x}"
        prompt = (
            f"Using the numbers {', '.join(map(str, xs))} (each at most once) and + - *, make {target}. "
            "Put only the expression inside <answer></answer>."
        )
        rows.append({"prompt": prompt, "answer": expr, "numbers": xs, "target": target})
    return rows


BUILTIN_TASKS: dict[str, Callable[..., list[dict]]] = {
    "addition": make_addition,
    "arithmetic": make_arithmetic,
    "word_problems": make_word_problems,
    "countdown": make_countdown,
}
