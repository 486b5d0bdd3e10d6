"""The local dataset domain: rows of a JSONL, Parquet or `datasets` directory as single-turn tasks with
seeded, disjoint train / held-out splits, the tagged answer and reward terms of single-turn domains
(single_turn.py), and a strict evaluator-owned audit by math-verify or exact match."""

from __future__ import annotations

import hashlib
import json
import random
import re
from pathlib import Path
from typing import Any

from evotrainer.envs.local.config import LocalConfig
from evotrainer.envs.reward_functions import PROMPT_MESSAGES
from evotrainer.envs.single_turn import SingleTurnDomain, format_reward, prompt_text
from evotrainer.types import Task

# The audit's strict parser: the whole action is one answer tag (any answer, not only a number).
STRICT_RE = re.compile(r"\s*<answer>((?:(?!</?answer>).)*)</answer>\s*", re.DOTALL)
SUFFIXES = (".jsonl", ".parquet")


def load_rows(path: Path | None) -> list[dict[str, Any]]:
    """The file's rows as plain dicts; a missing or unreadable file is a ValueError naming env.path."""
    if path is None:
        raise ValueError("env.path: the local domain needs a data file; set env.path to a .jsonl or .parquet file")
    if not path.exists():
        raise ValueError(f"env.path = {str(path)!r}: no such file or directory")
    if path.is_dir():
        return _load_saved_dataset(path)
    if path.suffix == ".jsonl":
        rows = []
        for k, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"env.path = {str(path)!r}: line {k} is not valid JSON ({e})") from None
            if not isinstance(rows[-1], dict):
                raise ValueError(f"env.path = {str(path)!r}: line {k} is not a JSON object")
        return rows
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            return pq.read_table(path).to_pylist()
        except Exception as e:  # pyarrow raises several types for a damaged file
            raise ValueError(f"env.path = {str(path)!r}: cannot read it as Parquet ({e})") from None
    raise ValueError(
        f"env.path = {str(path)!r}: unsupported file type {path.suffix!r}; use one of {SUFFIXES} "
        "or a directory written by datasets' save_to_disk"
    )


def _load_saved_dataset(path: Path) -> list[dict[str, Any]]:
    try:  # `datasets` is optional: only this kind of path needs it
        import datasets
    except ImportError:
        raise ValueError(
            f"env.path = {str(path)!r}: a directory is read with the `datasets` package, which is not installed "
            "(pip install datasets), or write the rows to a .jsonl file"
        ) from None
    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as e:  # not a save_to_disk directory
        raise ValueError(f"env.path = {str(path)!r}: not a directory written by save_to_disk ({e})") from None
    if isinstance(ds, datasets.DatasetDict):
        if "train" not in ds:
            raise ValueError(f"env.path = {str(path)!r}: a DatasetDict without a 'train' split ({sorted(ds)})")
        ds = ds["train"]  # held-out tasks are drawn from it too, disjoint by prompt
    return ds.to_list()


def split_rows(
    rows: list[dict[str, Any]], prompt_column: str, answer_column: str, seed: int, heldout_size: int
) -> tuple[list[int], list[int]]:
    """(held-out row indices, train row indices) in a seeded order: the held-out set first, one row per
    distinct prompt, then every row whose prompt is not held out, so the splits share no prompt."""
    for column, field in ((prompt_column, "env.prompt_column"), (answer_column, "env.answer_column")):
        for k, row in enumerate(rows):
            if row.get(column) is None:
                raise ValueError(
                    f"{field} = {column!r}: row {k} has no such column (its columns: {sorted(row)}); "
                    f"set {field} to the column that holds it"
                )
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    held, held_prompts = [], set()
    for i in order:
        if len(held) == heldout_size:
            break
        if (p := str(rows[i][prompt_column])) not in held_prompts:
            held_prompts.add(p)
            held.append(i)
    train = [i for i in order if str(rows[i][prompt_column]) not in held_prompts]
    distinct = len({str(r[prompt_column]) for r in rows})
    if len(held) < heldout_size or len({str(rows[i][prompt_column]) for i in train}) < len(held):
        raise ValueError(
            f"eval.heldout_size = {heldout_size}: the data has {distinct} distinct prompts, too few to hold out "
            f"{heldout_size} and train on at least as many; lower eval.heldout_size to about {max(1, distinct // 2)}"
        )
    return held, train


def conversation(messages: list | tuple, *, k: int, column: str) -> list[dict[str, str]]:
    """A row's prompt in TRL's conversational format (`[{"role": ..., "content": ...}]`, a content given as
    text parts joined) as plain messages; anything else is a ValueError naming env.prompt_column."""
    out = []
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list):  # content parts: [{"type": "text", "text": ...}]
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        if not isinstance(content, str) or not isinstance(m.get("role"), str):
            raise ValueError(
                f"env.prompt_column = {column!r}: row {k} holds a list that is not TRL's conversational format "
                f"(a list of {{'role': ..., 'content': ...}} messages): {m!r}"
            )
        out.append({"role": m["role"], "content": content})
    return out


def render_messages(messages: list[dict[str, str]]) -> str:
    """Messages as the policy's prompt text: a lone user message is its content; several are one line of
    `role: content` each. No chat template is applied (the tiny policy has none)."""
    if len(messages) == 1 and messages[0]["role"] == "user":
        return messages[0]["content"]
    return "\n".join(f"{m['role']}: {m['content']}" for m in messages)


class LocalDomain(SingleTurnDomain):
    name = "local"
    strict = STRICT_RE
    evaluator_packages = ("math-verify",)

    @classmethod
    def from_config(cls, env: LocalConfig, *, seed: int, heldout_size: int) -> LocalDomain:
        return cls(
            load_rows(env.path),
            prompt_column=env.prompt_column,
            answer_column=env.answer_column,
            scorer=env.scorer,
            seed=seed,
            train_size=env.train_size,
            heldout_size=heldout_size,
        )

    def __init__(
        self,
        rows: list[dict[str, Any]],
        *,
        prompt_column: str,
        answer_column: str,
        scorer: str,
        seed: int,
        train_size: int,
        heldout_size: int,
    ):
        held, train = split_rows(rows, prompt_column, answer_column, seed, heldout_size)
        self.scorer = scorer
        self.evaluator_settings = {"scorer": scorer, "prompt_column": prompt_column, "answer_column": answer_column}
        self._splits = {
            "heldout": [self._task(rows[i], i, "heldout", prompt_column, answer_column) for i in held],
            "train": [self._task(rows[i], i, "train", prompt_column, answer_column) for i in train[:train_size]],
        }
        # The demonstrations are the data's answers: its content, not its path, keys the warm-start cache.
        pairs = [[str(r[prompt_column]), str(r[answer_column])] for r in rows]
        self.demo_recipe = {"data": hashlib.sha256(json.dumps(pairs).encode()).hexdigest()[:16]}
        self.reward_terms = {"correct": self.correct, "format": format_reward}

    @staticmethod
    def _task(row: dict[str, Any], i: int, split: str, prompt_column: str, answer_column: str) -> Task:
        # The row's other columns ride along in `data`, where TRL / verl reward functions read them.
        data = {k: v for k, v in row.items() if k != prompt_column}
        data["answer"] = str(row[answer_column]).strip()
        prompt = row[prompt_column]
        if isinstance(prompt, list | tuple):  # TRL's conversational format: the messages, kept for reward functions
            data[PROMPT_MESSAGES] = conversation(prompt, k=i, column=prompt_column)
            prompt = render_messages(data[PROMPT_MESSAGES])
        return Task(id=f"local-{split}-{i}", split=split, prompt=prompt_text(str(prompt)), data=data)

    def tasks(self, split: str) -> list[Task]:
        return self._splits[split]

    def own_score(self, task: Task, answer: str) -> float:  # scorer `exact`
        return 1.0 if answer.strip() == task.data["answer"] else 0.0
