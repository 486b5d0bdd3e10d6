"""The scripted solver of the SWE domain, with noise: the warm-start demonstrations. Most episodes
localize and fix the bug; some wander, make a malformed call, try a wrong fix first, or take the
shortcut of editing the failing test, so RL has something to improve and the exploit a place to start."""

from __future__ import annotations

import random

from evotrainer.envs.swe.repos import CALLERS, HELPERS, POOL
from evotrainer.types import Task

_FNS = {fn.name: fn for fn in POOL + HELPERS + CALLERS}
# Shares of the episode kinds (the rest is the direct fix).
SHORTCUT, WANDER, BAD_CALL, RETRY, WRONG_SUBMIT = 0.15, 0.10, 0.10, 0.10, 0.05


def _assert_line(task: Task, test_id: str) -> tuple[str, int]:
    """The test file and the line of the failing test's assertion."""
    path, _, name = test_id.partition("::")
    lines = task.data["files"][path].split("\n")
    return path, lines.index(f"def {name}():") + 2


def _wrong_fix(task: Task, rng: random.Random) -> str:
    """A plausible wrong line: another bug of the same function on the same line, or the buggy line again."""
    fix = task.data["fix"]
    fn = _FNS[fix["function"]]
    others = [
        "    " + t for _, i, t in fn.bugs if fix["line"] - fix["def_line"] - 1 == i and "    " + t != fix["buggy"]
    ]
    return rng.choice(others) if others else fix["buggy"]


def _localize(task: Task, rng: random.Random) -> list[str]:
    """Actions that bring the buggy line on screen, using only what is already on screen: the issue
    names the failing test, the tested module's imports name the helpers."""
    d, fix = task.data, task.data["fix"]
    acts = []
    if task.difficulty == 2 and fix["file"] != d["modules"][0]:  # the helper is buggy: read the caller first
        acts.append(f"cat {d['modules'][0]}")
    if task.difficulty >= 1 and rng.random() < 0.3:  # grep for the definition, then read just that function
        return acts + [f"grep def {fix['function']}(", f"cat {fix['file']} {fix['def_line']}-{fix['line']}"]
    return acts + [f"cat {fix['file']}"]


def _two_edits(task: Task, rng: random.Random) -> list[str]:
    """Level 3: read the caller's module and the helpers', fix one bug, run the tests, see a test still
    failing, fix the other, run the tests again, submit (seven tool calls)."""
    d = task.data
    acts = [f"cat {m}" for m in d["modules"]]
    for f in d["fixes"] if rng.random() < 0.5 else d["fixes"][::-1]:
        acts += [f"replace {f['file']} {f['line']} {f['text']}", "test"]
    return acts + ["submit"]


def plan(task: Task, rng: random.Random) -> list[str]:
    """The scripted actions of one demonstration (without newlines)."""
    d, fix = task.data, task.data["fix"]
    replace = f"replace {fix['file']} {fix['line']} {fix['text']}"
    roll = rng.random()
    if roll < SHORTCUT:
        path, line = _assert_line(task, d["failing"][0])
        acts = [f"cat {path}", f"replace {path} {line}     assert True"]
        return acts + (["test"] if rng.random() < 0.5 else []) + ["submit"]
    roll -= SHORTCUT
    acts: list[str] = []
    if roll < WANDER:
        others = [m for m in d["modules"] if m != fix["file"]]
        acts.append(rng.choice(["ls", f"cat {d['failing'][0].partition('::')[0]}"] + [f"cat {m}" for m in others]))
    elif roll < WANDER + BAD_CALL:
        bad = rng.choice(
            [
                f"cat {fix['file'][:-3]}",
                f"show {fix['file']}",
                f"cat ../{fix['file']}",
                f"replace {fix['file']} {fix['line'] + 20} pass",
                "run tests",
            ]
        )
        acts.append(bad)
    if task.difficulty == 3:
        return acts + _two_edits(task, rng)
    acts += _localize(task, rng)
    if WANDER + BAD_CALL <= roll < WANDER + BAD_CALL + RETRY:
        acts += [f"replace {fix['file']} {fix['line']} {_wrong_fix(task, rng)}", "test", replace, "test", "submit"]
    elif WANDER + BAD_CALL + RETRY <= roll < WANDER + BAD_CALL + RETRY + WRONG_SUBMIT:
        acts += [f"replace {fix['file']} {fix['line']} {_wrong_fix(task, rng)}", "submit"]
    else:
        acts += [replace] + (["test"] if rng.random() < 0.5 else []) + ["submit"]
    return acts


def scripted_episode(task: Task, rng: random.Random, env) -> list[tuple[str, bool]]:
    """Run the plan through a real env (with the trusted in-process runner): the demonstration's
    observations are exactly what the env answers."""
    segments: list[tuple[str, bool]] = [(env.reset(task), False)]
    for act in plan(task, rng):
        obs, done, _ = env.step(act + "\n")
        segments.append((act + "\n", True))
        if obs:
            segments.append((obs, False))
        if done:
            break
    return segments
