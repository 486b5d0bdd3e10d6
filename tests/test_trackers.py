"""run.report_to: step metrics, arms, verdicts and findings reach TensorBoard and MLflow, read back here."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from conftest import small_config
from evotrainer.config import parse_config
from evotrainer.diagnostics.detector import Finding
from evotrainer.errors import ConfigError
from evotrainer.store.ledger import Ledger
from evotrainer.store.rollouts import RolloutStore
from evotrainer.trackers.forward import Forwarder
from evotrainer.trackers.tracker import check_report_to, trl_logged

TRACKERS = ["tensorboard", "mlflow"]


def quiet() -> Console:
    return Console(file=io.StringIO(), width=200)


def scalars(logdir: Path) -> dict[str, dict[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


def texts(logdir: Path) -> dict[str, list[str]]:
    """Text summaries (TensorBoard stores them as string tensors) by tag."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"tensors": 0})
    acc.Reload()
    return {
        tag.removesuffix("/text_summary"): [b.decode() for e in acc.Tensors(tag) for b in e.tensor_proto.string_val]
        for tag in acc.Tags()["tensors"]
    }


def mlflow_client(run_dir: Path):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=(run_dir / "mlruns").resolve().as_uri())


def mlflow_runs(run_dir: Path, name: str = "t") -> dict[str, object]:
    """The run's MLflow runs by branch tag (the run as a whole under "")."""
    client = mlflow_client(run_dir)
    exp = client.get_experiment_by_name(name)
    return {r.data.tags.get("branch", ""): r for r in client.search_runs([exp.experiment_id])}


@pytest.fixture(autouse=True)
def _local_mlflow(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


def test_metric_names_as_a_trl_run_logs_them_in_each_tracker():
    stored = {"reward": 0.5, "completions/mean_length": 7.0, "eval/accuracy": 0.25}
    assert trl_logged(stored, rewrite=True) == {
        "train/reward": 0.5,
        "train/completions/mean_length": 7.0,
        "eval/accuracy": 0.25,
    }
    assert trl_logged(stored, rewrite=False) == {"reward": 0.5, "completions/mean_length": 7.0, "eval_accuracy": 0.25}


def test_an_unknown_tracker_is_a_config_error_naming_the_field():
    with pytest.raises(ConfigError, match=r"run\.report_to"):
        parse_config({"run": {"report_to": ["tensorbored"]}})
    with pytest.raises(ConfigError, match=r"run\.report_to: unknown tracker 'x'"):
        check_report_to(["x"])
    assert parse_config({"run": {"report_to": "mlflow"}}).run.report_to == ["mlflow"]
    assert parse_config({"run": {"report_to": "none"}}).run.report_to == []
    assert parse_config({}).run.report_to == []


def test_a_tracker_without_its_package_stops_the_run_before_anything_is_written(tmp_path, monkeypatch):
    import importlib.util

    from evotrainer.training.run import train_run

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "mlflow" else real(n, *a))
    cfg = small_config(tmp_path, run={"report_to": ["mlflow"]})
    with pytest.raises(
        ConfigError, match=r"run\.report_to: 'mlflow' needs the mlflow extra: `pip install -e '\.\[mlflow\]'`"
    ):
        train_run(cfg, quiet())
    assert not (tmp_path / "runs" / "t").exists()


def test_train_sends_every_step_to_tensorboard_and_mlflow(tmp_path, math_setup, recwarn):
    from evotrainer.training.run import train_run

    cfg = small_config(tmp_path, run={"report_to": TRACKERS}, train={"steps": 3, "max_seconds": 120})
    train_run(cfg, quiet())
    assert not [w for w in recwarn if "run.report_to" in str(w.message)]
    run_dir = tmp_path / "runs" / "t"
    stored = RolloutStore(run_dir / "store").metrics("main")
    assert sorted(stored) == [1, 2, 3]

    tb = scalars(run_dir / "tensorboard" / "main")
    ml = mlflow_runs(run_dir)
    client, arm = mlflow_client(run_dir), ml["main"]
    assert arm.data.tags["harness_version"] == cfg.harness.version
    assert arm.data.tags["mlflow.parentRunId"] == ml[""].info.run_id
    # Under the keys a TRL run has in each tracker (transformers' callbacks): TensorBoard `train/NAME` and
    # `eval/NAME`; MLflow the Trainer's keys as they are, `NAME` and `eval_NAME`. The store keeps its names.
    for name in ("reward", "entropy", "completions/mean_length", "frac_reward_zero_std"):
        key = "entropy/mean" if name == "entropy" else name  # beside entropy/trained in a file store
        want = {step: m[name] for step, m in stored.items()}
        assert tb[f"train/{name}"] == pytest.approx(want, rel=1e-6)  # TensorBoard stores float32
        got = {m.step: m.value for m in client.get_metric_history(arm.info.run_id, key)}
        assert got == pytest.approx(want)
    assert set(tb["eval/accuracy"]) == {0, 3} and "reward" not in tb
    assert {m.step for m in client.get_metric_history(arm.info.run_id, "eval_accuracy")} == {0, 3}
    assert "summary.json" in [a.path for a in client.list_artifacts(ml[""].info.run_id)]


def test_a_loop_run_sends_each_arm_tagged_and_its_verdicts(tmp_path, math_setup, recwarn):
    from evotrainer.loop import run_loop

    loop = {
        "segment_steps": 2,
        "trial_steps": 2,
        "candidates": 1,
        "max_rounds": 1,
        "skills_dir": str(tmp_path / "skills"),
        "max_trial_share": 1.0,
    }
    cfg = small_config(tmp_path, run={"report_to": TRACKERS}, loop=loop)
    run_loop(cfg, quiet())
    assert not [w for w in recwarn if "run.report_to" in str(w.message)]
    run_dir = tmp_path / "runs" / "t"
    ledger, store = Ledger(run_dir / "ledger.sqlite"), RolloutStore(run_dir / "store")
    branches = {b["id"]: b for b in ledger.branches()}
    ml, client = mlflow_runs(run_dir), mlflow_client(run_dir)
    trained = [b for b in branches if store.metrics(b)]
    assert "r01-seg" in trained
    for b in trained:
        stored = store.metrics(b)
        tags = ml[b].data.tags
        assert (tags["harness_version"], tags["round"]) == (branches[b]["harness_version"], str(branches[b]["round"]))
        assert tags["parent"] == (branches[b]["parent"] or "")
        got = {m.step: m.value for m in client.get_metric_history(ml[b].info.run_id, "reward")}
        assert got == pytest.approx({s: m["reward"] for s, m in stored.items()})
        assert scalars(run_dir / "tensorboard" / b)["train/reward"] == pytest.approx(got, rel=1e-6)
    run_events = [a.path for a in client.list_artifacts(ml[""].info.run_id, "events")]
    for v in ledger.verdicts():
        assert any(v["trial"] in p for p in run_events)
        candidate = next(t["candidate"] for t in ledger.trials() if t["id"] == v["trial"])
        assert ml[candidate].data.tags["verdict"] == v["decision"]
        assert any(v["decision"] in t for t in texts(run_dir / "tensorboard" / candidate)["verdict"])
    assert "report.html" in [a.path for a in client.list_artifacts(ml[""].info.run_id)]


class Recorder:
    """A tracker that records its calls."""

    def __init__(self):
        self.calls: list[tuple] = []

    def start_arm(self, arm, tags):
        self.calls.append(("arm", arm, tags.get("verdict")))

    def log_metrics(self, arm, step, metrics):
        self.calls.append(("metrics", arm, step, dict(metrics)))

    def log_event(self, arm, step, title, text):
        self.calls.append(("event", arm, step, title))

    def log_artifact(self, path):
        self.calls.append(("artifact", Path(path).name))

    def close(self):
        self.calls.append(("close",))


def _branch(bid: str, first: int, last: int, parent: str | None = None) -> dict:
    return {
        "id": bid,
        "parent": parent,
        "round": 1,
        "kind": "segment",
        "checkpoint": "c",
        "harness_version": "h1",
        "suite_version": "s1",
        "first_step": first,
        "last_step": last,
        "seed": 0,
        "heldout_accuracy": None,
    }


def test_sync_sends_only_what_is_committed_and_not_yet_sent(tmp_path):
    ledger, store = Ledger(tmp_path / "ledger.sqlite"), RolloutStore(tmp_path / "store")
    for step in (1, 2, 3):  # step 3 is a killed stage's leftover: no committed branch row covers it
        store.append_metrics("t", "r01-seg", step, {"reward": step / 10}, f"r01-seg-s{step:06d}")
    ledger.finish_stage(1, "train", {}, branches=[_branch("r01-seg", 0, 2)])
    first = Recorder()
    Forwarder({"rec": first}, tmp_path).sync(ledger, store)
    assert [c[2] for c in first.calls if c[0] == "metrics"] == [1, 2]

    # A resumed run (a new Forwarder on the same directory) sends only what came after.
    ledger.finish_stage(1, "train", {}, branches=[_branch("r01-seg", 0, 3)])
    iv = {
        "kind": "set_knob",
        "target": "sampling.temperature",
        "value": 1.2,
        "hypothesis": {"finding": "x", "signal": "entropy", "direction": "up"},
    }
    ledger.finish_stage(
        1,
        "gate",
        {},
        branches=[_branch("r01-c1", 3, 3, parent="r01-seg")],
        trials=[
            {
                "id": "r01-t1",
                "round": 1,
                "candidate": "r01-c1",
                "control": "r01-ctl",
                "intervention": iv,
                "source": "heuristic",
                "skill_id": None,
                "signature": [],
                "replay": {},
            }
        ],
        verdicts=[
            {
                "trial": "r01-t1",
                "round": 1,
                "decision": "reject",
                "reasons": ["no win"],
                "statistic": {
                    "test": "race",
                    "level": 0.95,
                    "candidates": 1,
                    "wins": 0,
                    "losses": 0,
                    "n": 1,
                    "delta": 0,
                },
                "noise": {},
                "findings": [],
                "budget": {"candidate": {}, "control": {}, "spent": {}},
                "evaluator_hash": "e",
            }
        ],
    )
    clip = Finding(
        "truncation",
        "warn",
        0.6,
        0.3,
        ("r01-seg-s000003-0",),
        (),
        "60% clipped",
        branch="r01-seg",
        first_step=1,
        last_step=3,
    )
    store.append_findings([clip], "s1", "r01-seg-d3", "r01-seg", 1, 3)
    second = Recorder()
    fwd = Forwarder({"rec": second}, tmp_path)
    fwd.sync(ledger, store)
    fwd.sync(ledger, store)  # nothing new: nothing sent twice
    assert [c for c in second.calls if c[0] == "metrics"] == [("metrics", "r01-seg", 3, {"reward": 0.3})]
    assert ("arm", "r01-c1", "reject") in second.calls
    events = [c for c in second.calls if c[0] == "event"]
    assert events == [
        ("event", "r01-c1", 3, "verdict"),
        ("event", None, 1, "verdict/r01-t1"),
        ("event", "r01-seg", 3, "finding/truncation"),
    ]
    fwd.finish([tmp_path / "ledger.sqlite", tmp_path / "missing.html"])
    assert second.calls[-2:] == [("artifact", "ledger.sqlite"), ("close",)]


def test_a_failing_tracker_is_retried_and_does_not_stop_the_run(tmp_path):
    ledger, store = Ledger(tmp_path / "ledger.sqlite"), RolloutStore(tmp_path / "store")
    store.append_metrics("t", "b", 1, {"reward": 1.0}, "b-s000001")
    ledger.finish_stage(1, "train", {}, branches=[_branch("b", 0, 1)])

    class Flaky(Recorder):
        fail = True

        def log_metrics(self, arm, step, metrics):
            if self.fail:
                raise OSError("tracker down")
            super().log_metrics(arm, step, metrics)

    flaky = Flaky()
    fwd = Forwarder({"flaky": flaky}, tmp_path)
    with pytest.warns(UserWarning, match="run.report_to: flaky failed"):
        fwd.sync(ledger, store)
    flaky.fail = False
    fwd.sync(ledger, store)
    assert [c for c in flaky.calls if c[0] == "metrics"] == [("metrics", "b", 1, {"reward": 1.0})]


SMOKE = """
import sys
from pathlib import Path
from evotrainer.trackers.tracker import make_tracker
run_dir = Path(sys.argv[2])
t = make_tracker(sys.argv[1], run_dir, "demo", {"run": {"seed": 0}})
t.start_arm("r01-seg", {"branch": "r01-seg", "harness_version": "h1"})
for step in (1, 2, 3):
    t.log_metrics("r01-seg", step, {"reward": step / 10, "completions/mean_length": 4.0})
t.start_arm("r01-seg", {"branch": "r01-seg", "harness_version": "h1", "verdict": "reject"})
t.log_event("r01-seg", 3, "verdict", "reject: no win")
t.log_event(None, 1, "verdict/r01-t1", "reject: no win")
(run_dir / "report.html").write_text("<html></html>")
t.log_artifact(run_dir / "report.html")
t.close()
"""


@pytest.mark.parametrize("name", ["wandb", "trackio"])
def test_wandb_and_trackio_take_the_contract_offline(tmp_path, name):
    """In a child process: both keep process-wide state, and trackio's store is chosen at import."""
    import os
    import subprocess
    import sys

    pytest.importorskip(name)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "TRACKIO_"))}
    env.update(TRACKIO_DIR=str(tmp_path / "trackio"), WANDB_SILENT="true", HF_HUB_OFFLINE="1")
    out = subprocess.run(
        [sys.executable, "-c", SMOKE, name, str(tmp_path)], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    if name == "wandb":
        assert len(list((tmp_path / "wandb").glob("offline-run-*-r01-seg"))) == 1
    else:
        assert (tmp_path / "trackio" / "demo.db").is_file()
