"""What every stage reads (the run's config, directory, domain, store, ledger, skills, executor, proposer
and held-out split), and run_stage: a stage body runs once; its typed result, its records and its done
mark commit in one ledger transaction, and a resumed run reads the result back instead of redoing it."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel

from evotrainer.backtest.executors import Executor
from evotrainer.backtest.trial import ArmResult, ArmSpec
from evotrainer.backtest.verdict import TrialRecord, VerdictRecord
from evotrainer.config import RunConfig
from evotrainer.envs.env import Domain
from evotrainer.harness.harness import Harness
from evotrainer.ids import branch_id
from evotrainer.proposers.proposer import Proposer
from evotrainer.skills.library import SkillLibrary
from evotrainer.stages.results import BranchRecord
from evotrainer.store.ledger import Charge, Ledger
from evotrainer.store.rollouts import RolloutStore
from evotrainer.trackers.forward import Forwarder
from evotrainer.types import Task


@dataclass
class RunContext:
    cfg: RunConfig
    run_dir: Path
    domain: Domain
    store: RolloutStore
    ledger: Ledger
    skills: SkillLibrary
    executor: Executor
    proposer: Proposer
    gate_ids: list[str]
    """Held-out tasks the gate compares arms on."""
    final_ids: list[str]
    """Held-out tasks read only at the start and at the end (never by a gate decision)."""
    tracking: Forwarder | None = None
    """The trackers of `run.report_to` (None when it names none); sent what each stage commits."""

    @property
    def check_ids(self) -> list[str]:
        """The gate tasks the race's checkpoints, an arm's fork point and the guard read (gate.checkpoint_tasks): a
        prefix, so that a task's place, and its rollout's id, is the same in either read."""
        n = self.cfg.gate.checkpoint_tasks
        return self.gate_ids[:n] if n else self.gate_ids

    def heldout(self, ids: list[str]) -> list[Task]:
        by_id = {t.id: t for t in self.domain.tasks("heldout")}
        return [by_id[i] for i in ids]

    def spec(
        self, branch: str, role: str, start: str, harness: Harness, first: int, steps: int, seed: int, gate: bool
    ) -> ArmSpec:
        """An arm forked from checkpoint `start`, trained `steps` steps from step `first`; evaluated on the
        gate tasks when `gate`."""
        return ArmSpec(
            branch=branch,
            role=role,
            run_dir=str(self.run_dir),
            config=self.cfg.model_dump(mode="json"),
            harness=harness.model_dump(mode="json"),
            start=start,
            seed=seed,
            first_step=first,
            steps=steps,
            gate_ids=tuple(self.gate_ids) if gate else None,
            checkpoint_tasks=len(self.check_ids) if self.check_ids != self.gate_ids else 0,
            reference=str(self.run_dir / "checkpoints" / branch_id(0, "base")),
        )


def tokens_left(ctx: RunContext) -> int:
    """Generated tokens the budget still allows (0: no token budget, or it is spent)."""
    cap = ctx.cfg.budget.generated_tokens
    return max(0, cap - ctx.ledger.spent().generated_tokens) if cap else 0


@dataclass
class StageRecords:
    """What a stage writes to the ledger besides its result, in the same transaction."""

    branches: list[BranchRecord] = field(default_factory=list)
    trials: list[TrialRecord] = field(default_factory=list)
    verdicts: list[VerdictRecord] = field(default_factory=list)
    charges: dict[str, Charge] = field(default_factory=dict)
    uncharged_seconds: float = 0.0
    """Seconds of the stage outside the loop's budget (the one-time, cached warm start)."""


R = TypeVar("R", bound=BaseModel)


def run_stage(ctx: RunContext, rnd: int, name: str, model: type[R], work: Callable[[], tuple[R, StageRecords]]) -> R:
    """Run a stage unless the ledger has it; charge its seconds; commit its records and mark together."""
    if (done := ctx.ledger.stage_result(rnd, name)) is not None:
        return model.model_validate(done)
    ctx.ledger.set_status(rnd, name)
    t0 = time.perf_counter()
    result, records = work()
    charges = dict(records.charges)
    elapsed = time.perf_counter() - t0 - records.uncharged_seconds
    charges.setdefault("stage", Charge(seconds=elapsed - sum(c.seconds for c in charges.values())))
    ctx.ledger.finish_stage(
        rnd,
        name,
        result.model_dump(mode="json"),
        charges=charges,
        branches=[b.model_dump() for b in records.branches],
        trials=[t.model_dump(mode="json") for t in records.trials],
        verdicts=[v.model_dump(mode="json", exclude={"decided"}) for v in records.verdicts],
    )
    if ctx.tracking is not None:
        ctx.tracking.sync(ctx.ledger, ctx.store)
    return result


def arm_charge(r: ArmResult) -> Charge:
    return Charge(r.generated_tokens + r.eval_tokens, r.trained_tokens, r.seconds)


def split_heldout(ids: list[str], final_fraction: float, seed: int) -> tuple[list[str], list[str]]:
    """Gate tasks and final tasks, disjoint and seeded: gate decisions never read the final tasks."""
    order = sorted(ids)
    random.Random(f"heldout-split:{seed}").shuffle(order)
    n_final = max(1, round(len(order) * final_fraction))
    return sorted(order[n_final:]), sorted(order[:n_final])
