"""Reward terms by import path (`env.reward_functions`): a TRL reward function or a verl `compute_score`,
wrapped into a per-rollout term of the domain, so it is stored on every rollout like a built-in term and a
harness can weight, replay or remove it. Each is called on demonstrations before anything runs."""

from __future__ import annotations

import importlib
import inspect
import math
import numbers
import random
from collections.abc import Callable
from typing import Any

from evotrainer.envs.env import Domain, RewardFn, replay
from evotrainer.errors import ConfigError, UserError
from evotrainer.types import Task, Turn

# verl's compute_score names these; a function that names them is verl's, any other is TRL's.
VERL_PARAMS = ("data_source", "solution_str", "ground_truth")
# Demonstrations each term is called on at start-up: enough to catch a wrong shape, cheap for a slow term.
CHECK_TASKS = 3


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


def import_function(name: str, path: str) -> Callable[..., Any]:
    """The function at `module:attribute`; a mistake is a ConfigError naming the field."""
    module, sep, attr = path.partition(":")
    if not sep or not module or not attr:
        raise ConfigError(f"{_field(name)} = {path!r}: write the import path as 'module:function'")
    try:
        fn = getattr(importlib.import_module(module), attr)
    except ImportError as e:
        raise ConfigError(
            f"{_field(name)} = {path!r}: cannot import {module!r} ({e}); put its directory on PYTHONPATH "
            "or install its package"
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
        # TRL passes the batch's dataset columns as lists; here a batch is the one rollout.
        columns = {"prompts": [task.prompt], "completions": [completion_text(turns)]}
        columns |= {k: [v] for k, v in task.data.items() if k not in columns}
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
        extra = {**task.data, "task_id": task.id, "split": task.split}
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


def add_reward_functions(domain: Domain, functions: dict[str, str]) -> None:
    """Import, wrap and check each configured function, then add it to the domain's terms. Called on
    a few demonstrations now, so a wrong shape stops the run before anything is written."""
    if not functions:
        return
    clash = sorted(set(functions) & set(domain.reward_terms))
    if clash:
        raise ConfigError(
            f"{_field(clash[0])}: {domain.name} already has a term named {clash[0]!r}; choose another name"
        )
    terms = {name: wrap(name, import_function(name, path), domain.name) for name, path in functions.items()}
    tasks = domain.tasks("train")[:CHECK_TASKS]
    for task in tasks:
        demo = domain.demonstration(task, random.Random(0))
        _, turns, info = replay(domain, task, demo)
        for name, term in terms.items():
            try:
                term(task, turns, info)
            except UserError as e:
                raise ConfigError(f"{e} (checked on the demonstration of task {task.id})") from None
            except Exception as e:  # the user's code: any failure here is a config mistake to name
                raise ConfigError(
                    f"{_field(name)} = {functions[name]!r} failed on the demonstration of task {task.id}: "
                    f"{type(e).__name__}: {e}"
                ) from None
    # A new dict, not an update: a domain's terms may be a class attribute that other instances share.
    domain.reward_terms = {**domain.reward_terms, **terms}
