"""Weights & Biases: one W&B run per arm, grouped under the run's name, with the arm's tags in its config;
the run as a whole is one more W&B run (its config, verdicts, the report). Offline unless WANDB_MODE says
otherwise (`wandb sync RUN_DIR/wandb/offline-run-*` uploads later); project WANDB_PROJECT or `evotrainer`."""

from __future__ import annotations

import hashlib
import html
import os
from collections import OrderedDict
from pathlib import Path
from typing import Any

import wandb

from evotrainer.trackers.tracker import trl_logged

RUN = "_run"
OPEN_RUNS = 4
"""W&B runs kept open at once (each is a writer in wandb's service process)."""


class WandbTracker:
    def __init__(self, run_dir: Path, run_name: str, config: dict[str, Any]):
        self.run_dir, self.run_name, self.config = Path(run_dir), run_name, config
        self.mode = os.environ.get("WANDB_MODE") or "offline"
        self.prefix = hashlib.sha256(str(self.run_dir.resolve()).encode()).hexdigest()[:10]
        self.runs: OrderedDict[str, Any] = OrderedDict()

    def _run(self, arm: str | None) -> Any:
        arm = arm or RUN
        if arm not in self.runs:
            if len(self.runs) >= OPEN_RUNS:
                self.runs.popitem(last=False)[1].finish()
            # A stable id: the arm's run reopened after a resume (or after it left the open set) is the same run.
            self.runs[arm] = wandb.init(
                project=os.environ.get("WANDB_PROJECT", "evotrainer"),
                id=f"{self.prefix}-{arm}",
                name=self.run_name if arm == RUN else arm,
                group=self.run_name,
                job_type="run" if arm == RUN else "arm",
                config=self.config if arm == RUN else None,
                dir=str(self.run_dir),
                mode=self.mode,
                resume="allow",
                reinit="create_new",
            )
        self.runs.move_to_end(arm)
        return self.runs[arm]

    def start_arm(self, arm: str, tags: dict[str, str]) -> None:
        self._run(arm).config.update(tags, allow_val_change=True)

    def log_metrics(self, arm: str, step: int, metrics: dict[str, float]) -> None:
        self._run(arm).log(trl_logged(metrics, rewrite=True), step=step)

    def log_event(self, arm: str | None, step: int, title: str, text: str) -> None:
        # Events go to the summary (W&B steps only move forward, and an event may concern an earlier step).
        self._run(arm).summary[title] = wandb.Html(f"<pre>step {step}\n{html.escape(text)}</pre>")

    def log_artifact(self, path: Path) -> None:
        self._run(None).log_artifact(str(path), name=f"{self.run_name}-{Path(path).stem}", type="run-file")

    def close(self) -> None:
        while self.runs:
            self.runs.popitem()[1].finish()
