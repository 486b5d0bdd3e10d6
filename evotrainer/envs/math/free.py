"""Answers in free text (`env.answer_format: free`), as an instruct model writes them ("The answer is 191."):
read by math-verify's extraction where no answer tag is given; the format term and the audit for that case."""

from __future__ import annotations

from typing import Any

from evotrainer.types import Task, Turn


def read_free(text: str) -> str | None:
    """The answer an untagged action states, as math-verify extracts it from the text (a boxed answer, "the answer
    is ...", else the last number), as a string; None when there is none."""
    found = _parse(text)
    return str(found[-1]) if found else None


def _parse(text: str) -> list[Any]:
    # math-verify times out with signal.alarm, which only the main thread may use: off it, parse without.
    import threading

    from math_verify import parse

    kw = {} if threading.current_thread() is threading.main_thread() else {"parsing_timeout": None}
    try:
        return parse(text, **kw)
    except Exception:  # a parser failure is no answer, not a crash of the step
        return []


def free_format(task: Task, turns: list[Turn], info: dict[str, Any]) -> float:
    """1 when the action ended by itself (not cut by the token cap) and states an answer that can be read."""
    return 1.0 if turns and not info.get("truncated") and info.get("answer") is not None else 0.0
