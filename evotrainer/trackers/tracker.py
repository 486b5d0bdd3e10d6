"""The tracker contract (TRL's `report_to`): what an experiment tracker receives, the names it is chosen
by, and the start-up check that each named tracker's package is installed. Backends are one module each,
imported only when named."""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from typing import Any, Literal, Protocol, get_args

from evotrainer.errors import ConfigError

TrackerName = Literal["tensorboard", "mlflow", "wandb", "trackio"]
"""The trackers `run.report_to` may name."""

# name -> (the backend class, the packages any one of which it can run on)
BACKENDS: dict[str, tuple[str, tuple[str, ...]]] = {
    "tensorboard": ("evotrainer.trackers.tensorboard:TensorBoardTracker", ("tensorboard", "tensorboardX")),
    "mlflow": ("evotrainer.trackers.mlflow:MLflowTracker", ("mlflow",)),
    "wandb": ("evotrainer.trackers.wandb:WandbTracker", ("wandb",)),
    "trackio": ("evotrainer.trackers.trackio:TrackioTracker", ("trackio",)),
}
assert set(BACKENDS) == set(get_args(TrackerName))


class Tracker(Protocol):
    """One experiment tracker. An arm is a branch of the run (the mainline's segment, a trial arm): each
    arm is its own run or series, tagged with its branch, parent, round and harness version. `arm=None`
    is the run as a whole (verdicts, the report). Every call may be repeated after a resume: a tracker
    reopens the arm's run instead of starting a second one."""

    def start_arm(self, arm: str, tags: dict[str, str]) -> None:
        """Open (or reopen) the arm's run and set its tags; called again with new tags, it updates them."""

    def log_metrics(self, arm: str, step: int, metrics: dict[str, float]) -> None:
        """One step's metrics, under the store's names (`reward`, `completions/mean_length`, `eval/accuracy`...);
        each backend logs them as a TRL run shows in that tracker (trl_logged)."""

    def log_event(self, arm: str | None, step: int, title: str, text: str) -> None:
        """A verdict or a finding, as text at a step (the round, for the run as a whole)."""

    def log_artifact(self, path: Path) -> None:
        """A file of the run as a whole (report.html, summary.json)."""

    def close(self) -> None:
        """Flush and finish every run this tracker opened."""


def trl_logged(metrics: dict[str, float], rewrite: bool) -> dict[str, float]:
    """Step metrics (the store's names: TRL's, and `eval/...` for the evaluator's) under the keys a TRL run
    has in the same tracker, so the two overlay on one dashboard. transformers' TensorBoard, W&B and Trackio
    callbacks rewrite the Trainer's keys (`rewrite`): `train/reward`, `eval/accuracy`; its MLflow callback
    logs them as they are: `reward`, `eval_accuracy`."""
    out = {}
    for name, value in metrics.items():
        evaluated = name.startswith("eval/")
        if rewrite:
            out[name if evaluated else f"train/{name}"] = value
        else:
            out[f"eval_{name.removeprefix('eval/')}" if evaluated else name] = value
    return out


def check_report_to(names: list[str]) -> None:
    """Raise a ConfigError naming `run.report_to` when a named tracker's package is not installed:
    called at start-up, before anything is written."""
    for name in names:
        if name not in BACKENDS:
            raise ConfigError(f"run.report_to: unknown tracker {name!r}; choose from {sorted(BACKENDS)}")
        if not any(importlib.util.find_spec(p) is not None for p in BACKENDS[name][1]):
            raise ConfigError(
                f"run.report_to: {name!r} needs the {name} extra: `pip install -e '.[{name}]'` in the evotrainer clone"
            )


def make_tracker(name: str, run_dir: Path, run_name: str, config: dict[str, Any]) -> Tracker:
    """The named backend, its module imported now (so a tracker that is not named is never imported)."""
    module, cls = BACKENDS[name][0].split(":")
    return getattr(importlib.import_module(module), cls)(run_dir=run_dir, run_name=run_name, config=config)
