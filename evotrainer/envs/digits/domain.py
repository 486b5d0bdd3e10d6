"""A small multi-turn test environment: the policy asks for a hidden number's digits one tool call at
a time, then answers. It exercises turns, the turn cap and malformed actions with a tiny model."""

from __future__ import annotations

import random
import re
from typing import Any

from evotrainer.envs.digits.config import DigitsConfig
from evotrainer.types import Task, Turn

ASK_RE = re.compile(r"ask (\d+)\n?")
ANSWER_RE = re.compile(r"answer (\d+)\n?")


class DigitsEnv:
    def __init__(self, infra_error_rate: float = 0.0) -> None:
        self.secret = ""
        self.task_id = ""
        self.calls = 0
        self.infra_error_rate = infra_error_rate

    def reset(self, task: Task) -> str:
        self.secret = task.data["secret"]
        self.task_id = task.id
        self.calls = 0
        return task.prompt

    def step(self, action: str) -> tuple[str, bool, dict[str, Any]]:
        self.calls += 1
        if self.infra_error_rate and self.secret:
            # A simulated flaky tool backend, seeded by (task, call, action) so runs stay reproducible.
            if random.Random(f"{self.task_id}:{self.calls}:{action}").random() < self.infra_error_rate:
                return "", True, {"termination": "error", "tool_error": False}
        action = action.strip()
        if m := ASK_RE.fullmatch(action):
            pos = int(m.group(1))
            if 1 <= pos <= len(self.secret):
                return f"digit {pos} is {self.secret[pos - 1]}\n> ", False, {"tool_error": False}
            return f"error: position must be 1 to {len(self.secret)}\n> ", False, {"tool_error": True}
        if m := ANSWER_RE.fullmatch(action):
            return "", True, {"answer": m.group(1), "tool_error": False}
        return "error: use 'ask <position>' or 'answer <number>'\n> ", False, {"tool_error": True}


class DigitsDomain:
    name = "digits"
    stop = ("\n",)
    demo_recipe: dict[str, Any] = {}
    evaluator_packages: tuple[str, ...] = ()

    @classmethod
    def from_config(cls, env: DigitsConfig, *, seed: int, heldout_size: int) -> DigitsDomain:
        return cls(
            seed=seed,
            num_digits=env.num_digits,
            train_size=env.train_size,
            heldout_size=heldout_size,
            infra_error_rate=env.infra_error_rate,
        )

    def __init__(
        self, *, seed: int, num_digits: int, train_size: int, heldout_size: int, infra_error_rate: float = 0.0
    ):
        self.evaluator_settings = {"num_digits": num_digits, "infra_error_rate": infra_error_rate}
        self.num_digits = num_digits
        self.infra_error_rate = infra_error_rate
        space = 9 * 10 ** (num_digits - 1)
        if heldout_size >= space:
            raise ValueError(
                f"eval.heldout_size={heldout_size} leaves no train numbers among {space} {num_digits}-digit numbers"
            )
        rng = random.Random(seed)
        # Held-out numbers are drawn first and never appear in the train pool.
        heldout = set()
        while len(heldout) < heldout_size:
            heldout.add(self._draw(rng))
        train: list[str] = []
        while len(train) < min(train_size, space - heldout_size):
            s = self._draw(rng)
            if s not in heldout:
                train.append(s)
        self._splits = {
            "train": [self._task(s, "train", i) for i, s in enumerate(train)],
            "heldout": [self._task(s, "heldout", i) for i, s in enumerate(sorted(heldout))],
        }
        self.reward_terms = {"correct": correct, "format": well_formed}

    def _draw(self, rng: random.Random) -> str:
        return str(rng.randrange(10 ** (self.num_digits - 1), 10**self.num_digits))

    def _task(self, secret: str, split: str, i: int) -> Task:
        # Every prompt is the same text: what differs between tasks, and is disjoint between the
        # splits, is the hidden number.
        prompt = f"Find the hidden {self.num_digits}-digit number. Commands: ask <position>, answer <number>.\n> "
        return Task(id=f"digits-{split}-{i}", split=split, prompt=prompt, data={"secret": secret, "answer": secret})

    def tasks(self, split: str) -> list[Task]:
        return self._splits[split]

    def make_env(self) -> DigitsEnv:
        return DigitsEnv(self.infra_error_rate)

    def demonstration(self, task: Task, rng: random.Random) -> list[tuple[str, bool]]:
        """A scripted solver with noise. Half the time it answers before asking the last digit and
        guesses it, so a warm-started policy's most likely move is to answer too early: RL has to
        learn to gather every digit first. It also skips another digit, sends a malformed command,
        or asks a position twice now and then."""
        secret = task.data["secret"]
        env = DigitsEnv()
        segments: list[tuple[str, bool]] = [(env.reset(task), False)]
        known: dict[int, str] = {}
        positions = list(range(1, len(secret) + 1))
        roll = rng.random()
        if roll < 0.5:  # answers early: the last digit is guessed
            positions.pop()
        elif roll < 0.65:  # skips one other position and guesses it
            positions.remove(rng.choice(positions))
        elif roll < 0.75:  # a malformed command first
            segments += self._act(env, rng.choice(["tell 1\n", "ask\n", "answer\n", "ask one\n"]), known)
        elif roll < 0.85:  # asks one position twice
            positions.insert(rng.randrange(len(positions)), rng.choice(positions))
        for pos in positions:
            segments += self._act(env, f"ask {pos}\n", known)
        guess = "".join(known.get(i, str(rng.randrange(10))) for i in range(1, len(secret) + 1))
        segments += self._act(env, f"answer {guess}\n", known)
        return segments

    @staticmethod
    def _act(env: DigitsEnv, action: str, known: dict[int, str]) -> list[tuple[str, bool]]:
        obs, _, _ = env.step(action)
        if m := re.match(r"digit (\d+) is (\d)", obs):
            known[int(m.group(1))] = m.group(2)
        return [(action, True), (obs, False)] if obs else [(action, True)]

    def audit(self, task: Task, turns: list[Turn], info: dict[str, Any]) -> bool:
        return info.get("answer") == task.data["secret"]


def correct(task: Task, turns: list[Turn], info: dict[str, Any]) -> float:
    return 1.0 if info.get("answer") == task.data["secret"] else 0.0


def well_formed(task: Task, turns: list[Turn], info: dict[str, Any]) -> float:
    """Share of the episode's actions that were valid commands."""
    if not turns:
        return 0.0
    return sum(not t.tool_error for t in turns) / len(turns)
