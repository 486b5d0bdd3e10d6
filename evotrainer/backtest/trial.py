"""Trials: arms (candidate, control, A-A control) forked from one checkpoint, trained for the same steps
on the same seeds and task order, and evaluated by the evaluator on the same held-out tasks.

An arm is a pure function of its ArmSpec (start checkpoint, harness, seed, steps), so arms can run in
this process, in worker processes, or on Ray, and a resumed run can skip an arm whose result file
exists. Where arms run is the executor's business (backtest/executors.py)."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict

from evotrainer.backtest.stopping import futile
from evotrainer.config import RunConfig
from evotrainer.envs.registry import make_domain
from evotrainer.evaluation import evaluate, evaluator_hash, record_eval
from evotrainer.harness.harness import Harness
from evotrainer.policies import placement
from evotrainer.policies.hf import HFPolicy
from evotrainer.store.checkpoints import has_weights
from evotrainer.store.files import atomic_write_json
from evotrainer.store.rollouts import RolloutStore
from evotrainer.training.segment import StepContext
from evotrainer.training.trl_backend import make_trainer, run_steps

RESULT = "arm.json"
PASS_RATES = "pass_rates.json"


@dataclass(frozen=True, kw_only=True)
class ArmSpec:
    """Everything an arm needs. `gate_ids`: the held-out tasks the gate compares arms on (None: no
    evaluation, for the mainline segment)."""

    branch: str
    role: str  # segment | control | candidate | aa
    run_dir: str
    config: dict[str, Any]
    harness: dict[str, Any]
    start: str  # checkpoint directory to fork from
    seed: int
    first_step: int
    steps: int
    gate_ids: tuple[str, ...] | None = None
    reference: str | None = None
    """The KL reference (beta > 0): the run's base checkpoint, so every arm's penalty is to the initial model."""
    checkpoints: tuple[int, ...] = ()
    """Where into the arm it is also evaluated on the gate tasks, the race's checkpoints: steps (1..steps-1),
    or generated tokens (0..tokens) when `tokens` is set; a step that passes one is followed by the read.
    A mark 0 reads the policy the arm forks from, before its first step."""
    race: dict[str, dict[str, bool]] | None = None
    """The control's gate outcomes at those checkpoints (by mark, as strings): the arm races it and stops at
    the first checkpoint where stopping.futile says it cannot win. None: it never stops (the control)."""
    race_against: Literal["control", "start"] = "control"
    """What `race` holds: the control's reads, or the start's at every mark (a remedy raced beside a segment that
    carries an exploit, which stops only clearly behind it: stopping.futile)."""
    tokens: int = 0
    """Generated tokens the arm trains to: it stops after the step that reaches them, `steps` being then a
    cap (loop.trial_unit tokens). 0: it trains `steps` steps."""
    checkpoint_tasks: int = 0
    """The first this many gate tasks are what its checkpoints read (gate.checkpoint_tasks); its read after its last
    step, and mark 0's where it trains no step, read them all. 0: every read reads them all."""

    @property
    def checkpoint(self) -> str:
        return str(Path(self.run_dir) / "checkpoints" / self.branch)


class ArmResult(BaseModel):
    """What an arm produced: its checkpoint and harness version, the steps it trained, what it spent,
    its held-out outcomes on the gate tasks (when evaluated), and its mean reward early and late."""

    model_config = ConfigDict(extra="ignore")

    branch: str
    role: str
    checkpoint: str
    harness_version: str
    first_step: int
    last_step: int
    generated_tokens: int
    trained_tokens: int
    seconds: float
    eval_tokens: int = 0
    accuracy: float | None = None
    outcomes: dict[str, bool] = {}
    evaluator_hash: str = ""
    reward_first: float = 0.0
    reward_last: float = 0.0
    checkpoint_outcomes: dict[str, dict[str, bool]] = {}
    """Gate outcomes at the race's checkpoints, by mark (steps or tokens into the arm, as its spec's)."""
    stopped: str = ""
    """Why the arm stopped before its last step (it lost the race); "" when it ran them all."""

    @property
    def steps_trained(self) -> int:
        return self.last_step - self.first_step + 1

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def run_arm(spec: ArmSpec, log: Callable[[str], None] | None = None) -> ArmResult:
    """Fork the start checkpoint (weights and optimizer state), train, save, evaluate. A finished
    arm's result file makes this a no-op on resume; an unfinished one is redone from its start (its
    store shards have deterministic names, so the redo replaces them instead of adding)."""
    cfg = RunConfig.model_validate(spec.config)
    h = Harness.model_validate(spec.harness)
    torch.set_num_threads(cfg.run.threads)
    domain = make_domain(cfg)
    key = spec_key(spec, domain, cfg)
    done = Path(spec.checkpoint) / RESULT
    # A result whose weights were pruned (run.keep_checkpoints) is no finished arm to fork from: it is redone.
    # A race loser never had weights; its result stands.
    if done.is_file() and (saved := json.loads(done.read_text())).get("spec_key") == key:
        if saved.get("stopped") or has_weights(spec.checkpoint):
            return ArmResult(**saved)
    t0 = time.perf_counter()
    result = _train_and_read(spec, cfg, h, domain, log)
    result.seconds = time.perf_counter() - t0
    atomic_write_json(done, {**result.to_dict(), "spec_key": key})
    return result


def _train_and_read(spec: ArmSpec, cfg: RunConfig, h: Harness, domain, log: Callable[[str], None] | None) -> ArmResult:
    """Train the arm's steps, evaluating at its checkpoints (and stopping there if it races and cannot
    win), then save it and evaluate it on the gate tasks."""
    store = RolloutStore(Path(spec.run_dir) / "store")
    policy = HFPolicy.load(spec.start, lora_rank=cfg.policy.lora_rank, placement=placement(cfg.policy))
    trainer = make_trainer(cfg.train, policy, domain, h, reference=spec.reference, start=spec.start)
    rates_file = Path(spec.start) / PASS_RATES
    pass_rates = json.loads(rates_file.read_text()) if rates_file.is_file() else {}
    ctx = StepContext(run=cfg.run.name, branch=spec.branch, seed=spec.seed)
    pool = domain.tasks("train")
    tasks = _gate_tasks(domain, spec.gate_ids)
    check = tasks[: spec.checkpoint_tasks] if spec.checkpoint_tasks else tasks  # a prefix: the same rollout ids
    r = ArmResult(
        branch=spec.branch,
        role=spec.role,
        checkpoint=spec.checkpoint,
        harness_version=h.version,
        first_step=spec.first_step,
        last_step=spec.first_step - 1,
        generated_tokens=0,
        trained_tokens=0,
        seconds=0.0,
    )
    rewards = []
    marks = list(spec.checkpoints)  # those not yet passed
    race_marks = [m for m in spec.checkpoints if m] or [0]  # the race's own (the first is where `futile` is strict)
    if marks and marks[0] == 0:  # mark 0: the policy the arm forks from, read before its first step
        marks.pop(0)
        if tasks:  # an arm that trains no step has this read for its last: all the gate tasks
            _read(r, policy, domain, check if spec.steps else tasks, cfg, h, store, ctx, spec.first_step - 1)
            r.checkpoint_outcomes["0"] = r.outcomes

    def after(step: int, m: dict[str, float]) -> bool:
        """Each finished step: tally it; past a race checkpoint, evaluate, and stop if the arm cannot win;
        with a token target, stop once it is reached."""
        k = step - spec.first_step + 1
        r.generated_tokens += int(m["tokens_generated"])
        r.trained_tokens += int(m.get("tokens_trained", 0))
        r.last_step = step
        rewards.append(m["reward"])
        if log:
            log(f"{spec.branch} step {step}: reward {m['reward']:.3f}")
        at, end = (r.generated_tokens, spec.tokens) if spec.tokens else (k, spec.steps)
        passed = []  # a dear step may pass two: one read for both
        while marks and marks[0] <= at:
            passed.append(marks.pop(0))
        if passed and at < end and tasks:
            _read(r, policy, domain, check, cfg, h, store, ctx, step)
            for mark in passed:
                r.checkpoint_outcomes[str(mark)] = r.outcomes
                first = mark == race_marks[0]
                ref = spec.race.get(str(mark)) if spec.race is not None else None
                if why := futile(r.outcomes, ref, first, spec.race_against):
                    r.stopped = f"stopped at step {step} ({at} of {end} {'tokens' if spec.tokens else 'steps'}): {why}"
                    return False
        return not (spec.tokens and at >= end)

    audit = cfg.eval.audit_fraction
    run_steps(trainer, domain, pool, ctx, spec.first_step, spec.steps, store, audit, pass_rates, after)
    third = max(1, len(rewards) // 3)
    r.reward_first, r.reward_last = _mean(rewards[:third]), _mean(rewards[-third:])
    if r.stopped:  # a loser of the race is discarded: its weights are never forked from, so not saved
        Path(spec.checkpoint).mkdir(parents=True, exist_ok=True)
        return r
    trainer.save(spec.checkpoint)
    atomic_write_json(Path(spec.checkpoint) / PASS_RATES, pass_rates)
    no_step = r.last_step < spec.first_step and len(r.checkpoint_outcomes.get("0", {})) == len(tasks)
    if tasks and not no_step:  # mark 0 read them all and no step since
        _read(r, policy, domain, tasks, cfg, h, store, ctx, r.last_step)
    return r


def _gate_tasks(domain, gate_ids: tuple[str, ...] | None) -> list:
    if gate_ids is None:
        return []
    by_id = {t.id: t for t in domain.tasks("heldout")}
    return [by_id[i] for i in gate_ids]


def _read(r: ArmResult, policy, domain, tasks: list, cfg: RunConfig, h: Harness, store, ctx, step: int) -> None:
    """The evaluator's outcomes of the arm's policy now, on the gate tasks (stored as held-out rollouts)."""
    ev = evaluate(policy, domain, tasks, cfg.eval)
    record_eval(store, h, domain, ev, step, ctx)
    r.accuracy, r.outcomes, r.evaluator_hash = ev.accuracy, ev.outcomes, ev.evaluator_hash
    r.eval_tokens += sum(ep.action_tokens for ep in ev.episodes)


def spec_key(spec: ArmSpec, domain, cfg: RunConfig) -> str:
    """What an arm's result depends on: its spec (config, harness, start, seed, steps, gate tasks,
    reference) and the evaluator it is read by. A result file is reused only under the same key, so a
    rerun with other settings, or under a changed evaluator, trains and evaluates again. Paths are
    taken relative to the run directory, and the run's name and place are not part of it: a moved or
    renamed run keeps its arms."""

    def rel(path: str | None) -> str | None:
        if path is None:
            return None
        p = Path(path)
        return str(p.relative_to(spec.run_dir)) if p.is_relative_to(spec.run_dir) else str(p)

    fields = asdict(spec)
    for f, unset in (("tokens", 0), ("checkpoint_tasks", 0), ("race_against", "control")):
        if fields[f] == unset:  # an arm without them keeps the key it had before they existed: runs resume
            del fields[f]
    body = {
        **fields,
        "run_dir": None,
        "start": rel(spec.start),
        "reference": rel(spec.reference),
        "config": {**spec.config, "run": {**spec.config["run"], "out_dir": None, "name": None}},
    }
    if spec.gate_ids is not None:
        by_id = {t.id: t for t in domain.tasks("heldout")}
        body["evaluator"] = evaluator_hash(domain, [by_id[i] for i in spec.gate_ids], cfg.eval)
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def run_arm_in_worker(spec: ArmSpec, threads: int) -> dict[str, Any]:
    """run_arm in a worker (a spawned process, a Ray task) with `threads` torch threads; the result as a
    dict, which crosses a process boundary without this module's classes."""
    torch.set_num_threads(threads)
    cfg = dict(spec.config)
    cfg["run"] = {**cfg["run"], "threads": threads}
    return run_arm(replace(spec, config=cfg)).to_dict()
