"""The evaluator: held-out accuracy as a function of the policy and the held-out tasks only. It reads
no harness (greedy decoding, its own token and turn caps) and scores with the domain's audit."""

from __future__ import annotations

import ast
import hashlib
import inspect
import json
import platform
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import torch
from rich.progress import Progress

from evotrainer import sandbox, types
from evotrainer.config import EvalSection
from evotrainer.envs.env import Domain, audit_verdict
from evotrainer.harness.harness import Harness
from evotrainer.harness.rewards import score
from evotrainer.policies import decoders, hf
from evotrainer.policies.hf import HFPolicy
from evotrainer.store.rollouts import RolloutStore
from evotrainer.training import rollout
from evotrainer.training.rollout import Episode, run_episodes
from evotrainer.training.segment import StepContext, to_rollouts
from evotrainer.types import Task

CHUNK = 128


@dataclass
class EvalResult:
    accuracy: float
    outcomes: dict[str, bool]  # task id -> audit passed; a task whose audit had no verdict is absent
    episodes: list[Episode]
    evaluator_hash: str
    infra_failures: list[str] = field(default_factory=list)
    """Tasks whose audit the evaluator's machinery could not run (twice): no verdict, so they are in
    neither the accuracy nor a gate pair, never counted as the policy's failure."""


# Packages whose version can change an outcome on any domain (decoding); a domain names its scorers'.
DECODING_PACKAGES = ("torch", "transformers", "tokenizers")


def evaluator_identity(domain: Domain, tasks: list[Task], cfg: EvalSection) -> dict[str, str]:
    """Everything that can change an evaluator outcome, one digest (or version) per component, so a
    mismatch can say what changed: the code (this module, the episode runner, the policy's decoding,
    the task type, the domain's package, e.g. envs/swe/ with its test runner, the modules its class
    inherits from, and the sandbox that runs hidden tests; Python files by their syntax tree, so
    reformatting changes nothing), the settings (eval, and the domain's own: math's scorer, SWE's
    observation cap...), the data (every held-out task with its hidden data, e.g. hidden tests) and
    the versions of Python and of the packages that decode and score."""
    module = Path(inspect.getfile(type(domain)))
    root = Path(__file__).parent
    # What the domain's class inherits from our package is its code too, outside its folder (envs/single_turn.py:
    # math's and local's env, answer parser, scorer and audit).
    inherited = [Path(inspect.getfile(c)) for c in type(domain).__mro__[1:] if c.__module__.startswith("evotrainer.")]
    files = [
        Path(__file__),
        Path(rollout.__file__),
        Path(hf.__file__),
        Path(decoders.__file__),  # greedy decoding runs through the sampler's own KV cache
        Path(types.__file__),
        *sorted(module.parent.glob("*.py")),
        *inherited,
        *sorted(Path(sandbox.__file__).parent.glob("*.py")),
    ]
    parts = {
        f"code:{f.relative_to(root.parent) if f.is_relative_to(root.parent) else f}": _code_digest(f)
        for f in dict.fromkeys(files)
    }
    parts["settings:eval"] = _digest(cfg.model_dump(mode="json"))
    parts["settings:domain"] = _digest(domain.evaluator_settings)
    parts["data:tasks"] = _digest([[t.id, t.split, t.prompt, t.data] for t in tasks])
    parts["version:python"] = platform.python_version()
    for pkg in (*DECODING_PACKAGES, *domain.evaluator_packages):
        try:
            parts[f"version:{pkg}"] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            parts[f"version:{pkg}"] = "absent"
    return parts


def identity_hash(parts: dict[str, str]) -> str:
    return "e-" + hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:12]


def evaluator_hash(domain: Domain, tasks: list[Task], cfg: EvalSection) -> str:
    return identity_hash(evaluator_identity(domain, tasks, cfg))


def what_changed(old: dict[str, str], new: dict[str, str]) -> list[str]:
    """The components that differ, readably: `version:torch 2.13.0 -> 2.14.1`, `code:evotrainer/... changed`."""
    out = []
    for k in sorted(set(old) | set(new)):
        a, b = old.get(k), new.get(k)
        if a != b:
            out.append(
                f"{k} {a or 'absent'} -> {b or 'absent'}"
                if k.startswith("version:")
                else f"{k} {'added' if a is None else 'removed' if b is None else 'changed'}"
            )
    return out


def _digest(obj: object) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _code_digest(f: Path) -> str:
    text = f.read_text()
    try:
        text = ast.dump(ast.parse(text))
    except SyntaxError:
        pass
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@torch.no_grad()
def evaluate(
    policy: HFPolicy, domain: Domain, tasks: list[Task], cfg: EvalSection, progress: Progress | None = None
) -> EvalResult:
    bar = progress.add_task("held-out eval", total=len(tasks)) if progress else None
    episodes: list[Episode] = []
    for i in range(0, len(tasks), CHUNK):
        chunk = tasks[i : i + CHUNK]
        episodes += run_episodes(
            policy,
            domain,
            chunk,
            max_new_tokens=cfg.max_new_tokens,
            max_turns=cfg.max_turns,
            greedy=True,
            tool_error="feedback",
        )
        if progress:
            progress.update(bar, advance=len(chunk))
    verdicts = {ep.task.id: audit_verdict(domain, ep.task, ep.turns, ep.info) for ep in episodes}
    outcomes = {t: v for t, v in verdicts.items() if v is not None}
    acc = sum(outcomes.values()) / max(len(outcomes), 1)
    infra = [t for t, v in verdicts.items() if v is None]
    return EvalResult(acc, outcomes, episodes, evaluator_hash(domain, tasks, cfg), infra)


def record_eval(
    store: RolloutStore, h: Harness, domain: Domain, result: EvalResult, step: int, ctx: StepContext
) -> None:
    """Held-out rollouts go to the store too, with their audit outcome (scored under harness `h`'s terms), so
    findings can cite them."""
    scored = [score(h, domain, ep.task, ep.turns, ep.info, ep.termination) for ep in result.episodes]
    audits = [result.outcomes.get(ep.task.id) for ep in result.episodes]
    store.append(
        to_rollouts(
            result.episodes,
            [t for t, _ in scored],
            [r for _, r in scored],
            ctx=ctx,
            step=step,
            harness_version=h.version,
            group_size=1,
            kind="e",
            audits=audits,
        ),
        f"{ctx.branch}-e{step:06d}",
    )
