"""The TRL backend (`train.backend: trl`): RL steps run by trl.GRPOTrainer under the harness, for
single-turn domains. The harness reaches TRL through the knob registry's export (a knob TRL does not
honour is refused, never ignored); the domain's reward terms are its reward functions; every rollout and
step metric lands in our store under our names; checkpoints keep our layout, so arms fork from them as
from the native trainer's. Also the backend switch: make_trainer and run_steps serve both backends."""

from __future__ import annotations

import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from packaging.specifiers import SpecifierSet
from torch.optim.lr_scheduler import LambdaLR
from transformers import PrinterCallback, TrainerCallback

from evotrainer.config import TrainSection
from evotrainer.envs.env import Domain, audit_verdict
from evotrainer.errors import ConfigError
from evotrainer.harness.export import TRL_VERSIONS, export
from evotrainer.harness.filters import trainable
from evotrainer.harness.harness import Harness
from evotrainer.policies.hf import HFPolicy
from evotrainer.store.rollouts import RolloutStore
from evotrainer.training.grpo import GRPOTrainer, lr_factor
from evotrainer.training.optimizer import load_optimizer_state, make_optimizer, save_checkpoint
from evotrainer.training.rollout import Episode
from evotrainer.training.segment import (
    Batch,
    StepContext,
    audit_sample,
    record_step,
    score_batch,
    step_metrics,
    step_tasks,
    train_step,
)
from evotrainer.types import Task, Turn

OnStep = Callable[[int, dict[str, float]], bool]
"""Told each finished step's number and metrics; returns False to stop training after it."""

# GRPOConfig keywords the backend sets itself: train.trl_args may not.
_OWN = frozenset(
    {"output_dir", "max_steps", "seed", "shuffle_dataset", "logging_steps", "report_to", "save_strategy"}
    | {"remove_unused_columns", "steps_per_generation", "log_completions"}
)
# Defaults of ours for a small CPU model, which train.trl_args may change (bf16 on a GPU, say).
_DEFAULTS = {"bf16": False, "activation_checkpointing": False, "disable_tqdm": True, "dataloader_pin_memory": False}
# The schedule is ours, a function of the global step (a fork continues it): the export's keys are not passed.
_SCHEDULE = frozenset({"lr_scheduler_type", "warmup_steps", "lr_scheduler_kwargs"})


def grpo_kwargs(h: Harness) -> dict[str, Any]:
    """The harness as GRPOConfig keywords (the registry's export), less the schedule, which we drive."""
    return {k: v for k, v in export(h, "trl").settings.items() if k not in _SCHEDULE}


def check_trl(train: TrainSection, h: Harness, domain: Domain) -> None:
    """Everything backend trl cannot run under harness `h`, refused before a run directory is written (a no-op
    for ours)."""
    if train.backend != "trl":
        return
    check_harness(h, domain)
    if h.loss.tis_cap is not None and not train.trl_args.get("use_vllm"):
        raise ConfigError(
            "harness.loss.tis_cap: TRL corrects the sampler's mismatch only when vLLM generates "
            "(train.trl_args.use_vllm); without it there is nothing to correct: set harness.loss.tis_cap to null"
        )
    clash = sorted(set(train.trl_args) & (set(grpo_kwargs(h)) | _OWN | _SCHEDULE))
    if clash:
        raise ConfigError(
            f"train.trl_args: {clash} are set from the harness or by the backend; change the harness knob instead"
        )
    try:
        import trl  # an optional dependency, only this backend needs it
    except ImportError:
        raise ConfigError(f"train.backend: trl needs the trl package (pip install 'trl{TRL_VERSIONS}')") from None
    check_trl_version(trl.__version__)


def check_trl_version(version: str) -> None:
    """TRL outside the tested range is refused: GRPOConfig keywords come and go between releases, and a run
    that fails on one at its first step, or quietly trains under another default, costs more than a stop."""
    if version not in SpecifierSet(TRL_VERSIONS, prereleases=True):
        raise ConfigError(
            f"train.backend: trl is tested with trl{TRL_VERSIONS}, and trl {version} is installed; "
            f"pip install 'trl{TRL_VERSIONS}', or use train.backend ours"
        )


def check_harness(h: Harness, domain: Domain) -> None:
    """A multi-turn domain, or a knob TRL does not honour at its value, is a ConfigError naming it."""
    if h.multi_turn.max_turns > 1 or _multi_turn(domain):
        raise ConfigError(
            f"train.backend: trl runs single-turn domains only; env.domain {domain.name} is multi-turn "
            f"(harness.multi_turn.max_turns = {h.multi_turn.max_turns}); use train.backend ours"
        )
    if refused := unhonoured(h):
        raise ConfigError(
            "train.backend: trl does not honour these harness knobs; set them to their defaults or use "
            f"train.backend ours:\n{refused}"
        )


def unhonoured(h: Harness) -> str:
    """The knobs TRL cannot run at their values in this harness, one line each ("" when none): the loop
    refuses a proposal that would make one, as start-up refuses a config that has one."""
    return "\n".join(f"  harness.{x.knob} = {x.value!r}: {x.note}" for x in export(h, "trl").unmapped)


def _multi_turn(domain: Domain) -> bool:
    """A domain whose demonstrations take more than one action is multi-turn."""
    rng = random.Random(0)
    return any(sum(a for _, a in domain.demonstration(t, rng)) > 1 for t in domain.tasks("train")[:8])


def stop_token_ids(tokenizer, stop: tuple[str, ...]) -> list[int]:
    """The domain's stop strings as token ids: TRL ends a completion on an EOS id, so each must be one token."""
    out = []
    for s in stop:
        ids = tokenizer.encode(s, add_special_tokens=False)
        if len(ids) != 1:
            raise ConfigError(
                f"env.domain: its stop string {s!r} is {len(ids)} tokens of the policy's tokenizer; "
                "train.backend trl ends a completion on a single stop token; use train.backend ours"
            )
        out += ids
    return out


class TRLTrainer:
    """trl.GRPOTrainer behind our trainer's face. It owns the optimizer (AdamW as the native trainer's, so
    optimizer.pt is the same file for both backends) and the schedule, and saves our checkpoint layout."""

    def __init__(
        self,
        policy: HFPolicy,
        harness: Harness,
        domain: Domain,
        *,
        reference: str | Path | None = None,
        start: str | Path | None = None,
        trl_args: dict[str, Any] | None = None,
    ):
        check_harness(harness, domain)
        self.policy, self.harness, self.domain = policy, harness, domain
        self.reference, self.trl_args = reference, dict(trl_args or {})
        self.eos_ids = list(dict.fromkeys([policy.eos_id, *stop_token_ids(policy.tokenizer, domain.stop)]))
        o = harness.optimizer
        self.optimizer = make_optimizer(policy, o)
        if start is not None:
            load_optimizer_state(self.optimizer, start)
        for g in self.optimizer.param_groups:  # the harness owns these, not the checkpoint forked from
            g["lr"] = g["initial_lr"] = o.learning_rate
            g["weight_decay"] = o.weight_decay

    def save(self, path: str | Path) -> None:
        """Policy checkpoint plus optimizer state, as GRPOTrainer.save writes them."""
        save_checkpoint(self.policy, self.optimizer, path)

    def train(
        self,
        pool: list[Task],
        ctx: StepContext,
        first_step: int,
        steps: int,
        store: RolloutStore | None = None,
        audit_fraction: float = 0.0,
        on_step: OnStep | None = None,
    ) -> int:
        """Run global steps first_step .. first_step + steps - 1 (each step's prompts drawn as the native
        backend draws them, by seed and step); returns the last step run."""
        from datasets import Dataset  # TRL's dependencies, imported only when this backend runs
        from trl import GRPOTrainer as TRLGRPOTrainer

        h, mu = self.harness, self.harness.loss.num_iterations
        plan = [step_tasks(pool, h.sampling.prompts_per_step, ctx.seed, first_step + k) for k in range(steps)]
        # TRL renders a conversational prompt through the tokenizer's chat template itself, as encode_prompt does.
        chat = self.policy.chat
        rows = [
            {"prompt": [{"role": "user", "content": t.prompt}] if chat else t.prompt, "task_id": t.id}
            for tasks in plan
            for t in tasks
        ]
        rec = _Recorder(self, {t.id: t for tasks in plan for t in tasks}, ctx, first_step, store, audit_fraction)
        rec.on_step = on_step
        # The scheduler steps once per optimizer step, num_iterations of them per RL step; our rate holds per step.
        sched = LambdaLR(self.optimizer, lambda i: lr_factor(h.optimizer, first_step + i // mu))
        gen = self.policy.model.generation_config
        saved_eos = gen.eos_token_id
        with tempfile.TemporaryDirectory() as out:
            args = self._config(out, steps, ctx.seed)
            gen.eos_token_id = self.eos_ids  # TRL reads its EOS ids (where completions end) from here, once
            try:
                trainer = TRLGRPOTrainer(
                    model=self.policy.model,
                    reward_funcs=rec.reward_funcs(),
                    args=args,
                    train_dataset=Dataset.from_list(rows),
                    processing_class=self.policy.tokenizer,
                    callbacks=[rec],
                    optimizers=(self.optimizer, sched),
                )
            finally:
                gen.eos_token_id = saved_eos
            trainer.remove_callback(PrinterCallback)  # each step's log dict on stdout: our progress bar says it
            if trainer.ref_model is not None and self.reference is not None:
                # KL to the run's base model, as the native backend, not to the checkpoint this arm forked from.
                ref = HFPolicy.load(self.reference, placement=self.policy.placement)
                trainer.ref_model.load_state_dict(ref.model.state_dict())
            trainer.train()
        return rec.last_step

    def _config(self, out: str, steps: int, seed: int):
        from trl import GRPOConfig

        own = {
            "output_dir": out,
            "max_steps": steps * self.harness.loss.num_iterations,
            "seed": seed,
            "shuffle_dataset": False,  # the dataset is already the steps' prompts, in order
            "logging_steps": 1,
            "report_to": "none",
            "save_strategy": "no",
            "remove_unused_columns": False,
            "log_completions": False,
        }
        return GRPOConfig(**(_DEFAULTS | self._placed() | self.trl_args | grpo_kwargs(self.harness) | own))

    def _placed(self) -> dict[str, Any]:
        """The policy section's placement as TrainingArguments (train.trl_args may still override them): the
        device the policy is on, bf16 autocast for bfloat16 weights, activation checkpointing."""
        p = self.policy.placement
        return {
            "use_cpu": self.policy.device.type == "cpu",
            "bf16": p.dtype == "bfloat16",
            "activation_checkpointing": p.gradient_checkpointing,
        }


class _Recorder(TrainerCallback):
    """Our side of a TRL run. Scores each generated batch once under every reward term (TRL calls one reward
    function per weighted term, on the same completions); when TRL logs the step, writes the batch as our
    rollouts and TRL's logged metrics, with ours for the names TRL does not log, to the store."""

    def __init__(
        self,
        backend: TRLTrainer,
        tasks: dict[str, Task],
        ctx: StepContext,
        first_step: int,
        store: RolloutStore | None,
        audit_fraction: float,
    ):
        self.b, self.tasks, self.ctx, self.first_step = backend, tasks, ctx, first_step
        self.store, self.audit_fraction = store, audit_fraction
        self.on_step: OnStep | None = None
        self.pending: dict[int, tuple[Batch, float]] = {}
        self.logs: dict[str, float] = {}
        self.last_step = first_step - 1
        self.t0 = time.perf_counter()

    def reward_funcs(self) -> list[Callable[..., list[float]]]:
        """One TRL reward function per weighted term, in reward_weights order (GRPOConfig.reward_weights')."""
        return [self._term(name) for name in self.b.harness.reward_weights]

    def _term(self, name: str) -> Callable[..., list[float]]:
        def reward(prompts, completions, completion_ids, task_id, trainer_state, **_) -> list[float]:
            # A conversational prompt's completion comes back as [{"role": "assistant", "content": text}].
            texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
            batch = self._score(trainer_state.global_step, texts, completion_ids, task_id)
            return [t[name] for t in batch.terms]

        reward.__name__ = name  # TRL logs rewards/<__name__>/mean: our term's name
        return reward

    def _score(self, global_step: int, texts: list[str], ids: list[list[int]], task_ids: list[str]) -> Batch:
        step = self.first_step + global_step // self.b.harness.loss.num_iterations
        if step not in self.pending:
            gen_seconds = time.perf_counter() - self.t0
            episodes = self._episodes([self.tasks[i] for i in task_ids], texts, ids)
            for ep in episodes:
                ep.gen_seconds = gen_seconds / len(episodes)
            g = self.b.harness.sampling.num_generations
            batch = score_batch(self.b.harness, self.b.domain, [ep.task for ep in episodes[::g]], episodes)
            self.pending[step] = (batch, gen_seconds)
        return self.pending[step][0]

    def _episodes(self, tasks: list[Task], texts: list[str], ids: list[list[int]]) -> list[Episode]:
        """TRL's completions as our single-turn episodes: the env's answer, the termination, the policy's
        mean logprob of each completion (the weights have not moved since it was sampled)."""
        policy, domain, temp = self.b.policy, self.b.domain, self.b.harness.sampling.temperature
        prompts = [policy.encode_prompt(t.prompt) for t in tasks]
        scored = policy.logprobs([p + c for p, c in zip(prompts, ids)], temp)
        out = []
        for task, text, c, p, lp in zip(tasks, texts, ids, prompts, scored):
            t0 = time.perf_counter()
            env = domain.make_env()
            env.reset(task)
            obs, done, info = env.step(text)
            lps = lp[len(lp) - len(c) :] if c else []
            turn = Turn(
                action=text,
                tokens=len(c),
                mean_logprob=sum(lps) / len(lps) if lps else 0.0,
                observation=obs,
                tool_error=bool(info.get("tool_error")),
            )
            stopped = bool(c) and c[-1] in self.b.eos_ids
            ep = Episode(task, p + c, [False] * len(p) + [True] * len(c), lps, [turn], info=info)
            ep.termination = "length" if not stopped else info.get("termination", "stop") if done else "turn_cap"
            ep.env_seconds = time.perf_counter() - t0
            out.append(ep)
        return out

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logs.update({k: float(v) for k, v in (logs or {}).items() if isinstance(v, int | float)})
        k, mu = state.global_step, self.b.harness.loss.num_iterations
        step = self.first_step + (k - 1) // mu
        if k % mu or step not in self.pending:  # a pass of num_iterations > 1, or the closing summary
            return control
        batch, gen_seconds = self.pending.pop(step)
        m = self._metrics(step, batch, gen_seconds)
        self.logs, self.last_step = {}, step
        if self.on_step is not None and not self.on_step(step, m):
            control.should_training_stop = True
        self.t0 = time.perf_counter()  # what on_step did (an evaluation, a save) is no step's time
        return control

    def _metrics(self, step: int, b: Batch, gen_seconds: float) -> dict[str, float]:
        """Our step metrics over the batch, then TRL's logged values under their (the same) names."""
        h = self.b.harness
        termination = np.array([ep.termination for ep in b.episodes])
        keep = trainable(h, termination, b.group_std)
        audited = audit_sample(len(b.episodes), self.audit_fraction, self.ctx.seed, step)
        audits: list[bool | None] = [None] * len(b.episodes)
        for i in audited:
            ep = b.episodes[i]
            audits[i] = audit_verdict(self.b.domain, ep.task, ep.turns, ep.info)
        m = step_metrics(h, b, keep, audits, audited, self.b.domain)
        m["tokens_trained"] = float(sum(ep.action_tokens for ep, k in zip(b.episodes, keep) if k))
        m |= self.logs
        m |= {"gen_seconds": gen_seconds, "seconds": time.perf_counter() - self.t0}
        if self.store is not None:
            record_step(self.store, self.ctx, step, h, b, audits, m)
        return m


def make_trainer(
    train: TrainSection,
    policy: HFPolicy,
    domain: Domain,
    harness: Harness,
    *,
    reference: str | Path | None = None,
    start: str | Path | None = None,
) -> GRPOTrainer | TRLTrainer:
    """The configured backend's trainer, with the optimizer state of `start` when it has one."""
    if train.backend == "trl":
        return TRLTrainer(policy, harness, domain, reference=reference, start=start, trl_args=train.trl_args)
    trainer = GRPOTrainer(policy, harness, reference=reference)
    if start is not None:
        trainer.load_optimizer(start)
    return trainer


def run_steps(
    trainer: GRPOTrainer | TRLTrainer,
    domain: Domain,
    pool: list[Task],
    ctx: StepContext,
    first_step: int,
    steps: int,
    store: RolloutStore | None,
    audit_fraction: float,
    pass_rates: dict[str, float] | None,
    on_step: OnStep,
) -> int:
    """Train global steps first_step.. for `steps` steps or until on_step says stop; the last step run."""
    if isinstance(trainer, TRLTrainer):
        return trainer.train(pool, ctx, first_step, steps, store, audit_fraction, on_step)
    step = first_step - 1
    for step in range(first_step, first_step + steps):
        m = train_step(trainer, domain, pool, ctx, step, store, audit_fraction, pass_rates)
        if not on_step(step, m):
            break
    return step
