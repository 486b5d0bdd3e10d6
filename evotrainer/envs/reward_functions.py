"""Reward terms by import path (`env.reward_functions`): a TRL reward function or a verl `compute_score`,
wrapped into a per-rollout term of the domain, so it is stored on every rollout like a built-in term and a
harness can weight, replay or remove it. Each is called on a first batch's worth of completions before
anything runs."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import math
import numbers
import os
import random
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

from evotrainer.envs.env import Domain, RewardFn, replay
from evotrainer.errors import ConfigError, UserError
from evotrainer.types import Task, Turn

# verl's compute_score names these; a function that names them is verl's, any other is TRL's.
VERL_PARAMS = ("data_source", "solution_str", "ground_truth")
PROMPT_MESSAGES = "prompt_messages"
"""Task.data key of a conversational prompt's messages (TRL's `[{role, content}]`), where the data had them: a
TRL function then gets prompts and completions as messages, as TRL gives them for such a dataset."""


def completion_text(turns: list[Turn]) -> str:
    """What the policy wrote after the prompt, with the env's answers between its actions (the last
    observation, which the policy never saw, is left out); a single-turn rollout's is its action."""
    parts = []
    for k, t in enumerate(turns):
        parts.append(t.action)
        if k < len(turns) - 1:
            parts.append(t.observation)
    return "".join(parts)


def _field(name: str) -> str:
    return f"env.reward_functions.{name}"


def import_user_module(module: str) -> ModuleType:
    """A user's module by name, found as `python -m` would find it: installed, on PYTHONPATH, or in the
    working directory (which a console script does not put on the path; `env.path` is read from there too).
    The working directory goes last, so a file there never shadows an installed package."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)
    return importlib.import_module(module)


def import_function(name: str, path: str) -> Callable[..., Any]:
    """The function at `module:attribute`; a mistake is a ConfigError naming the field."""
    module, sep, attr = path.partition(":")
    if not sep or not module or not attr:
        raise ConfigError(f"{_field(name)} = {path!r}: write the import path as 'module:function'")
    try:
        fn = getattr(import_user_module(module), attr)
    except ImportError as e:
        raise ConfigError(
            f"{_field(name)} = {path!r}: cannot import {module!r} ({e}) from the working directory, PYTHONPATH "
            "or the installed packages; run from the directory that holds it, or install its package"
        ) from None
    except AttributeError:
        raise ConfigError(f"{_field(name)} = {path!r}: module {module!r} has no attribute {attr!r}") from None
    if not callable(fn):
        raise ConfigError(f"{_field(name)} = {path!r}: {attr!r} is not a function")
    return fn


def wrap(name: str, fn: Callable[..., Any], domain_name: str) -> RewardFn:
    """A per-rollout term around a TRL or verl function, chosen by the names in its signature."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        raise ConfigError(f"{_field(name)}: cannot read the signature of {fn!r}") from None
    if all(p in params for p in VERL_PARAMS):
        return _verl_term(name, fn, domain_name)
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    if "completions" not in params and not takes_any:
        raise ConfigError(
            f"{_field(name)}: {getattr(fn, '__name__', fn)}{inspect.signature(fn)} is neither a TRL reward "
            "function `(prompts, completions, **kwargs) -> list[float | None]` nor a verl "
            "`compute_score(data_source, solution_str, ground_truth, extra_info)`; change its parameters"
        )
    if "completion_ids" in params:
        # Token ids are not stored on rollouts, so a replay could not recompute such a term.
        raise ConfigError(
            f"{_field(name)}: the function names `completion_ids`, which EvoTrainer does not pass (rollouts keep "
            "text, not token ids); read `completions` instead, or take **kwargs"
        )
    return _trl_term(name, fn, params, takes_any)


def _trl_term(name: str, fn: Callable[..., Any], params: Any, takes_any: bool) -> RewardFn:
    def term(task: Task, turns: list[Turn], info: dict[str, Any]) -> float:
        # TRL passes the batch's dataset columns as lists; here a batch is the one rollout. A conversational
        # prompt comes as its messages and the completion as one assistant message, as TRL passes them.
        prompt, completion = task.prompt, completion_text(turns)
        if (messages := task.data.get(PROMPT_MESSAGES)) is not None:
            prompt, completion = messages, [{"role": "assistant", "content": completion}]
        columns = {"prompts": [prompt], "completions": [completion]}
        columns |= {k: [v] for k, v in task.data.items() if k not in columns and k != PROMPT_MESSAGES}
        kwargs = columns if takes_any else {k: v for k, v in columns.items() if k in params}
        out = fn(**kwargs)
        if not isinstance(out, (list, tuple)) or len(out) != 1:
            got = f"a list of {len(out)}" if isinstance(out, (list, tuple)) else type(out).__name__
            raise UserError(f"{_field(name)}: returned {got} for 1 completion; return one value per completion")
        # TRL's None: the term does not apply to this sample and adds nothing to its reward (TRL sums
        # the weighted terms with nansum), so it is stored as 0.0 and totals replay as TRL's would.
        return 0.0 if out[0] is None else _number(name, out[0])

    return term


def _verl_term(name: str, fn: Callable[..., Any], domain_name: str) -> RewardFn:
    def term(task: Task, turns: list[Turn], info: dict[str, Any]) -> float:
        data = {k: v for k, v in task.data.items() if k != PROMPT_MESSAGES}
        extra = {**data, "task_id": task.id, "split": task.split}
        out = fn(
            data_source=task.data.get("data_source", domain_name),
            solution_str=completion_text(turns),
            ground_truth=task.data.get("answer"),
            extra_info=extra,
        )
        if isinstance(out, dict):  # verl's reward managers read the "score" key of a dict
            if "score" not in out:
                raise UserError(f"{_field(name)}: returned a dict without a 'score' key ({sorted(out)})")
            out = out["score"]
        return _number(name, out)

    return term


def _number(name: str, value: Any) -> float:
    """A finite float, or a UserError naming the term: a NaN would poison every total it enters."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):  # numpy scalars are Real
        raise UserError(f"{_field(name)}: returned {value!r} ({type(value).__name__}); return a number")
    out = float(value)
    if not math.isfinite(out):
        raise UserError(f"{_field(name)}: returned {out}; return a finite number (None where it does not apply)")
    return out


_CHECKED: set[tuple[str, str, tuple[str, ...], int]] = set()
"""(import path, domain, task ids, generations) of each check a function passed in this process."""


def add_reward_functions(domain: Domain, functions: dict[str, str], prompts: int = 16, generations: int = 8) -> None:
    """Import, wrap and check each configured function, then add it to the domain's terms. Each is called on a
    first batch's worth of completions now (`prompts` tasks, `generations` each: see check_batch), so a wrong
    shape, even for some completions only, stops the run before anything is written."""
    if not functions:
        return
    clash = sorted(set(functions) & set(domain.reward_terms))
    if clash:
        raise ConfigError(
            f"{_field(clash[0])}: {domain.name} already has a term named {clash[0]!r}; choose another name"
        )
    terms = {name: wrap(name, import_function(name, path), domain.name) for name, path in functions.items()}
    # Each arm of a loop run builds its domain again: a function passed on these tasks is not called on them
    # again in this process (a judge behind an API would pay a batch per arm).
    tasks = tuple(t.id for t in domain.tasks("train")[:prompts])
    keys = {name: (functions[name], domain.name, tasks, generations) for name in terms}
    unchecked = {name: term for name, term in terms.items() if keys[name] not in _CHECKED}
    for task, turns, info, what in check_batch(domain, prompts, generations) if unchecked else []:
        for name, term in unchecked.items():
            try:
                term(task, turns, info)
            except UserError as e:
                raise ConfigError(f"{e} (checked on {what} of task {task.id})") from None
            except Exception as e:  # the user's code: any failure here is a config mistake to name
                raise ConfigError(
                    f"{_field(name)} = {functions[name]!r} failed on {what} of task {task.id}: {type(e).__name__}: {e}"
                ) from None
    _CHECKED.update(keys[name] for name in unchecked)
    # A new dict, not an update: a domain's terms may be a class attribute that other instances share.
    domain.reward_terms = {**domain.reward_terms, **terms}


def check_batch(domain: Domain, prompts: int, generations: int) -> list[tuple[Task, list[Turn], dict[str, Any], str]]:
    """What a user's term is checked on before a policy exists: a first batch's worth of train tasks, each
    with `generations` completions as a first batch has them: the domain's demonstrations (distinct draws
    only: a drawn one is replayed through the env), and the kinds a policy writes from its first step that
    a demonstration never is: one cut short by the token cap, and an empty one. (task, turns, info, what)."""
    out = []
    for task in domain.tasks("train")[:prompts]:
        seen: set[str] = set()
        for k in range(max(1, generations - 2)):
            demo = domain.demonstration(task, random.Random(k))
            if (key := repr(demo)) in seen:
                continue
            seen.add(key)
            _, turns, info = replay(domain, task, demo)
            out.append((task, turns, info, "the demonstration" if k == 0 else f"demonstration {k}"))
        _, turns, info, _ = out[-1]
        if turns:  # the last action as a policy leaves it: cut at half its length, and empty
            last = turns[-1].action
            for cut, what in ((last[: len(last) // 2], "a completion cut short"), ("", "an empty completion")):
                out.append((task, [*turns[:-1], dataclasses.replace(turns[-1], action=cut)], info, what))
    return out
