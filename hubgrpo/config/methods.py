"""Merge methods as objects: what each method means outside its tensor maths, said once.

``merge.method`` (a run's config) and ``MergeOptions.method`` name a method; ``merge_method(name)`` is its one
``MergeMethod`` (``MergeSection.merge_method`` and ``MergeOptions.merge_method`` give it). Code that behaves
differently by method asks the object — does lora_A stay frozen, can rounds be folded in early, does the rank
grow — instead of comparing names. The maths stays in ``hubgrpo.merge.methods``: pure per-module functions, one per
method name.
"""

from __future__ import annotations


class MergeMethod:
    """A merge method's traits (the base: an exact mean of the updates, re-factorised, any LoRA trains)."""

    name: str = ""
    frozen_a: bool = False  # lora_A is the version-0 draw everywhere: only B trains, the update is linear in B
    outer_momentum: bool = True  # the outer optimizer may keep momentum
    stacks: bool = False  # concatenates the factors (the rank grows) instead of re-factorising
    in_runs: bool = True  # a run may use it (workers must be able to load every version)

    def foldable(self, clip_factor: float | None, trim_fraction: float) -> bool:
        """Whether a merge is linear in each submission, so that submissions can be folded in one at a time before
        it is due (``hubgrpo.merge.fold``): A frozen, and no robust option that needs every norm first."""
        return self.frozen_a and clip_factor is None and trim_fraction == 0

    def momentum_sides(self) -> tuple[str, ...]:
        """The factors the outer momentum is kept for: B only when A is frozen (in B space), else B and A."""
        return ("_B",) if self.frozen_a else ("_B", "_A")

    def __repr__(self) -> str:
        return f"MergeMethod({self.name!r})"


class Svd(MergeMethod):
    """The default of ``hubgrpo merge``: exact mean, re-factorised to the global's rank."""

    name = "svd"


class Stack(MergeMethod):
    """FLoRA: the factors concatenated, exact; the rank grows (to ``max_rank``), so not in a run."""

    name = "stack"
    stacks = True
    in_runs = False


class Ffa(MergeMethod):
    """FFA-LoRA, a run's default: lora_A frozen and shared, B averaged exactly."""

    name = "ffa"
    frozen_a = True


class Naive(MergeMethod):
    """Factor averaging, a benchmark baseline: no outer momentum."""

    name = "naive"
    outer_momentum = False


BY_NAME: dict[str, MergeMethod] = {m.name: m for m in (Svd(), Stack(), Ffa(), Naive())}


def merge_method(name: str) -> MergeMethod:
    """The method called ``name`` (``KeyError`` for none: the configs' ``Literal`` types refuse it first)."""
    return BY_NAME[name]
