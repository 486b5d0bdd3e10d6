"""Trackio (Hugging Face's local-first tracker, the wandb-like API TRL reports to): one Trackio run per arm
in a project named after the run, grouped under it, with the arm's tags in its config; the run as a whole
is one more run (verdicts). Its records live where Trackio keeps them (TRACKIO_DIR); `trackio show`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trackio

from evotrainer.trackers.tracker import trl_logged

RUN = "_run"


class TrackioTracker:
    """Trackio holds one current run per process: the arm being written is (re)opened with resume."""

    def __init__(self, run_dir: Path, run_name: str, config: dict[str, Any]):
        self.project, self.config = run_name, config
        self.arm: str | None = None
        self.run: Any = None
        self.tags: dict[str, dict[str, str]] = {}

    def _open(self, arm: str | None) -> Any:
        arm = arm or RUN
        if arm != self.arm:
            if self.run is not None:
                self.run.finish()
            config = self.config if arm == RUN else self.tags.get(arm, {})
            self.run = trackio.init(
                project=self.project,
                name=arm,
                group=self.project,
                config=config,
                resume="allow",
                embed=False,
                auto_log_cpu=False,  # the arms' records only, no background sampling thread
                auto_log_gpu=False,
            )
            self.arm = arm
        return self.run

    def start_arm(self, arm: str, tags: dict[str, str]) -> None:
        self.tags[arm] = dict(tags)
        if self.arm == arm:  # tags changed on the open run: reopen it to record them
            self.run.finish()
            self.arm = None
        self._open(arm)

    def log_metrics(self, arm: str, step: int, metrics: dict[str, float]) -> None:
        self._open(arm).log(trl_logged(metrics, rewrite=True), step=step)

    def log_event(self, arm: str | None, step: int, title: str, text: str) -> None:
        self._open(arm).alert(title=title, text=text, level=trackio.AlertLevel.INFO, step=step)

    def log_artifact(self, path: Path) -> None:
        self._open(None).log_artifact(str(path))

    def close(self) -> None:
        if self.run is not None:
            self.run.finish()
        self.run, self.arm = None, None
