"""MLflow: an experiment named after the run, a parent run for the run as a whole (verdicts, the report)
and one nested run per arm, tagged with its branch, parent, round and harness version. The store is
MLFLOW_TRACKING_URI, or a local file store in RUN_DIR/mlruns, which MLflow 3 opens only under
MLFLOW_ALLOW_FILE_STORE=true (set here for the run; a reader sets it too: `MLFLOW_ALLOW_FILE_STORE=true mlflow ui
--backend-store-uri RUN_DIR/mlruns`, with the full `mlflow` package: mlflow-skinny has no UI). In a file store a
metric that another one extends (`entropy` beside `entropy/trained`) is logged as `entropy/mean`."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from mlflow.entities import Metric, Param, RunStatus
from mlflow.tracking import MlflowClient

from evotrainer.trackers.tracker import trl_logged

BATCH = 1000
"""MLflow's limit of metrics per log_batch call."""


def _key(name: str) -> str:
    """MLflow keys allow letters, digits, `_-./` and spaces: a reward term named by import path
    (`pkg.mod:fn`) keeps its name with `_` for the rest."""
    return re.sub(r"[^\w\-./ ]", "_", name)


class MLflowTracker:
    def __init__(self, run_dir: Path, run_name: str, config: dict[str, Any]):
        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            uri = (Path(run_dir) / "mlruns").resolve().as_uri()
            # MLflow 3 keeps the file store in maintenance mode behind this opt-in; it needs no server and
            # no database, which is what a run directory that holds its own records wants.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=uri)
        self.file_store = urlparse(uri).scheme in ("", "file")
        self.run_dir = str(Path(run_dir).resolve())
        exp = self.client.get_experiment_by_name(run_name)
        self.experiment = exp.experiment_id if exp else self.client.create_experiment(run_name)
        self.runs: dict[str, str] = {}
        self.parent = self._run(None, {"evotrainer.role": "run"}, run_name)
        if not self.client.get_run(self.parent).data.params:
            flat = _flatten(config)
            for i in range(0, len(flat), 100):
                self.client.log_batch(self.parent, params=[_param(k, v) for k, v in list(flat.items())[i : i + 100]])

    def _run(self, arm: str | None, tags: dict[str, str], name: str) -> str:
        """The arm's run id: found again by its tags after a resume, else created."""
        if (arm or "") in self.runs:
            return self.runs[arm or ""]
        role = "arm" if arm else "run"
        found = self.client.search_runs(
            [self.experiment],
            filter_string=f"tags.`evotrainer.role` = '{role}' and tags.`evotrainer.run_dir` = '{self.run_dir}'"
            + (f" and tags.branch = '{arm}'" if arm else ""),
            max_results=1,
        )
        if found:
            run_id = found[0].info.run_id
        else:
            tags = {**tags, "evotrainer.role": role, "evotrainer.run_dir": self.run_dir}
            if arm:
                tags["mlflow.parentRunId"] = self.parent
            run_id = self.client.create_run(self.experiment, tags=tags, run_name=name).info.run_id
        self.runs[arm or ""] = run_id
        return run_id

    def start_arm(self, arm: str, tags: dict[str, str]) -> None:
        run_id = self._run(arm, tags, arm)
        for k, v in tags.items():
            self.client.set_tag(run_id, k, v)

    def log_metrics(self, arm: str, step: int, metrics: dict[str, float]) -> None:
        now = int(time.time() * 1000)
        metrics = trl_logged(metrics, rewrite=False)
        keys = [_key(k) for k in metrics]
        if self.file_store:  # a key is a file there, and `entropy` cannot be one beside the folder `entropy/`
            folders = {k.rsplit("/", i)[0] for k in keys for i in range(1, k.count("/") + 1)}
            keys = [f"{k}/mean" if k in folders else k for k in keys]
        ms = [Metric(k, float(v), now, step) for k, v in zip(keys, metrics.values())]
        for i in range(0, len(ms), BATCH):
            self.client.log_batch(self._run(arm, {"branch": arm}, arm), metrics=ms[i : i + BATCH])

    def log_event(self, arm: str | None, step: int, title: str, text: str) -> None:
        run_id = self._run(arm, {"branch": arm} if arm else {}, arm or "run")
        self.client.log_text(run_id, text, f"events/{step:06d}-{_key(title).replace('/', '-')}.txt")

    def log_artifact(self, path: Path) -> None:
        self.client.log_artifact(self.parent, str(path))

    def close(self) -> None:
        for run_id in self.runs.values():
            self.client.set_terminated(run_id, RunStatus.to_string(RunStatus.FINISHED))
        self.runs.clear()


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _param(k: str, v: Any) -> Param:
    return Param(_key(k)[:250], str(v)[:6000])
