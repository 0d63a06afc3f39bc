"""A reward function of your own: TRL's signature, ``(prompts, completions, **columns) -> list[float]``.

Every column of the data set arrives as a keyword argument (here ``answer``, the reversed word). A completion is
a list of chat messages when ``data.chat_template`` is true (plain text otherwise); ``completion_text`` handles
both. Workers run a file like this only when their owner allows it:
``hubgrpo worker --repo R --coordinator C --allow-reward examples/custom_task/rewards.py:reversed_word``
(``hubgrpo train`` and ``hubgrpo run`` run your own config's functions).
"""

from hubgrpo.task.rewards import completion_text, extract_answer


def reversed_word(prompts, completions, answer, **kwargs) -> list[float]:
    """1.0 for the exact reversed word inside <answer></answer>; else the share of its letters in place."""
    scores = []
    for completion, want in zip(completions, answer):
        got = (extract_answer(completion_text(completion)) or "").strip().lower()
        if got == want:
            scores.append(1.0)
        else:
            same = sum(a == b for a, b in zip(got, want))
            scores.append(0.5 * same / max(len(want), len(got), 1))
    return scores
