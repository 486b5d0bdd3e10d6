"""TensorBoard: one log directory per arm under RUN_DIR/tensorboard (so TensorBoard lists the arms as
runs), the arm's tags and events as text, the run as a whole under `_run`."""

from __future__ import annotations

import importlib.util
from collections import OrderedDict
from pathlib import Path
from typing import Any

import yaml

from evotrainer.trackers.tracker import trl_logged

if importlib.util.find_spec("tensorboard") is not None:
    from torch.utils.tensorboard import SummaryWriter
else:  # tensorboardX writes the same event files without the tensorboard package
    from tensorboardX import SummaryWriter

RUN = "_run"
OPEN_WRITERS = 8
"""Writers kept open at once; a loop run has many arms, and an arm is written in bursts."""


class TensorBoardTracker:
    def __init__(self, run_dir: Path, run_name: str, config: dict[str, Any]):
        self.root = Path(run_dir) / "tensorboard"
        self.writers: OrderedDict[str, SummaryWriter] = OrderedDict()
        self._writer(RUN).add_text("config", _code(config), 0)

    def _writer(self, arm: str | None) -> SummaryWriter:
        arm = arm or RUN
        if arm not in self.writers:
            if len(self.writers) >= OPEN_WRITERS:
                self.writers.popitem(last=False)[1].close()
            # A writer reopened after a resume adds an event file beside the old ones; TensorBoard merges them.
            self.writers[arm] = SummaryWriter(log_dir=str(self.root / arm))
        self.writers.move_to_end(arm)
        return self.writers[arm]

    def start_arm(self, arm: str, tags: dict[str, str]) -> None:
        w = self._writer(arm)
        w.add_text("tags", "\n".join(f"    {k}: {v}" for k, v in tags.items()), 0)
        w.flush()

    def log_metrics(self, arm: str, step: int, metrics: dict[str, float]) -> None:
        w = self._writer(arm)
        for name, value in trl_logged(metrics, rewrite=True).items():
            w.add_scalar(name, value, step)
        w.flush()  # the forwarder's cursor moves after this call: what it counts as sent is on disk

    def log_event(self, arm: str | None, step: int, title: str, text: str) -> None:
        w = self._writer(arm)
        w.add_text(title, _code(text), step)
        w.flush()

    def log_artifact(self, path: Path) -> None:
        # TensorBoard keeps no files: the path is recorded where the run's events are.
        self.log_event(None, 0, "artifacts", str(Path(path).resolve()))

    def close(self) -> None:
        while self.writers:
            self.writers.popitem()[1].close()


def _code(x: Any) -> str:
    """Text as a Markdown code block (TensorBoard renders text summaries as Markdown)."""
    body = x if isinstance(x, str) else yaml.safe_dump(x, sort_keys=False)
    return "\n".join("    " + line for line in body.splitlines())
