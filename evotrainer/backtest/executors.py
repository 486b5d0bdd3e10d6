"""Where trial arms run (`loop.executor`): one after another in this process, in worker processes, or as
Ray tasks (backtest/ray_executor.py, with the ray extra). Every executor runs the same pure arm function,
so the choice changes the wall time, not the results."""

from __future__ import annotations

import signal
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from typing import Protocol

from evotrainer.backtest.trial import ArmResult, ArmSpec, run_arm, run_arm_in_worker
from evotrainer.config import LoopSection
from evotrainer.errors import ConfigError

Started = Callable[[ArmSpec], None]  # told when an arm starts (for `evotrainer status`)


class Executor(Protocol):
    """Runs arms; returns their results in the order given."""

    def run(self, specs: list[ArmSpec], started: Started | None = None) -> list[ArmResult]: ...


class SerialExecutor:
    """One arm after another in this process (the default: 2-core machines gain nothing from more)."""

    def __init__(self, log: Callable[[str], None] | None = None):
        self.log = log

    def run(self, specs: list[ArmSpec], started: Started | None = None) -> list[ArmResult]:
        out = []
        for s in specs:
            if started:
                started(s)
            out.append(run_arm(s, self.log))
        return out


class ProcessExecutor:
    """Arms in parallel worker processes (spawned: no fork of a process that holds torch threads).
    Each worker gets an equal share of the configured threads. A worker that dies takes its arm with
    it: the error is raised here and the stage is redone on resume."""

    def __init__(self, workers: int, threads: int):
        self.workers = workers
        self.threads = max(1, threads // workers)

    def run(self, specs: list[ArmSpec], started: Started | None = None) -> list[ArmResult]:
        for s in specs if started else ():
            started(s)
        with ProcessPoolExecutor(
            max_workers=self.workers, mp_context=get_context("spawn"), initializer=_ignore_interrupt
        ) as pool:
            futures = [pool.submit(run_arm_in_worker, s, self.threads) for s in specs]
            return [ArmResult(**f.result()) for f in futures]


def _ignore_interrupt() -> None:
    """A terminal's Ctrl-C reaches the whole process group: the workers leave it to the loop, which stops at
    the next stage boundary (an arm killed mid-way would fail the stage instead)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def make_executor(loop: LoopSection, threads: int, log: Callable[[str], None] | None = None) -> Executor:
    """The executor of `loop.executor`, its process workers at `threads` torch threads each (`run.threads`).
    For ray this joins the cluster (or starts a local node), so the loop calls it before it writes the run
    directory: a missing extra or an unreachable cluster stops the run with nothing written."""
    if loop.executor == "ray":
        try:
            from evotrainer.backtest.ray_executor import RayExecutor  # the ray extra: imported only when asked for
        except ImportError as e:
            if not (e.name or "").startswith("ray"):
                raise
            raise ConfigError("loop.executor: ray needs the ray extra: pip install 'evotrainer[ray]'") from None
        return RayExecutor(loop.ray_cpus_per_arm, loop.ray_gpus_per_arm)
    if loop.executor == "process":
        return ProcessExecutor(loop.workers, threads)
    return SerialExecutor(log)
