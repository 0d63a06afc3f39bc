"""Prompt sources: built-in tasks, local files, column mapping, chat/plain formats, held-out eval, deterministic
size-free shards, and DataErrors that name the file/column and the fix."""

from __future__ import annotations

import json
import re

import pytest

from hubgrpo.config import DataConfig
from hubgrpo.task.data import PromptSource, format_prompt, truncate_prompt
from hubgrpo.errors import DataError
from hubgrpo.task.rewards import countdown
from tests.support.models_fixture import tiny_cache  # noqa: F401  (fixture)


def _source(**kw) -> PromptSource:
    seed = kw.pop("seed", 0)
    return PromptSource(DataConfig(**kw), seed=seed)


def test_addition_rows_are_correct_and_follow_the_knobs():
    src = _source(path="builtin:addition", options={"size": 100, "digits": 2, "terms": 3}, chat_template=False)
    for row in src.rows(range(20)):
        terms = [int(x) for x in re.findall(r"\d+", row["prompt"].split("?")[0])]
        assert len(terms) == 3 and all(0 <= t <= 99 for t in terms)
        assert row["answer"] == str(sum(terms))
        assert "<answer></answer>" in row["prompt"]


def test_countdown_answers_solve_their_puzzles():
    rows = _source(path="builtin:countdown", options={"size": 50, "numbers": 4}).rows(range(30))
    completions = [f"<answer>{r['answer']}</answer>" for r in rows]
    scores = countdown(None, completions, numbers=[r["numbers"] for r in rows], target=[r["target"] for r in rows])
    assert scores == [1.0] * 30
    assert all(len(r["numbers"]) == 4 for r in rows)


def test_chat_and_plain_prompt_formats():
    chat = _source(path="builtin:addition", system_prompt="Be brief.").rows([0])[0]["prompt"]
    assert [m["role"] for m in chat] == ["system", "user"] and chat[0]["content"] == "Be brief."
    plain = _source(path="builtin:addition", system_prompt="Be brief.", chat_template=False).rows([0])[0]["prompt"]
    assert plain.startswith("Be brief.\n\nWhat is ")
    msgs = [{"role": "user", "content": "hi"}]
    assert format_prompt(msgs, "S", True) == [{"role": "system", "content": "S"}, *msgs]
    assert format_prompt(msgs, None, False) == "hi"


def test_shards_are_deterministic_and_accept_any_index():
    a = _source(path="builtin:addition", options={"size": 50}, eval_fraction=0.2, seed=7)
    b = _source(path="builtin:addition", options={"size": 50}, eval_fraction=0.2, seed=7)
    n = len(a)
    assert n == 40 and a.eval_size == 10
    idx = [0, 5, n - 1, n, n + 5, 10 * n + 3, 10**9]
    assert a.rows(idx) == b.rows(idx)
    epoch0, epoch1 = a.rows(range(n)), a.rows(range(n, 2 * n))
    key = lambda r: r["prompt"][-1]["content"]  # noqa: E731
    assert sorted(map(key, epoch0)) == sorted(map(key, epoch1))  # every epoch is a permutation of the data
    assert list(map(key, epoch0)) != list(map(key, epoch1))  # in a fresh order
    other = _source(path="builtin:addition", options={"size": 50}, eval_fraction=0.2, seed=8)
    assert other.rows(range(10)) != a.rows(range(10))
    import numpy as np

    assert a.rows([np.int64(n + 3)]) == a.rows([n + 3])
    for bad in (-1, "3", 1.0, True):
        with pytest.raises(DataError, match="not a non-negative integer"):
            a.rows([bad])


def test_eval_split_is_held_out():
    src = _source(path="builtin:addition", options={"size": 200, "digits": 4}, eval_fraction=0.1)
    train = {r["prompt"][-1]["content"] for r in src.rows(range(len(src)))}
    held = src.eval_rows()
    assert len(held) == 20 and len(src) == 180
    assert len(train | {r["prompt"][-1]["content"] for r in held}) == 200  # disjoint rows, none lost
    assert len(_source(path="builtin:addition", eval_split="test", options={"eval_size": 30}).eval_rows()) == 30


def test_local_files_with_column_mapping(tmp_path):
    rows = [{"q": f"What is {i} + 1?", "a": i + 1, "extra": i} for i in range(10)]
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in rows))
    src = _source(path=str(jsonl), column_mapping={"prompt": "q", "answer": "a"}, eval_fraction=0.0)
    first = sorted(src.rows(range(10)), key=lambda r: r["extra"])[0]
    assert first == {"extra": 0, "prompt": [{"role": "user", "content": "What is 0 + 1?"}], "answer": "1"}
    csv = tmp_path / "d.csv"
    csv.write_text("prompt,answer\n" + "\n".join(f"What is {i}?,{i}" for i in range(5)))
    assert len(_source(path=str(csv), eval_fraction=0.0)) == 5
    import pyarrow as pa
    import pyarrow.parquet as pq

    chats = [[{"role": "user", "content": f"hello {i}"}] for i in range(4)]
    pq.write_table(pa.table({"prompt": chats}), tmp_path / "d.parquet")
    src = _source(path=str(tmp_path / "d.parquet"), eval_fraction=0.0, system_prompt="S")
    assert src.rows([0])[0]["prompt"][0] == {"role": "system", "content": "S"}
    assert "answer" not in src.rows([0])[0]  # optional when not mapped explicitly


def test_bad_data_is_a_named_data_error(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_text(json.dumps({"question": "hi"}) + "\n")
    with pytest.raises(DataError, match=r"d.jsonl: column 'prompt' \(for prompt\) not found") as e:
        _source(path=str(f))
    assert "column_mapping.prompt" in e.value.hint
    with pytest.raises(DataError, match=r"column 'solution' \(for answer\) not found"):
        _source(path=str(f), column_mapping={"prompt": "question", "answer": "solution"})
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(DataError, match="empty"):
        _source(path=str(empty))
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"prompt": "ok"}\n{"prompt": \n')
    with pytest.raises(DataError, match="broken.jsonl, line 2: not valid JSON"):
        _source(path=str(broken))
    with pytest.raises(DataError, match="does not exist"):
        _source(path=str(tmp_path / "missing.csv"))
    with pytest.raises(DataError, match="unknown built-in task"):
        _source(path="builtin:nope")
    with pytest.raises(DataError, match="bad option") as e:
        _source(path="builtin:addition", options={"digitz": 2})
    assert "digits" in e.value.hint


def test_truncate_prompt(tiny_cache):
    from hubgrpo.worker.models import load_model

    _, tok = load_model("builtin:tiny")
    long = "What is 1 + 2? " * 40
    cut = truncate_prompt(long, tok, 16)
    assert len(tok(cut)["input_ids"]) <= 16 and long.rstrip().endswith(cut.strip()[-8:])
    chat = [{"role": "system", "content": "S"}, {"role": "user", "content": long}]
    cut = truncate_prompt(chat, tok, 32)
    n = len(tok.apply_chat_template(cut, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"])
    assert n <= 32 and cut[0] == chat[0]
    assert truncate_prompt(chat, tok, None) is chat
