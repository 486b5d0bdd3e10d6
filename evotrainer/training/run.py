"""`evotrainer train`: warm-start (or load) the policy, evaluate, run RL steps under the harness,
evaluate again. Every rollout and step metric goes to the run's store."""

from __future__ import annotations

import json
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from evotrainer.config import RunConfig, dump_config
from evotrainer.envs.registry import make_domain, warm_start_key
from evotrainer.errors import ConfigError
from evotrainer.evaluation import evaluate, record_eval
from evotrainer.harness.harness import save_harness
from evotrainer.harness.rewards import check_terms
from evotrainer.policies import check_device, check_policy_path, load_policy
from evotrainer.store.rollouts import RolloutStore
from evotrainer.trackers.forward import Forwarder
from evotrainer.trackers.tracker import check_report_to
from evotrainer.training.segment import StepContext
from evotrainer.training.trl_backend import check_trl, make_trainer, run_steps

BRANCH = "main"


def progress_bar(console: Console) -> Progress | PlainProgress:
    """Bars on a terminal; plain lines elsewhere (a log file, CI), where a bar would draw nothing until it ends."""
    if not console.is_terminal:
        return PlainProgress(console)
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )


PLAIN_EVERY = 30.0
"""Seconds between two lines of a task that advances slowly: a reader of the log can tell slow from stuck."""


@dataclass
class _Line:
    description: str
    total: float | None
    started: float
    completed: float = 0.0
    said_at: float = 0.0
    said_tenth: int = -1


class PlainProgress:
    """rich's Progress as plain lines (the calls training, evaluation and the warm start make of it): a line
    when a task starts, at each tenth of its total, every PLAIN_EVERY seconds in between, and when it ends."""

    def __init__(self, console: Console):
        self.console = console
        self.tasks: list[_Line] = []

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *_: Any) -> None:
        return None

    def add_task(self, description: str, total: float | None = None, **_: Any) -> int:
        now = time.perf_counter()
        self.tasks.append(_Line(description, total, now))
        self._say(self.tasks[-1], now)
        return len(self.tasks) - 1

    def update(self, task: int, advance: float = 0.0, description: str | None = None, **_: Any) -> None:
        line, now = self.tasks[task], time.perf_counter()
        line.completed += advance
        line.description = description or line.description
        tenth = int(10 * line.completed / line.total) if line.total else -1
        if tenth > line.said_tenth or now - line.said_at >= PLAIN_EVERY:
            self._say(line, now)

    def _say(self, line: _Line, now: float) -> None:
        of = f" {line.completed:g}/{line.total:g}" if line.total else ""
        self.console.print(f"{line.description}{of} ({now - line.started:.0f}s)", markup=False, highlight=False)
        line.said_at = now
        line.said_tenth = int(10 * line.completed / line.total) if line.total else -1


def seed_everything(cfg: RunConfig) -> None:
    torch.set_num_threads(cfg.run.threads)
    torch.manual_seed(cfg.run.seed)
    random.seed(cfg.run.seed)


def claim_run_dir(run_dir: Path, overwrite: bool) -> None:
    """A new run's directory is empty: a second run written over a first would leave one summary over both
    runs' stores, and every reader (diagnose, rollouts, the report) would mix them. `overwrite` clears a
    run directory first (never a directory that is not one)."""
    if not run_dir.is_dir() or not any(run_dir.iterdir()):
        return
    loop = (run_dir / "ledger.sqlite").exists()
    if not overwrite:
        raise ConfigError(
            f"run.name: {run_dir} already holds a {'loop ' if loop else ''}run; choose another run.name, or pass "
            "--overwrite to clear it first"
            + (f" (`evotrainer resume {run_dir}` continues the loop run)" if loop else "")
        )
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(
            f"--overwrite: {run_dir} is not a run directory (no config.yaml), so it is not cleared; choose "
            "another run.name or run.out_dir"
        )
    shutil.rmtree(run_dir)


def train_run(cfg: RunConfig, console: Console | None = None, overwrite: bool = False) -> dict:
    """The static run; a used run directory is refused unless `overwrite` (then cleared, once every check
    of the config has passed)."""
    console = console or Console()
    seed_everything(cfg)
    # Everything the config can get wrong is checked before the run directory is written.
    domain = make_domain(cfg)
    check_terms(cfg.harness, domain)
    check_trl(cfg.train, cfg.harness, domain)
    check_policy_path(cfg.policy)
    check_device(cfg.policy, cfg.loop.executor)
    check_report_to(cfg.run.report_to)
    run_dir = Path(cfg.run.out_dir) / cfg.run.name
    claim_run_dir(run_dir, overwrite)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(dump_config(cfg))
    save_harness(run_dir, cfg.harness)
    console.print(f"[bold]run[/] {run_dir}  harness {cfg.harness.version}  domain {cfg.env.domain}")
    store = RolloutStore(run_dir / "store")
    ctx = StepContext(run=cfg.run.name, branch=BRANCH, seed=cfg.run.seed)
    tracking = Forwarder.open(cfg.run.report_to, run_dir, cfg.run.name, cfg.model_dump(mode="json"))
    tracking.start_arm(BRANCH, {"branch": BRANCH, "harness_version": cfg.harness.version, "kind": "train"})
    heldout, pool = domain.tasks("heldout"), domain.tasks("train")
    with progress_bar(console) as progress:
        policy = load_policy(
            cfg.policy, domain, cfg.run.seed, warm_start_key(cfg, domain), progress=progress, log=console.print
        )
        seed_everything(cfg)
        before = evaluate(policy, domain, heldout, cfg.eval, progress)
    record_eval(store, cfg.harness, domain, before, 0, ctx)
    tracking.log_metrics(BRANCH, 0, {"eval/accuracy": before.accuracy})
    console.print(
        f"held-out accuracy before RL: [bold]{before.accuracy:.3f}[/] "
        f"({len(heldout)} tasks, evaluator {before.evaluator_hash})"
    )
    trainer = make_trainer(cfg.train, policy, domain, cfg.harness)
    t0, history = time.perf_counter(), []
    with progress_bar(console) as progress:
        bar = progress.add_task("RL", total=cfg.train.steps)

        def after(step: int, m: dict[str, float]) -> bool:
            """Each finished step: trackers, progress, the periodic evaluation and checkpoint, the time cap."""
            tracking.log_metrics(BRANCH, step, m)
            progress.update(bar, advance=1, description=f"RL reward {m['reward']:.3f} entropy {m['entropy']:.2f}")
            if cfg.train.eval_every and step % cfg.train.eval_every == 0 and step < cfg.train.steps:
                mid = evaluate(policy, domain, heldout, cfg.eval)
                record_eval(store, cfg.harness, domain, mid, step, ctx)
                tracking.log_metrics(BRANCH, step, {"eval/accuracy": mid.accuracy})
                history.append({"step": step, "seconds": time.perf_counter() - t0, "accuracy": mid.accuracy})
                progress.console.print(f"step {step}: held-out accuracy {mid.accuracy:.3f}")
            if cfg.train.checkpoint_every and step % cfg.train.checkpoint_every == 0:
                trainer.save(run_dir / "checkpoints" / BRANCH)
            return time.perf_counter() - t0 < cfg.train.max_seconds

        step = run_steps(trainer, domain, pool, ctx, 1, cfg.train.steps, store, cfg.eval.audit_fraction, {}, after)
    rl_seconds = time.perf_counter() - t0
    cut = step < cfg.train.steps  # only the time cap stops training before train.steps
    trainer.save(run_dir / "checkpoints" / BRANCH)
    with progress_bar(console) as progress:
        after = evaluate(policy, domain, heldout, cfg.eval, progress)
    record_eval(store, cfg.harness, domain, after, step, ctx)
    tracking.log_metrics(BRANCH, step, {"eval/accuracy": after.accuracy})
    history.append({"step": step, "seconds": rl_seconds, "accuracy": after.accuracy})
    summary = {
        "run": cfg.run.name,
        "steps": step,
        "rl_seconds": round(rl_seconds, 1),
        "cut_by_seconds": cut,
        "accuracy_before": before.accuracy,
        "accuracy_after": after.accuracy,
        "evaluator_hash": after.evaluator_hash,
        "harness_version": cfg.harness.version,
        "history": history,
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    tracking.finish([run_dir / "summary.json"])
    _tell_end(console, cfg, summary)
    return summary


def _tell_end(console: Console, cfg: RunConfig, s: dict) -> None:
    """The run's last lines: a cut by the time cap first (its length was the machine's, not train.steps'),
    then the held-out accuracy after against before."""
    if s["cut_by_seconds"]:
        console.print(
            f"[bold red]CUT SHORT by train.max_seconds ({cfg.train.max_seconds:.0f} s, a safety net) after "
            f"{s['steps']} of {cfg.train.steps} steps: raise it to let train.steps decide[/]"
        )
    console.print(
        f"held-out accuracy after {s['steps']} RL steps ({s['rl_seconds']:.0f}s): [bold]{s['accuracy_after']:.3f}[/] "
        f"(before: {s['accuracy_before']:.3f}, change {s['accuracy_after'] - s['accuracy_before']:+.3f})"
    )
