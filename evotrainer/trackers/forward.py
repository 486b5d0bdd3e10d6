"""Forwards the run's records to the trackers named in `run.report_to`: step metrics from the store,
verdicts from the ledger, findings as events, report.html at the end. The loop calls `sync` after each
stage commits, so training code makes no tracker call; a cursor file (trackers.json, per tracker) says
what each tracker has been sent, so a resumed run sends only the rest."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

from evotrainer.backtest.verdict import TrialRecord, VerdictRecord, read_trials, read_verdicts
from evotrainer.store.files import atomic_write_json
from evotrainer.store.ledger import Ledger
from evotrainer.store.rollouts import RolloutStore
from evotrainer.trackers.tracker import Tracker, make_tracker

CURSOR = "trackers.json"


class Forwarder:
    """The named trackers, each with its cursor. A tracker that fails is warned about and retried at the
    next sync (its cursor does not move): an observer's outage does not stop a training run."""

    def __init__(self, trackers: dict[str, Tracker], run_dir: Path):
        self.trackers = trackers
        self.path = Path(run_dir) / CURSOR
        self.cursor: dict[str, dict[str, Any]] = json.loads(self.path.read_text()) if self.path.is_file() else {}
        self._started: dict[str, dict[str, dict[str, str]]] = {name: {} for name in trackers}

    @classmethod
    def open(cls, names: list[str], run_dir: Path, run_name: str, config: dict[str, Any]) -> Forwarder:
        """With no tracker named (the default) every call does nothing: nothing is imported or written."""
        return cls({n: make_tracker(n, Path(run_dir), run_name, config) for n in dict.fromkeys(names)}, run_dir)

    # -- direct calls (`evotrainer train`, which has no ledger) ---------------------------------------------
    def start_arm(self, arm: str, tags: dict[str, str]) -> None:
        self._each(lambda name, t: self._start(name, t, arm, tags))

    def log_metrics(self, arm: str, step: int, metrics: dict[str, float]) -> None:
        self._each(lambda _, t: t.log_metrics(arm, step, metrics))

    def finish(self, artifacts: list[Path]) -> None:
        """Send the run's files (report.html, summary.json) and close every tracker."""

        def end(_: str, t: Tracker) -> None:
            for path in artifacts:
                if Path(path).is_file():
                    t.log_artifact(Path(path))
            t.close()

        self._each(end)

    # -- the loop: what the ledger and the store hold that a tracker has not been sent yet -------------------
    def sync(self, ledger: Ledger, store: RolloutStore) -> None:
        if not self.trackers:
            return
        branches = {b["id"]: b for b in ledger.branches()}
        trials = {t.id: t for t in read_trials(ledger)}
        verdicts = read_verdicts(ledger)
        findings = store.sql("SELECT * FROM findings ORDER BY branch, last_step, name")
        for name, tracker in self.trackers.items():
            cur = self.cursor.setdefault(name, {"steps": {}, "verdicts": [], "findings": []})
            before = json.loads(json.dumps(cur))
            try:
                self._forward(name, tracker, cur, store, branches, trials, verdicts, findings)
            except Exception as e:  # any tracker error: retried at the next sync, from where it stood
                warnings.warn(f"run.report_to: {name} failed ({e!r}); retrying at the next stage", stacklevel=2)
                self.cursor[name] = before
                continue
            atomic_write_json(self.path, self.cursor)

    def _forward(
        self,
        name: str,
        tracker: Tracker,
        cur: dict[str, Any],
        store: RolloutStore,
        branches: dict[str, dict[str, Any]],
        trials: dict[str, TrialRecord],
        verdicts: list[VerdictRecord],
        findings: list[dict[str, Any]],
    ) -> None:
        sent = cur["steps"]
        pending = {b: r for b, r in branches.items() if r["last_step"] > sent.get(b, -1)}
        for step, arm, metrics in _new_metrics(store, pending, sent):
            self._start(name, tracker, arm, arm_tags(branches[arm]))
            tracker.log_metrics(arm, step, metrics)
        for b, r in pending.items():
            self._start(name, tracker, b, arm_tags(r))
            if r["heldout_accuracy"] is not None:
                tracker.log_metrics(b, r["last_step"], {"eval/accuracy": float(r["heldout_accuracy"])})
            sent[b] = r["last_step"]
        for v in verdicts:
            if v.trial in cur["verdicts"] or v.trial not in trials:
                continue
            trial = trials[v.trial]
            arm, text = trial.candidate, verdict_text(v, trial)
            if arm in branches:
                self._start(name, tracker, arm, {**arm_tags(branches[arm]), "verdict": v.decision})
                tracker.log_event(arm, branches[arm]["last_step"], "verdict", text)
            tracker.log_event(None, v.round, f"verdict/{v.trial}", text)
            cur["verdicts"].append(v.trial)
        for f in findings:
            key = f"{f['branch']}:{f['first_step']}-{f['last_step']}:{f['suite_version']}:{f['name']}"
            if key in cur["findings"]:
                continue
            arm = f["branch"] if f["branch"] in branches else None
            if arm is not None:
                self._start(name, tracker, arm, arm_tags(branches[arm]))
            tracker.log_event(arm, f["last_step"], f"finding/{f['name']}", finding_text(f))
            cur["findings"].append(key)

    def _start(self, name: str, tracker: Tracker, arm: str, tags: dict[str, str]) -> None:
        """start_arm once per arm and process, and again when its tags change (a verdict is added)."""
        if self._started[name].get(arm) != tags:
            tracker.start_arm(arm, tags)
            self._started[name][arm] = tags

    def _each(self, call) -> None:
        for name, tracker in self.trackers.items():
            try:
                call(name, tracker)
            except Exception as e:  # an observer's failure must not stop training
                warnings.warn(f"run.report_to: {name} failed ({e!r})", stacklevel=3)


def _new_metrics(
    store: RolloutStore, pending: dict[str, dict[str, Any]], sent: dict[str, int]
) -> list[tuple[int, str, dict[str, float]]]:
    """(step, branch, metrics) not yet sent, in step order; only the steps a committed branch row covers
    (a stage killed mid-way may have left shards its redo replaces)."""
    if not pending:
        return []
    where = " OR ".join("(branch = ? AND step > ? AND step <= ?)" for _ in pending)
    args = [x for b, r in pending.items() for x in (b, sent.get(b, -1), r["last_step"])]
    rows = store.sql(f"SELECT branch, step, name, value FROM metrics WHERE {where} ORDER BY step, branch", args)
    out: dict[tuple[int, str], dict[str, float]] = {}
    for r in rows:
        out.setdefault((r["step"], r["branch"]), {})[r["name"]] = r["value"]
    return [(step, branch, m) for (step, branch), m in out.items()]


def arm_tags(branch: dict[str, Any]) -> dict[str, str]:
    """A branch row as tracker tags."""
    keys = ("parent", "round", "kind", "harness_version", "suite_version", "seed")
    return {"branch": branch["id"], **{k: "" if branch[k] is None else str(branch[k]) for k in keys}}


def verdict_text(v: VerdictRecord, trial: TrialRecord) -> str:
    reasons = "; ".join(v.reasons) or "-"
    return (
        f"{v.decision}: {trial.candidate} vs {trial.control} (round {v.round}, trial {v.trial})\n"
        f"intervention: {trial.intervention.describe()}\nreasons: {reasons}\nevaluator: {v.evaluator_hash}"
    )


def finding_text(f: dict[str, Any]) -> str:
    evidence = ", ".join(list(f["evidence"] or [])[:5])
    return (
        f"{f['severity']} {f['name']} on {f['branch']} steps {f['first_step']}-{f['last_step']}: {f['message']}\n"
        f"value {f['value']:.4g} (threshold {f['threshold']:.4g}); evidence {evidence}"
    )
