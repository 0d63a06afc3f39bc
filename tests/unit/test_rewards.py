"""Reward functions: built-ins, chat-format completions, user functions by module and by file, weights and
kwargs, and RewardErrors that name the function and the prompt index."""

from __future__ import annotations

import math

import pytest

from hubgrpo.config import RewardConfig
from hubgrpo.errors import RewardError
from hubgrpo.task.rewards import (
    Reward,
    answer_format,
    char_fraction,
    close_answer,
    countdown,
    exact_answer,
    length_penalty,
    load_function,
    load_rewards,
    parse_number,
    weighted_rewards,
)


def shout_reward(prompts, completions, **kwargs):
    """A user reward imported as ``tests.unit.test_rewards:shout_reward``: share of upper-case completions."""
    return [1.0 if c.isupper() else 0.0 for c in completions]


def strict_signature(completions, bonus):
    """A user reward without **kwargs: it gets only the arguments it names."""
    return [len(c) + bonus for c in completions]


def test_exact_answer_parses_tags_last_numbers_and_gsm8k_references():
    completions = ["<answer>7</answer>", "so it is 3 then 7", "<answer> 1,234 </answer>", "<answer>8</answer> 7",
                   "no number", [{"role": "assistant", "content": "<answer>-2</answer>"}]]
    answers = ["7", "7", "1234", "7", "7", "Work: 1 - 3 = -2\n#### -2"]
    assert exact_answer(None, completions, answer=answers) == [1.0, 1.0, 1.0, 0.0, 0.0, 1.0]
    assert parse_number("x <answer>3.5</answer>") == 3.5
    with pytest.raises(RewardError, match="needs a 'answer' column"):
        exact_answer(None, ["1"])


def test_close_answer_gives_credit_by_distance_and_none_without_a_number():
    completions = ["<answer>12</answer>", "<answer>13</answer>", "it is 9", "no number", "<answer>-8</answer>"]
    got = close_answer(None, completions, answer=["12", "12", "12", "12", "12"])
    assert got == [1.0, 0.5, 0.25, 0.0, pytest.approx(1 / 21)]
    with pytest.raises(RewardError, match="needs a 'answer' column"):
        close_answer(None, ["1"])


def test_other_builtins():
    assert answer_format(None, ["<answer>3</answer>", "<answer>3", "<answer></answer>", "3"]) == [1.0, 0.5, 0.0, 0.0]
    echoes = ["To put only the final answer inside <answer> and", "inside <answer></answer>.", "the sum </answer> is",
              "<answer><answer>", "</answer></answer>", "Put it in <answer>", "the answer is</answer>"]
    assert answer_format(None, echoes) == [0.0] * 7  # a tag named in a sentence, as an echo of the instruction
    begun = [" <answer>1", "1 + 2 = 3</answer>\n", "Sure. <answer> 7", "3 + 4 = 7. <answer>-(", "So 12</answer>"]
    assert answer_format(None, begun) == [0.5] * 5  # an answer begun and cut short, or closed without its opening
    assert length_penalty(None, ["x" * 10, "x" * 15, "x" * 40], target_chars=10) == [0.0, -0.5, -1.0]
    assert char_fraction(None, ["aab", "", [{"role": "assistant", "content": "bbbb"}]]) == [2 / 3, 0.0, 0.0]
    assert char_fraction(None, ["xxy"], char="x") == [2 / 3]
    scores = countdown(None, ["<answer>(3 + 5) * 2</answer>", "<answer>3 * 3 * 2</answer>", "<answer>16</answer>",
                              "<answer>__import__('os')</answer>"],
                       numbers=[[3, 5, 2]] * 4, target=[16, 18, 16, 16])
    assert scores == [1.0, 0.0, 0.0, 0.0]  # 3 used twice; 16 alone does not use the numbers; no code runs


def test_user_functions_load_by_module_and_by_file(tmp_path):
    assert load_function("tests.unit.test_rewards:shout_reward") is shout_reward
    f = tmp_path / "my_rewards.py"
    f.write_text("def longer(prompts, completions, **kwargs):\n    return [float(len(c)) for c in completions]\n")
    fn = load_function(f"{f}:longer")
    assert fn(None, ["ab", "abc"]) == [2.0, 3.0]
    rewards = load_rewards([RewardConfig(function=f"{f}:longer", weight=0.5),
                            RewardConfig(function="tests.unit.test_rewards:strict_signature", kwargs={"bonus": 1}),
                            RewardConfig(function="builtin:char_fraction"),
                            RewardConfig(function="builtin:char_fraction", kwargs={"char": "b"})])
    assert [r.__name__ for r in rewards] == ["longer", "strict_signature", "char_fraction", "char_fraction_2"]
    # TRL passes extra kwargs (trainer_state, columns…); a function without **kwargs gets only what it names
    assert rewards[1](["p"], ["abc"], trainer_state=None, answer=["1"]) == [4.0]
    assert weighted_rewards(rewards, ["p", "p"], ["ab", "bb"]) == [0.5 * 2 + 3 + 0.5 + 0.5, 0.5 * 2 + 3 + 0 + 1]


def test_bad_specs_are_reward_errors(tmp_path):
    with pytest.raises(RewardError, match="unknown built-in reward"):
        load_function("builtin:nope")
    with pytest.raises(RewardError, match="not of the form"):
        load_function("just_a_name")
    with pytest.raises(RewardError, match="cannot import module 'no_such_pkg.mod'"):
        load_function("no_such_pkg.mod:f")
    with pytest.raises(RewardError, match="has no function 'missing'"):
        load_function("tests.unit.test_rewards:missing")
    with pytest.raises(RewardError, match="does not exist"):
        load_function(f"{tmp_path}/nope.py:f")
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('boom')\n")
    with pytest.raises(RewardError, match="importing reward file .* failed: RuntimeError: boom"):
        load_function(f"{broken}:f")


def test_bad_reward_values_name_the_function_and_prompt():
    def raises_on_third(prompts, completions, **kw):
        return [1 / (c != "c") for c in completions]

    r = Reward(raises_on_third, name="raises_on_third")
    with pytest.raises(RewardError, match=r"raises_on_third raised ZeroDivisionError.*prompt index 2 \('p2'\)"):
        r(["p0", "p1", "p2"], ["a", "b", "c"])

    def one_per_element(prompts, completions, answer, **kw):  # fails only on the row whose answer is bad
        return [float(a) for a in answer]

    with pytest.raises(RewardError, match="prompt index 1"):
        Reward(one_per_element, name="f")(["p0", "p1"], ["a", "b"], answer=["1", "x"])
    with pytest.raises(RewardError, match="short returned 1 values for 2 completions"):
        Reward(lambda prompts, completions, **kw: [1.0], name="short")(["p", "p"], ["a", "b"])
    with pytest.raises(RewardError, match=r"texty returned 'good' for prompt index 1"):
        Reward(lambda prompts, completions, **kw: [1.0, "good"], name="texty")(["p", "p"], ["a", "b"])
    with pytest.raises(RewardError, match="returned inf"):
        Reward(lambda prompts, completions, **kw: [math.inf], name="inf")(["p"], ["a"])
    with pytest.raises(RewardError, match="returned float, not a list"):
        Reward(lambda prompts, completions, **kw: 1.0, name="scalar")(["p"], ["a"])
    ok = Reward(lambda prompts, completions, **kw: [None, math.nan, 2], name="skips")
    assert ok(["p"] * 3, ["a", "b", "c"]) == [None, None, 2.0]  # None/NaN: "no opinion", as in TRL


def test_extract_answer_finds_what_the_regex_finds_in_linear_time():
    """The coordinator scores completions a participant wrote: many opening tags and no closing one took the regex
    seconds per 64 KiB (quadratic); the scan returns the same answer as ``_TAG.findall(text)[-1]``."""
    import random
    import time

    from hubgrpo.task.builtins import _TAG, extract_answer

    rng = random.Random(0)
    parts = ["<answer>", "</answer>", "a", " ", "1", "<", ">", "</answer", "answer>", "\n"]
    for _ in range(5000):
        text = "".join(rng.choice(parts) for _ in range(rng.randint(0, 12)))
        found = _TAG.findall(text)
        assert extract_answer(text) == (found[-1].strip() if found else None), repr(text)
    start = time.perf_counter()
    assert extract_answer("<answer>" * 100_000) is None
    assert time.perf_counter() - start < 0.5
