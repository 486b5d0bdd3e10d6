"""The Ray executor (loop.executor: ray) on a local 2-CPU Ray node, one per module: a loop decides as the
serial executor does and resumes after a lost worker; a worker that cannot read the run directory fails at
once; a batch larger than the node runs in turns; a worker lost once is retried."""

from __future__ import annotations

import io
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from rich.console import Console

try:
    import ray
except ImportError:
    if os.environ.get("CI"):  # CI installs the dev extra, which has ray: there its absence is a failure
        raise
    pytest.skip("ray is not installed: pip install 'evotrainer[ray]'", allow_module_level=True)

from conftest import small_config
from evotrainer.backtest.ray_executor import RayExecutor, connect
from evotrainer.backtest.trial import ArmSpec
from evotrainer.errors import ConfigError, InfrastructureError
from evotrainer.loop import run_loop
from evotrainer.stages.results import read_stage
from evotrainer.store.ledger import Ledger
from evotrainer.training.grpo import GRPOTrainer


@pytest.fixture(scope="module")
def node():
    address = os.environ.pop("RAY_ADDRESS", None)  # a local node, whatever cluster the shell points at
    connect(num_cpus=2)
    yield
    ray.shutdown()
    if address is not None:
        os.environ["RAY_ADDRESS"] = address


class ArmKiller(threading.Thread):
    """SIGKILLs the first `times` Ray workers that run an arm (process title `ray::arm_task`) under this
    test process, each as soon as it appears: a worker lost as the OOM killer or a dead node loses one."""

    def __init__(self, times: int):
        super().__init__(daemon=True)
        self.times, self.killed, self.done = times, [], threading.Event()

    def run(self) -> None:
        while len(self.killed) < self.times and not self.done.is_set():
            for pid in _arm_workers():
                if pid not in self.killed:
                    os.kill(pid, signal.SIGKILL)
                    self.killed.append(pid)
                    break
            time.sleep(0.05)

    def __enter__(self) -> ArmKiller:
        self.start()
        return self

    def __exit__(self, *_) -> None:
        self.done.set()
        self.join()


def _arm_workers() -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "cmdline").read_bytes().startswith(b"ray::arm_task"):
                if _descends_from_us(int(entry.name)):  # not another program's Ray node on this machine
                    out.append(int(entry.name))
        except OSError:  # the process ended while we looked
            continue
    return out


def _descends_from_us(pid: int) -> bool:
    while pid > 1:
        if pid == os.getpid():
            return True
        pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    return False


def _config(tmp: Path, executor: str):
    loop = {
        "executor": executor,
        "segment_steps": 2,
        "trial_steps": 3,
        "candidates": 2,
        "max_rounds": 1,
        "max_trial_share": 1.0,
        "skills_dir": str(tmp / "skills"),
    }
    # One thread everywhere: an arm in this process and an arm on a 1-CPU Ray worker then compute alike.
    return small_config(tmp, loop=loop, run={"threads": 1})


def _decisions(run_dir: Path) -> tuple:
    ledger = Ledger(run_dir / "ledger.sqlite")
    arms = {a.branch: (a.accuracy, a.outcomes, a.stopped) for a in read_stage(ledger, 1, "trial").arms}
    return [(v["trial"], v["decision"]) for v in ledger.verdicts()], arms


def test_a_ray_loop_decides_as_the_serial_one_and_resumes_after_a_lost_worker(tmp_path, math_setup, node):
    """The round's segment loses its worker twice (the task and its one retry): the run stops with an
    infrastructure error, `resume` redoes the stage on Ray, and every decision and arm accuracy is the
    serial executor's."""
    serial = run_loop(_config(tmp_path / "serial", "serial"), Console(file=io.StringIO()))
    cfg = _config(tmp_path / "ray", "ray")
    lost = "WorkerCrashedError.*after 1 retry.*evotrainer resume"
    with ArmKiller(times=2) as killer, pytest.raises(InfrastructureError, match=lost):
        run_loop(cfg, Console(file=io.StringIO()))
    assert len(killer.killed) == 2
    run_dir = tmp_path / "ray" / "runs" / "t"
    assert Ledger(run_dir / "ledger.sqlite").stage_result(1, "train") is None  # nothing of the stage committed
    resumed = run_loop(cfg, Console(file=io.StringIO()), resume=True)
    assert _decisions(run_dir) == _decisions(tmp_path / "serial" / "runs" / "t")
    assert (resumed["promoted"], resumed["rejected"]) == (serial["promoted"], serial["rejected"])
    assert resumed["final_accuracy"] == serial["final_accuracy"]


def _arm(tmp_path: Path, cfg, start: Path, name: str) -> ArmSpec:
    return ArmSpec(
        branch=name,
        role="segment",
        run_dir=str(tmp_path),
        config=cfg.model_dump(mode="json"),
        harness=cfg.harness.model_dump(mode="json"),
        start=str(start),
        seed=0,
        first_step=1,
        steps=1,
    )


def test_a_worker_that_cannot_read_the_parent_checkpoint_fails_at_once(tmp_path, math_setup, node):
    cfg, _, _ = math_setup
    with pytest.raises(ConfigError, match=r"cannot read the parent checkpoint .*elsewhere.*shared storage"):
        RayExecutor(cpus_per_arm=1).run([_arm(tmp_path, cfg, tmp_path / "elsewhere", "a")])
    assert not (tmp_path / "checkpoints").exists()  # refused before the arm wrote anything


def test_a_batch_larger_than_the_node_runs_in_turns_and_a_worker_lost_once_is_retried(tmp_path, math_setup, node):
    """Three 1-CPU arms on the 2-CPU node: a 2-bundle group (a 3-bundle one could never be placed), the third
    arm queued until a bundle frees; the first arm's worker is killed once, and its retry finishes it."""
    cfg, _, policy = math_setup
    executor = RayExecutor(cpus_per_arm=1)
    assert (executor.at_once(3), executor.at_once(1)) == (2, 1)
    with pytest.raises(ConfigError, match="loop.ray_cpus_per_arm=3.*no node"):
        RayExecutor(cpus_per_arm=3).at_once(1)
    start = tmp_path / "start"
    GRPOTrainer(policy.fork(tmp_path / "fork"), cfg.harness).save(start)
    with ArmKiller(times=1) as killer:
        out = executor.run([_arm(tmp_path, cfg, start, name) for name in "abc"])
    assert len(killer.killed) == 1
    assert [(r.branch, r.last_step) for r in out] == [("a", 1), ("b", 1), ("c", 1)]
    assert all((tmp_path / "checkpoints" / name / "arm.json").is_file() for name in "abc")
