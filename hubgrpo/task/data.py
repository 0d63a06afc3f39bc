"""Prompts: a Hub dataset, a local .jsonl/.json/.csv/.parquet file, or a built-in procedural task.

``PromptSource`` turns ``DataConfig`` into two row sets (train, held-out eval) whose rows are dicts with
``prompt`` (chat messages, or plain text when ``data.chat_template`` is false), ``answer`` (a string, when the data
has one) and every other dataset column (TRL passes them to reward functions as keyword arguments).

Shards are deterministic and need no dataset size: ``rows(indices)`` maps ANY non-negative index ``i`` to
``perm_e[i % N]`` where ``e = i // N`` and ``perm_e`` is a permutation of the N training rows seeded by
``(seed, e)``. A coordinator hands out a running counter; a lease names its prompts without shipping them, and
every pass over the data (epoch) sees the rows in a fresh order.

Built-in tasks (``builtin:<task>``, knobs in ``data.options``; ``size`` rows, generated from ``options.seed``): see
``hubgrpo.task.procedural``.
"""

from __future__ import annotations

import inspect
import json
import numbers
import random
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from hubgrpo.config import Config, DataConfig
from hubgrpo.errors import DataError
from hubgrpo.task.procedural import BUILTIN_TASKS

LOCAL_SUFFIXES = (".jsonl", ".json", ".csv", ".parquet")
_COLUMNS = ("prompt", "answer", "system")
_DEFAULT_MAPPING = {"prompt": "prompt", "answer": "answer"}


# ------------------------------------------------------------------------------------------ built-in tasks


def _builtin_rows(path: str, options: dict[str, Any], eval_set: bool) -> list[dict]:
    task = path.removeprefix("builtin:")
    if task not in BUILTIN_TASKS:
        raise DataError(
            f"unknown built-in task {path!r}",
            hint=f"use one of {', '.join('builtin:' + t for t in BUILTIN_TASKS)}, a file or a Hub dataset",
        )
    opts = dict(options)
    size, eval_size = int(opts.pop("size", 5000)), int(opts.pop("eval_size", 200))
    seed = int(opts.pop("seed", 0)) + (1_000_003 if eval_set else 0)  # a separate stream for eval_split
    size = eval_size if eval_set else size
    try:
        return BUILTIN_TASKS[task](size, seed, **opts)
    except TypeError as e:
        knobs = [p for p in inspect.signature(BUILTIN_TASKS[task]).parameters if p not in ("size", "seed")]
        raise DataError(
            f"{path}: bad option in data.options ({e})",
            hint=f"{path} accepts size, seed, eval_size, {', '.join(knobs)}",
        ) from None


# ------------------------------------------------------------------------------------------ loading


def _read_local(path: Path):
    """A local file as a ``datasets.Dataset`` (read in memory, nothing written to the datasets cache)."""
    import datasets

    if not path.is_file():
        raise DataError(f"data file {path} does not exist", hint="check data.path (a file, Hub id or builtin:task)")
    suffix = path.suffix.lower()
    try:
        if suffix == ".jsonl":
            records = []
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if line.strip():
                    try:
                        records.append(json.loads(line))
                    except json.JSONDecodeError as e:
                        raise DataError(
                            f"{path}, line {n}: not valid JSON ({e.msg})", hint="one JSON object per line"
                        ) from None
            return datasets.Dataset.from_list(records)
        if suffix == ".json":
            records = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(records, list):
                raise DataError(f"{path}: expected a JSON list of objects", hint="or use .jsonl, one object per line")
            return datasets.Dataset.from_list(records)
        if suffix == ".csv":
            import pyarrow.csv as pcsv

            return datasets.Dataset(pcsv.read_csv(path))
        import pyarrow.parquet as pq

        return datasets.Dataset(pq.read_table(path))
    except DataError:
        raise
    except (OSError, ValueError, TypeError, UnicodeDecodeError) as e:  # pyarrow errors subclass these
        raise DataError(
            f"cannot read data file {path}: {e}", hint=f"check that it is valid {suffix[1:]} with one row per prompt"
        ) from None


def _load_hub(data: DataConfig, split: str):
    import datasets

    try:
        return datasets.load_dataset(data.path, data.name, split=split)
    except Exception as e:  # datasets raises many unrelated types (HTTP, FileNotFound, ValueError…)
        raise DataError(
            f"cannot load dataset {data.path!r} (config {data.name!r}, split {split!r}): {e}",
            hint="check data.path / data.name / the split names, your network and HF_TOKEN",
        ) from None


def _load_split(data: DataConfig, split: str, eval_set: bool):
    """The raw train (``eval_set`` False) or eval dataset named by ``split``."""
    import datasets

    if data.path.startswith("builtin:"):
        return datasets.Dataset.from_list(_builtin_rows(data.path, data.options, eval_set))
    p = Path(data.path).expanduser()
    if p.suffix.lower() in LOCAL_SUFFIXES:
        if not eval_set:
            return _read_local(p)
        q = Path(split).expanduser()
        if q.suffix.lower() not in LOCAL_SUFFIXES:
            raise DataError(
                f"data.eval_split {split!r}: a local data file has no named splits",
                hint="set eval_split to another data file, or leave it empty to use eval_fraction",
            )
        return _read_local(q)
    return _load_hub(data, split)


def _check_columns(ds, data: DataConfig, where: str) -> dict[str, str]:
    """{our column: dataset column} for the columns present; DataError naming a missing one and the fix."""
    mapping = {**_DEFAULT_MAPPING, **data.column_mapping}
    unknown = set(mapping) - set(_COLUMNS)
    if unknown:
        raise DataError(
            f"data.column_mapping has unknown keys {sorted(unknown)}",
            hint=f"map hubgrpo's columns {', '.join(_COLUMNS)} to your dataset's column names",
        )
    present = {}
    for ours, theirs in mapping.items():
        if theirs in ds.column_names:
            present[ours] = theirs
        elif ours == "prompt" or theirs != _DEFAULT_MAPPING.get(ours):  # the prompt, or an explicit mapping
            raise DataError(
                f"{where}: column {theirs!r} (for {ours}) not found; columns are {ds.column_names}",
                hint=f"set data.column_mapping.{ours} to the column holding the {ours}",
            )
    return present


# ------------------------------------------------------------------------------------------ PromptSource


class PromptSource:
    """Train and held-out eval prompts from ``DataConfig``, with deterministic, size-free shards."""

    def __init__(self, data: DataConfig, *, seed: int = 0):
        self.cfg = data
        self.seed = seed
        where = data.path
        train = _load_split(data, data.train_split, eval_set=False)
        if len(train) == 0:
            raise DataError(f"{where}: the training data is empty", hint="check data.path and data.train_split")
        self._mapping = _check_columns(train, data, where)
        if data.eval_split:
            evals = _load_split(data, data.eval_split, eval_set=True)
            _check_columns(evals, data, f"{where} [{data.eval_split}]")
        else:
            train, evals = self._carve_eval(train, data.eval_fraction)
        if data.max_samples:
            train = train.select(range(min(len(train), data.max_samples)))
        self._train, self._eval = train, evals
        self._perms: dict[int, list[int]] = {}

    @classmethod
    def from_config(cls, cfg: Config) -> PromptSource:
        """The prompt source of a whole config (shards seeded by ``params.seed``)."""
        return cls(cfg.data, seed=cfg.params.seed)

    def _carve_eval(self, ds, fraction: float):
        n_eval = int(round(len(ds) * fraction)) if len(ds) > 1 else 0
        n_eval = min(max(n_eval, 1 if fraction > 0 and len(ds) > 1 else 0), len(ds) - 1)
        order = list(range(len(ds)))
        random.Random(self.seed).shuffle(order)
        eval_idx = sorted(order[:n_eval])
        held = set(eval_idx)
        return ds.select([i for i in range(len(ds)) if i not in held]), ds.select(eval_idx)

    def __len__(self) -> int:
        return len(self._train)

    @property
    def eval_size(self) -> int:
        """Number of held-out rows."""
        return len(self._eval)

    def _perm(self, epoch: int) -> list[int]:
        if epoch not in self._perms:
            if len(self._perms) > 8:
                self._perms.pop(next(iter(self._perms)))
            order = list(range(len(self._train)))
            random.Random(f"{self.seed}:{epoch}").shuffle(order)
            self._perms[epoch] = order
        return self._perms[epoch]

    def rows(self, indices: Iterable[int]) -> list[dict]:
        """Training rows for shard indices: index i → perm_{i // N}[i % N] (any i >= 0)."""
        n = len(self._train)
        out = []
        for raw in indices:
            i = raw if isinstance(raw, numbers.Integral) and not isinstance(raw, bool) else -1
            if i < 0:
                raise DataError(
                    f"prompt index {raw!r} is not a non-negative integer",
                    hint="lease.prompt_indices holds a running counter starting at 0",
                )
            epoch, pos = divmod(int(i), n)
            out.append(self._format(self._train[self._perm(epoch)[pos]]))
        return out

    def eval_rows(self, n: int | None = None) -> list[dict]:
        """The first ``n`` held-out rows (all when None)."""
        k = len(self._eval) if n is None else min(n, len(self._eval))
        return [self._format(self._eval[i]) for i in range(k)]

    def _format(self, raw: dict) -> dict:
        """One dataset row → {prompt, answer?, other columns…} with the prompt in chat or text form."""
        m = self._mapping
        row = {k: v for k, v in raw.items() if k not in m.values()}
        system = raw.get(m["system"]) if "system" in m else None
        row["prompt"] = format_prompt(raw[m["prompt"]], system or self.cfg.system_prompt, self.cfg.chat_template)
        if "answer" in m:
            answer = raw[m["answer"]]
            row["answer"] = None if answer is None else str(answer)
        return row


def format_prompt(prompt: Any, system: str | None, chat: bool) -> str | list[dict]:
    """A raw prompt (text or messages) as chat messages with the system prompt, or as plain text."""
    if isinstance(prompt, list):
        if not all(isinstance(m, dict) and "role" in m and "content" in m for m in prompt):
            raise DataError(
                "a chat prompt must be a list of {role, content} messages",
                hint="fix the prompt column, or map data.column_mapping.prompt to a text column",
            )
        msgs = [{"role": m["role"], "content": m["content"]} for m in prompt]
        if system and msgs and msgs[0]["role"] != "system":
            msgs = [{"role": "system", "content": system}] + msgs
        return msgs if chat else "\n\n".join(m["content"] for m in msgs)
    if not isinstance(prompt, str) or not prompt.strip():
        raise DataError(f"prompt {prompt!r} is empty or not text", hint="every row needs a non-empty prompt")
    if chat:
        return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    return f"{system}\n\n{prompt}" if system else prompt


def truncate_prompt(prompt: str | list[dict], tokenizer, max_tokens: int | None) -> str | list[dict]:
    """Left-truncate a prompt to ``max_tokens`` (TRL 1.16 has no max_prompt_length); chat: the last message."""
    if not max_tokens:
        return prompt
    if isinstance(prompt, str):
        ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        return prompt if len(ids) <= max_tokens else tokenizer.decode(ids[-max_tokens:])
    total = len(
        tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    )
    if total <= max_tokens:
        return prompt
    last = tokenizer(prompt[-1]["content"], add_special_tokens=False)["input_ids"]
    keep = max(1, len(last) - (total - max_tokens))
    return prompt[:-1] + [{**prompt[-1], "content": tokenizer.decode(last[-keep:])}]
