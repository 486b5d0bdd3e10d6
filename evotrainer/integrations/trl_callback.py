"""A TRL callback for a user's own GRPOTrainer run: records each logged generation batch as our rollouts in a run
directory, and runs the diagnostic suite every N recorded steps, findings in the log and the trainer's trackers.

    trainer = GRPOTrainer(model=..., reward_funcs=..., args=GRPOConfig(...), train_dataset=...)
    trainer.add_callback(DiagnosticsCallback(trainer, "runs/my-run", every=10))
    trainer.train()                     # then: evotrainer diagnose|rollouts|report runs/my-run

It takes the trainer, as TRL's own callbacks do (trl.LogCompletionsCallback), because a TrainerCallback is not
given it: the batch is the one TRL keeps for its completion table (GRPOTrainer._logs, trl 1.16: prompts,
completions, each reward function's values, advantages, log_extra columns), read when TRL logs a step; the step's
metrics are the dict it logs. TRL keeps only the latest generation batch, so with logging_steps = K one step in K
is recorded."""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Any

from transformers import Trainer, TrainerCallback

from evotrainer.diagnostics.detector import Finding
from evotrainer.diagnostics.suite import Suite
from evotrainer.ids import window_id
from evotrainer.integrations.imported import (
    BRANCH,
    ImportRecord,
    finish_run,
    harness_for,
    message_text,
    open_run,
    write_step,
)
from evotrainer.integrations.trl_logs import samples_from_table, trl_step

log = logging.getLogger("evotrainer")

# GRPOConfig fields that are our harness's knobs under the same name (docs: README "Configs").
_KNOBS = {
    "sampling.temperature": "temperature",
    "sampling.top_p": "top_p",
    "loss.loss_type": "loss_type",
    "loss.scale_rewards": "scale_rewards",
    "loss.epsilon": "epsilon",
    "loss.epsilon_high": "epsilon_high",
    "loss.beta": "beta",
    "loss.num_iterations": "num_iterations",
    "loss.mask_truncated_completions": "mask_truncated_completions",
    "loss.entropy_coef": "entropy_coef",
    "optimizer.learning_rate": "learning_rate",
    "optimizer.max_grad_norm": "max_grad_norm",
    "optimizer.weight_decay": "weight_decay",
}


class DiagnosticsCallback(TrainerCallback):
    """Our rollout store and diagnostic suite beside a trl.GRPOTrainer run (main process only)."""

    def __init__(
        self, trainer: Any, run_dir: str | Path, every: int = 10, window: int | None = None, overwrite: bool = False
    ):
        if every < 1:
            raise ValueError(f"every = {every}: diagnose every N >= 1 recorded steps")
        self.trainer, self.run_dir, self.every, self.window = trainer, Path(run_dir), every, window
        self.overwrite = overwrite
        self.store = None
        self.steps: list[int] = []
        self.rollouts = 0
        self.diagnosed_to = 0
        self.findings: list[Finding] = []
        """The latest diagnosis's findings."""
        self._last_batch = ""
        self._logging = False

    def on_train_begin(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return control
        t = self.trainer
        weights = dict(zip(t.reward_func_names, [float(w) for w in t.reward_weights]))
        knobs = {path: getattr(args, name) for path, name in _KNOBS.items() if hasattr(args, name)}
        self.harness, dropped = harness_for(weights, args.num_generations, args.max_completion_length, knobs)
        self.notes = ["completion tokens re-encoded from the text; terminations by TRL's completions/clipped_ratio"]
        if dropped:
            self.notes.append("GRPOConfig values our harness does not hold (left at defaults): " + ", ".join(dropped))
        if args.logging_steps != 1:
            self.notes.append(f"logging_steps = {args.logging_steps}: one step in {args.logging_steps} recorded")
            log.warning("evotrainer: %s", self.notes[-1])
        self.store = open_run(self.run_dir, self.harness, self.overwrite)
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.store is None or self._logging or not logs or "train_runtime" in logs:
            return control
        if any(k.startswith("eval_") for k in logs):  # an evaluation's batch is no training step's
            return control
        table = self._table(state.global_step)
        batch = hashlib.sha256(repr((table["prompt"], table["completion"])).encode()).hexdigest()
        if not table["prompt"] or batch == self._last_batch:  # no batch yet, or the one recorded (num_iterations > 1)
            return control
        self._last_batch, step = batch, state.global_step
        metrics = {k: float(v) for k, v in logs.items() if isinstance(v, int | float) and k not in ("epoch", "step")}
        samples = samples_from_table(table, list(self.trainer.reward_func_names))
        cap = args.max_completion_length
        rollouts = trl_step(self.run_dir.name, step, samples, self.harness, self._tokenizer(), metrics, cap)
        write_step(self.store, rollouts, metrics, self.run_dir.name, step)
        self.steps.append(step)
        self.rollouts += len(rollouts)
        if len(self.steps) % self.every == 0:
            self.diagnose()
        return control

    def on_train_end(self, args, state, control, **kwargs):
        if self.store is None:
            return control
        if self.steps and self.diagnosed_to < self.steps[-1]:
            self.diagnose()
        record = ImportRecord(
            source_format="trl-callback",
            source=str(args.output_dir),
            files=[],
            steps=self.steps,
            rollouts=self.rollouts,
            notes=self.notes,
        )
        finish_run(self.run_dir, self.harness, record)
        return control

    def diagnose(self) -> list[Finding]:
        """The suite over the recorded steps (the last `window` of them, if set): stored with the suite version,
        each finding a warning in the log, and the count and each finding's value sent to the trackers."""
        last = self.steps[-1]
        first = self.steps[0] if self.window is None else self.steps[max(0, len(self.steps) - self.window)]
        suite = Suite.default()
        self.findings = suite.run(self.store, BRANCH, first, last)
        self.store.append_findings(
            self.findings, suite.version, window_id(BRANCH, first, last, suite.version), BRANCH, first, last
        )
        self.diagnosed_to = last
        for f in self.findings:
            log.warning(
                "evotrainer: %s (%s) at steps %d-%d: %s evidence: %s",
                f.name,
                f.severity,
                first,
                last,
                f.message,
                ", ".join(f.evidence[:4]),
            )
        values = {"evotrainer/findings": float(len(self.findings))}
        values |= {f"evotrainer/{f.name}": float(f.value) for f in self.findings}
        self._logging = True
        try:
            # transformers' Trainer.log, not GRPOTrainer.log: TRL's would also flush its pending step metrics
            # and completion table into this entry.
            Trainer.log(self.trainer, values)
        finally:
            self._logging = False
        return self.findings

    def _table(self, step: int) -> dict[str, list[Any]]:
        """TRL's completion table of the latest generation batch, as it writes it to completions_STEP.parquet."""
        logs = self.trainer._logs
        n = len(logs["prompt"])
        return {
            "step": [step] * n,
            "prompt": [message_text(p) for p in logs["prompt"]],
            "completion": [message_text(c) for c in logs["completion"]],
            **{k: list(v) for k, v in logs["rewards"].items()},
            **{k: list(v) for k, v in logs["extra"].items()},
            "advantage": list(logs["advantages"]),
        }

    def _tokenizer(self) -> Any:
        proc = self.trainer.processing_class
        return getattr(proc, "tokenizer", proc)
