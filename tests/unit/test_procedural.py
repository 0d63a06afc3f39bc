"""Built-in tasks generated in code: the same rows from the same seed, answers that are right, bad knobs refused."""

from __future__ import annotations

import re

import pytest

from hubgrpo.errors import DataError
from hubgrpo.task.procedural import BUILTIN_TASKS, make_arithmetic, make_word_problems
from hubgrpo.task.rewards import exact_answer


def test_arithmetic_answers_follow_the_usual_precedence():
    rows = make_arithmetic(500, seed=3, terms=4, digits=2)
    assert rows == make_arithmetic(500, seed=3, terms=4, digits=2) != make_arithmetic(500, seed=4, terms=4, digits=2)
    for row in rows:
        expr = re.fullmatch(r"What is ([0-9 +*-]+)\? .*", row["prompt"]).group(1)
        assert int(row["answer"]) == eval(expr)  # a checked oracle on digits and + - * only
    assert {op for row in rows for op in "+-*" if f" {op} " in row["prompt"]} == {"+", "-", "*"}
    assert all(" * " not in row["prompt"] for row in make_arithmetic(50, seed=0, ops="+-"))


def test_word_problem_amounts_stay_whole_and_the_answer_scores_as_exact():
    rows = make_word_problems(500, seed=1, steps=3, max_number=20)
    assert len({row["prompt"] for row in rows}) > 450
    for row in rows:
        assert row["prompt"].count("Then ") == 3 and int(row["answer"]) >= 0
    scores = exact_answer(prompts=[r["prompt"] for r in rows[:5]],
                          completions=[f"<answer>{r['answer']}</answer>" for r in rows[:5]],
                          answer=[r["answer"] for r in rows[:5]])
    assert scores == [1.0] * 5


def test_addition_mixes_easy_and_hard_problems_when_asked():
    rows = BUILTIN_TASKS["addition"](400, 3, digits=1, terms=3, min_terms=2)
    counts = {n: sum(r["prompt"].count(" + ") + 1 == n for r in rows) for n in (2, 3)}
    assert counts[2] + counts[3] == 400 and min(counts.values()) > 150
    assert all(int(r["answer"]) == sum(map(int, r["prompt"][8:r["prompt"].index("?")].split(" + "))) for r in rows)
    assert {r["prompt"].count(" + ") for r in BUILTIN_TASKS["addition"](50, 3, terms=3)} == {2}


@pytest.mark.parametrize("task,opts", [("arithmetic", {"terms": 1}), ("arithmetic", {"ops": "+/"}),
                                       ("word_problems", {"steps": 0}), ("addition", {"digits": 0}),
                                       ("addition", {"terms": 3, "min_terms": 4})])
def test_bad_knobs_are_refused_with_the_task_named(task, opts):
    with pytest.raises(DataError, match=f"builtin:{task} needs"):
        BUILTIN_TASKS[task](5, 0, **opts)
