"""The loop's commands: `run`, `resume`, `status`, `report`."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

import typer
from rich.live import Live
from rich.table import Table

from evotrainer.cli.common import console, err, loop_dir, parse_overrides, run_dir
from evotrainer.config import load_config
from evotrainer.errors import UserError
from evotrainer.store.checkpoints import human


def run(
    config: Path = typer.Argument(..., help="YAML run config"),
    set_: list[str] = typer.Option([], "--set", help="Override a field, e.g. --set budget.seconds=600"),
) -> None:
    """Run the co-evolution loop (train, diagnose, revise, propose, replay, trial, gate, promote, remember)
    until the budget is spent."""
    cfg = load_config(config, parse_overrides(set_))  # first: a mistyped field is named before torch loads
    from evotrainer.loop import run_loop

    used = Path(cfg.run.out_dir) / cfg.run.name
    if (used / "config.yaml").exists() and not (used / "ledger.sqlite").exists():
        # A loop run written into a `train` run's directory would mix the two runs' stores.
        raise UserError(f"run.name: {used} holds an `evotrainer train` run; choose another run.name")
    _until_stopped(cfg.run, lambda: run_loop(cfg, console))


def resume(
    run: Path = typer.Argument(..., help="Run directory of a loop run"),
    accept_evaluator_change: bool = typer.Option(
        False,
        help="Continue although the evaluator (its code, settings, data or package versions) changed since "
        "the run started; the change is recorded in the ledger",
    ),
) -> None:
    """Continue a loop run that was stopped or killed, from its first unfinished stage."""
    from evotrainer.loop import run_loop

    cfg = load_config(loop_dir(run) / "config.yaml")
    cfg = cfg.model_copy(update={"run": cfg.run.model_copy(update={"out_dir": run.parent, "name": run.name})})
    _until_stopped(
        cfg.run, lambda: run_loop(cfg, console, resume=True, accept_evaluator_change=accept_evaluator_change)
    )


def _until_stopped(run, work) -> None:
    """Run the loop; SIGTERM or SIGINT (Ctrl-C) stops it at the next stage boundary, where everything before
    is committed, and exits 128 + the signal's number. A second signal ends it at once (the default). A full
    disk stops it with a message naming where (every write is atomic and every stage one transaction, so
    nothing committed is lost)."""
    from evotrainer.loop import Stopped, request_stop

    request_stop(0)  # a stop asked of an earlier run in this process is not this one's

    def handler(signum, _frame) -> None:
        for s in (signal.SIGTERM, signal.SIGINT):
            signal.signal(s, signal.SIG_DFL)
        err.print(f"{signal.Signals(signum).name}: stopping at the next stage boundary (again to stop now)")
        request_stop(signum)

    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, handler)
    try:
        work()
    except Stopped as e:
        err.print(str(e), markup=False, highlight=False)
        raise SystemExit(e.exit_code) from None  # not typer.Exit: standalone_mode=False returns its code
    except Exception as e:
        if not _disk_full(e):
            raise
        raise UserError(_no_space(Path(run.out_dir) / run.name, getattr(e, "filename", None))) from None


def _disk_full(e: Exception) -> bool:
    """ENOSPC however a writer reports it: an OSError, SQLite's OperationalError, or a library's own error
    that only says so in its message (safetensors: "No space left on device (os error 28)")."""
    if isinstance(e, OSError):
        return e.errno == errno.ENOSPC
    text = str(e)
    return (isinstance(e, sqlite3.OperationalError) and "disk is full" in text) or "(os error 28)" in text


def _no_space(run_dir: Path, filename: str | None) -> str:
    where = Path(filename) if filename else run_dir
    try:
        free = f"{human(shutil.disk_usage(where if where.exists() else run_dir).free)} free"
    except OSError:
        free = "free space unknown"
    return (
        f"no space left on the device holding {where} ({free}); the run stopped there and nothing it committed "
        f"is lost: free some space, then `evotrainer resume {run_dir}` redoes the unfinished stage"
    )


@dataclass(frozen=True)
class RunState:
    """What `status` says of a loop run: its rows (label -> text), and whether it has finished."""

    rows: dict[str, str]
    finished: bool

    def table(self, name: str) -> Table:
        t = Table(title=f"EvoTrainer run {name}", show_header=False)
        for label, text in self.rows.items():
            t.add_row(label, text)
        return t


def run_state(run: Path) -> RunState:
    from evotrainer.backtest.verdict import read_verdicts
    from evotrainer.ids import branch_id
    from evotrainer.stages.results import FinalResult, PromoteResult, StartResult, read_stage, seconds_cut_note
    from evotrainer.stages.retention import disk_use
    from evotrainer.stages.spend import lineage, spend
    from evotrainer.store.ledger import Ledger

    ledger = Ledger(run / "ledger.sqlite")
    try:
        cfg = load_config(run / "config.yaml")
        st = ledger.status() or {}
        last = ledger.rows("SELECT round, stage FROM stages WHERE stage != 'final' ORDER BY finished DESC LIMIT 1")
        heads = ledger.rows("SELECT result FROM stages WHERE stage = 'promote' ORDER BY round DESC LIMIT 1")
        head = PromoteResult.model_validate_json(heads[0]["result"]).head if heads else None
        acc = ledger.rows("SELECT heldout_accuracy FROM branches WHERE id = ?", [head.branch]) if head else []
        verdicts = read_verdicts(ledger)
        done = read_stage(ledger, 0, "final")
        alive = bool(st.get("pid")) and _alive(st["pid"]) and done is None
        rows = {"state": "running" if alive else ("finished" if done else "stopped (resume to continue)")}
        if isinstance(done, FinalResult):
            started = read_stage(ledger, 0, "start")
            before = f"{started.final_accuracy:.3f} -> " if isinstance(started, StartResult) else ""
            rows["finished"] = (
                f"{done.rounds} round(s), stopped by {done.stop_reason}; final-task accuracy {before}"
                f"{done.accuracy:.3f}, mainline {done.head.branch} step {done.head.step}"
            )
            if done.ended_on_best:
                rows["ended on the best read"] = done.ended_on_best
            if done.cut_by_seconds:
                rows["cut short"] = seconds_cut_note(done.rounds)
        else:
            detail = f" ({st['detail']})" if st.get("detail") else ""
            rows["round / stage"] = f"{st.get('round', '-')} / {st.get('stage', '-')}{detail}"
        rows["last finished"] = f"round {last[0]['round']} {last[0]['stage']}" if last else "-"
        for label, used, cap in _budget_rows(ledger, cfg):
            rows[label] = f"{used:,.0f} / {cap:,.0f} ({100 * used / cap:.0f}%)" if cap else f"{used:,.0f}"
        rows["mainline"] = (
            f"{head.branch} step {head.step}, gate accuracy {acc[0]['heldout_accuracy']:.3f}"
            if head and acc and acc[0]["heldout_accuracy"] is not None
            else branch_id(0, "base")
        )
        share = spend(ledger, lineage(ledger, head.branch if head else branch_id(0, "base")))
        rows["discarded arms"] = f"{share.step_share:.0%} of training steps, {share.token_share:.0%} of arm tokens"
        disk = disk_use(ledger, run)
        rows["disk"] = (
            f"run directory {human(disk.run_bytes)}, checkpoints {human(disk.checkpoint_bytes)}; "
            f"pruning freed {human(disk.pruned_bytes)} (run.keep_checkpoints={cfg.run.keep_checkpoints})"
        )
        rows["skill library"] = ", ".join(ledger.skill_libraries()) or "-"
        opened = read_stage(ledger, 0, "start")
        adopted = opened.adopted if isinstance(opened, StartResult) else None
        rows["adopted skills"] = "; ".join(f"{a.skill}: {a.intervention.describe()}" for a in adopted or []) or "-"
        promotes = [
            PromoteResult.model_validate_json(r["result"])
            for r in ledger.rows("SELECT result FROM stages WHERE stage = 'promote' ORDER BY round")
        ]
        guarded = [p.rejected for p in promotes if p.rejected and p.rejected.regression]
        rows["regression rollbacks"] = (
            "; ".join(
                f"{r.branch} {r.regression.head_accuracy:.3f} < start {r.regression.start_accuracy:.3f} "
                f"(p {r.regression.p:.3g}) -> {r.rolled_back_to}"
                for r in guarded
            )
            or "-"
        )
        rows["repairs"] = (
            "; ".join(f"{p.repaired.trial}: harness {p.repaired.harness}" for p in promotes if p.repaired) or "-"
        )
        rows["verdicts"] = (
            f"{sum(v.decision == 'promote' for v in verdicts)} promoted, "
            f"{sum(v.decision == 'reject' for v in verdicts)} rejected"
        )
        return RunState(rows, done is not None)
    finally:
        ledger.close()


def _budget_rows(ledger, cfg) -> list[tuple[str, float, float]]:
    spent, b = ledger.spent(), cfg.budget
    return [
        ("budget generated tokens", spent.generated_tokens, b.generated_tokens),
        ("budget trained tokens", spent.trained_tokens, b.trained_tokens),
        ("budget seconds", spent.seconds, b.seconds),
    ]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


def status(
    run: Path = typer.Argument(..., help="Run directory of a loop run"),
    watch: bool = typer.Option(False, help="Keep refreshing while the run is going; ends when it has finished"),
    as_json: bool = typer.Option(False, "--json", help="One JSON object instead of a table"),
) -> None:
    """Where a loop run stands: round, stage, budget, mainline metric, current trial."""
    loop_dir(run)
    state = run_state(run)
    if as_json:
        print(json.dumps({**state.rows, "finished": state.finished}))
        return
    if not watch or state.finished:
        console.print(state.table(run.name))
        return
    with Live(state.table(run.name), console=console, refresh_per_second=1) as live:
        while not state.finished:
            time.sleep(1.0)
            state = run_state(run)
            live.update(state.table(run.name))


def report(run: Path = typer.Argument(..., help="Run directory (a loop run, a train run or an imported one)")) -> None:
    """Write the run's self-contained HTML report: a loop run's lineage, metrics, findings, verdicts and skills;
    another run's step metrics and findings with their evidence rollouts."""
    from evotrainer.report import write_report
    from evotrainer.report.single import write_run_report

    if (run / "ledger.sqlite").exists():
        console.print(f"wrote {write_report(run)}")
    else:
        console.print(f"wrote {write_run_report(run_dir(run))}")
