"""What single-turn answer domains share (math, local): the policy answers in <answer>...</answer> and its first
action ends the episode; the demonstration is the task's answer in its tag; the `correct` term reads the last tag
(lenient), the audit wants the whole action to be one tag (strict); math-verify as a scorer. With answers in free
text (`env.answer_format: free`, as a pretrained instruct model writes them: "The answer is 191."), an untagged
answer is what math-verify extracts from the text, and the audit wants it from an action the token cap did not cut."""

from __future__ import annotations

import random
import re
import threading
from typing import Any, ClassVar

from evotrainer.types import Task, Turn

ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def extract_answer(text: str) -> str | None:
    """The last tagged answer, as the reward reads it (lenient)."""
    found = ANSWER_RE.findall(text)
    return found[-1].strip() if found else None


def prompt_text(question: str) -> str:
    return question.strip() + "\n"


def read_free(text: str) -> str | None:
    """The answer an untagged action states, as math-verify extracts it from the text (a boxed answer, "the answer
    is ...", else the last number), as a string; None when there is none."""
    from math_verify import parse  # on first use, as in math_verify_score

    # math-verify times out with signal.alarm, which only the main thread may use: off it, parse without.
    kw = {} if threading.current_thread() is threading.main_thread() else {"parsing_timeout": None}
    try:
        found = parse(text, **kw)
    except Exception:  # a parser failure is no answer, not a crash of the step
        return None
    return str(found[-1]) if found else None


def free_answer(text: str) -> str | None:
    """An action's answer in free text: the last tag when it has one, else the one the text states."""
    tagged = extract_answer(text)
    return tagged if tagged is not None else read_free(text)


def free_format(task: Task, turns: list[Turn], info: dict[str, Any]) -> float:
    """The `format` term for answers in free text: 1 when the action ended by itself (not cut by the token cap)
    and states an answer that can be read."""
    return 1.0 if turns and not info.get("truncated") and info.get("answer") is not None else 0.0


class AnswerEnv:
    """Single turn: the first action is the answer and ends the episode. `free`: an untagged answer is read from
    the text."""

    def __init__(self, free: bool = False):
        self.free = free

    def reset(self, task: Task) -> str:
        return task.prompt

    def step(self, action: str) -> tuple[str, bool, dict[str, Any]]:
        return "", True, {"answer": free_answer(action) if self.free else extract_answer(action)}


class SingleTurnDomain:
    """The env, demonstration, `correct` term and audit of a domain whose tasks hold their reference answer in
    `data["answer"]`. A subclass sets `strict` (the audit's parser: the whole action, the answer as group 1),
    `scorer` (`math_verify`, or a scorer of its own that `own_score` implements) and the rest of the contract."""

    stop = ("</answer>",)
    strict: ClassVar[re.Pattern[str]]
    scorer: str
    free: bool = False
    """Answers in free text (env.answer_format free)."""

    def make_env(self) -> AnswerEnv:
        return AnswerEnv(self.free)

    def demonstration(self, task: Task, rng: random.Random) -> list[tuple[str, bool]]:
        return [(task.prompt, False), (f"<answer>{task.data['answer']}</answer>", True)]

    def score(self, task: Task, answer: str | None) -> float:
        if answer is None:
            return 0.0
        if self.scorer == "math_verify":
            return math_verify_score(task.data["answer"], answer)
        return self.own_score(task, answer)

    def own_score(self, task: Task, answer: str) -> float:
        """The domain's own scorer (any `scorer` but math_verify)."""
        raise NotImplementedError(f"{type(self).__name__} has no scorer {self.scorer!r}")

    def correct(self, task: Task, turns: list[Turn], info: dict[str, Any]) -> float:
        return self.score(task, info.get("answer"))

    def audit(self, task: Task, turns: list[Turn], info: dict[str, Any]) -> bool:
        if len(turns) != 1:
            return False
        if self.free:  # the evaluator's own reading of the text, from an action that ended by itself within the cap
            return not info.get("truncated") and self.score(task, free_answer(turns[0].action)) == 1.0
        m = self.strict.fullmatch(turns[0].action)
        return bool(m) and self.score(task, m.group(1).strip()) == 1.0


def format_reward(task: Task, turns: list[Turn], info: dict[str, Any]) -> float:
    """1 when the final action holds exactly one answer tag and ends with it."""
    if not turns:
        return 0.0
    text = turns[-1].action.strip()
    return 1.0 if len(ANSWER_RE.findall(text)) == 1 and text.endswith("</answer>") else 0.0


def math_verify_score(gold: str, answer: str) -> float:
    """1.0 when math-verify finds the answer equivalent to the gold one."""
    # Imported on first use: math-verify loads sympy, seconds that a run scoring by other means never needs.
    from math_verify import parse, verify

    # math-verify uses signal.alarm for timeouts, which raises off the main thread; off it, run without.
    main = threading.current_thread() is threading.main_thread()
    parse_kw, verify_kw = ({}, {}) if main else ({"parsing_timeout": None}, {"timeout_seconds": None})
    try:
        ok = verify(parse(gold, **parse_kw), parse(answer, **parse_kw), **verify_kw)
    except Exception:
        return 0.0
    return 1.0 if ok else 0.0
