"""The evaluator: held-out accuracy as a function of the policy and the held-out tasks only. It reads
no harness (greedy decoding, its own token and turn caps) and scores with the domain's audit."""

from __future__ import annotations

import hashlib
import inspect
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.progress import Progress

from evotrainer import sandbox
from evotrainer.config import EvalSection, RunConfig
from evotrainer.envs.env import Domain
from evotrainer.harness.rewards import score
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
    outcomes: dict[str, bool]  # task id -> audit passed
    episodes: list[Episode]
    evaluator_hash: str


def evaluator_hash(domain: Domain, tasks: list[Task], cfg: EvalSection) -> str:
    """Hash of the evaluator's code (this module, the episode runner, the domain's package, e.g. envs/swe/
    with its runner and repository generator, and the sandbox that runs hidden tests) and of its data."""
    h = hashlib.sha256()
    module = Path(inspect.getfile(type(domain)))
    files = [
        Path(__file__),
        Path(rollout.__file__),
        *sorted(module.parent.glob("*.py")),
        *sorted(Path(sandbox.__file__).parent.glob("*.py")),
    ]
    for f in dict.fromkeys(files):
        h.update(f.read_bytes())
    h.update(cfg.model_dump_json().encode())
    for t in tasks:
        h.update(json.dumps([t.id, t.prompt, t.data.get("answer")], default=str).encode())
    return "e-" + h.hexdigest()[:12]


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
    outcomes = {ep.task.id: bool(domain.audit(ep.task, ep.turns, ep.info)) for ep in episodes}
    acc = sum(outcomes.values()) / max(len(outcomes), 1)
    return EvalResult(acc, outcomes, episodes, evaluator_hash(domain, tasks, cfg))


def record_eval(
    store: RolloutStore, cfg: RunConfig, domain: Domain, result: EvalResult, step: int, ctx: StepContext
) -> None:
    """Held-out rollouts go to the store too, with their audit outcome, so findings can cite them."""
    h = cfg.harness
    scored = [score(h, domain, ep.task, ep.turns, ep.info, ep.termination) for ep in result.episodes]
    audits = [result.outcomes[ep.task.id] for ep in result.episodes]
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
