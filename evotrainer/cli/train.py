"""The single-run commands: `train`, `eval`, `rollouts`, `diagnose`, `backtest`."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.table import Table

from evotrainer.cli.common import console, err, parse_overrides, run_dir
from evotrainer.cli.harness import load_harness
from evotrainer.config import load_config
from evotrainer.errors import UserError


def train(
    config: Path = typer.Argument(..., help="YAML run config"),
    set_: list[str] = typer.Option([], "--set", help="Override a field, e.g. --set train.steps=50"),
) -> None:
    """Warm-start or load the policy, evaluate, train with RL under the harness, evaluate again."""
    from evotrainer.training.run import train_run

    cfg = load_config(config, parse_overrides(set_))
    train_run(cfg, console)


def eval_(run: Path = typer.Argument(..., help="Run directory")) -> None:
    """Evaluate the run's latest checkpoint on the held-out tasks (evaluator-owned)."""
    from evotrainer.envs.registry import make_domain
    from evotrainer.evaluation import evaluate
    from evotrainer.policies import placement
    from evotrainer.policies.hf import HFPolicy
    from evotrainer.training.run import BRANCH, progress_bar, seed_everything

    cfg = load_config(run_dir(run) / "config.yaml")
    ckpt = run / "checkpoints" / BRANCH
    if not ckpt.exists():
        raise UserError(f"{run}: no checkpoint yet ({ckpt}); the run has not finished a step")
    seed_everything(cfg)
    domain = make_domain(cfg)
    policy = HFPolicy.load(ckpt, placement=placement(cfg.policy))
    with progress_bar(console) as progress:
        res = evaluate(policy, domain, domain.tasks("heldout"), cfg.eval, progress)
    infra = f"; {len(res.infra_failures)} without a verdict (the sandbox failed twice)" if res.infra_failures else ""
    console.print(
        f"held-out accuracy: [bold]{res.accuracy:.3f}[/] on {len(res.outcomes)} tasks{infra} "
        f"(evaluator {res.evaluator_hash})"
    )


def rollouts(
    run: Path = typer.Argument(..., help="Run directory"),
    where: str | None = typer.Option(None, help="SQL condition, e.g. \"reward > 0.5 AND split = 'train'\""),
    limit: int = typer.Option(20, help="Rows to show"),
    as_json: bool = typer.Option(False, "--json", help="JSON lines instead of a table"),
) -> None:
    """Show stored rollouts (DuckDB over the run's Parquet shards)."""
    import duckdb

    from evotrainer.store.rollouts import RolloutStore

    store = RolloutStore(run_dir(run) / "store")
    try:
        rows = store.query(where=where, limit=limit)
    except duckdb.Error as e:
        raise UserError(f"--where {where!r}: {str(e).splitlines()[0]}") from None
    if as_json:
        for r in rows:
            print(json.dumps(r, default=str))
        return
    table = Table(show_lines=False)
    for col in ("id", "step", "split", "termination", "reward", "audit", "completion"):
        table.add_column(col, overflow="fold")
    for r in rows:
        text = "".join(t["action"] + t["observation"] for t in r["turns"])
        table.add_row(
            r["id"], str(r["step"]), r["split"], r["termination"], f"{r['reward']:.3f}", str(r["audit"]), text[:80]
        )
    console.print(table)


def diagnose(
    run: Path = typer.Argument(..., help="Run directory"),
    branch: str = typer.Option("main", help="Branch to read"),
    first: int = typer.Option(1, help="First step of the window"),
    last: int | None = typer.Option(None, help="Last step of the window (default: the latest)"),
    as_json: bool = typer.Option(False, "--json", help="JSON lines instead of a table"),
) -> None:
    """Run the diagnostic suite over a window of the run's rollouts; findings cite rollout ids."""
    from evotrainer.diagnostics.suite import Suite
    from evotrainer.ids import window_id
    from evotrainer.store.rollouts import RolloutStore

    store = RolloutStore(run_dir(run) / "store")
    if last is None:
        last = store.sql("SELECT coalesce(max(step), 0) AS s FROM rollouts WHERE branch = ?", [branch])[0]["s"]
    suite = Suite.default()
    findings = suite.run(store, branch, first, last)
    store.append_findings(findings, suite.version, window_id(branch, first, last, suite.version), branch, first, last)
    if as_json:
        for f in findings:
            print(json.dumps({**f.to_record(), "suite_version": suite.version}))
        return
    table = Table(
        title=f"{len(findings)} finding(s), {branch} steps {first}-{last}, suite {suite.version}", show_lines=True
    )
    for col in ("finding", "severity", "value", "threshold", "message", "evidence", "knobs"):
        table.add_column(col, overflow="fold")
    for f in findings:
        style = "red" if f.validity or f.severity == "critical" else None
        table.add_row(
            f.name,
            f.severity,
            f"{f.value:.4g}",
            f"{f.threshold:.4g}",
            f.message,
            "\n".join(f.evidence[:4]),
            "\n".join(f.knobs),
            style=style,
        )
    console.print(table)


def backtest(
    run: Path = typer.Argument(..., help="Run directory"),
    intervention: Path = typer.Option(..., help="Intervention YAML (one single-factor change)"),
    where: str = typer.Option("split = 'train'", help="Which retained rollouts to replay (SQL)"),
    flag: str = typer.Option("audit = false AND reward > 0", help="SQL predicate of flagged rollouts"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Replay retained rollouts under the harness with the intervention applied (no training)."""
    from evotrainer.backtest.replay import NotReplayable, load_columns, replay
    from evotrainer.harness.interventions import InterventionError, load_intervention
    from evotrainer.store.rollouts import RolloutStore

    old = load_harness(run)
    try:
        iv = load_intervention(intervention).bind(old)
        new = iv.apply(old)
    except InterventionError as e:
        raise UserError(str(e)) from None
    store = RolloutStore(run / "store")
    terms = sorted(set(old.reward_weights) | set(new.reward_weights))
    cols = load_columns(store, terms, where)
    flagged = {r["id"] for r in store.sql(f"SELECT id FROM rollouts WHERE ({where}) AND ({flag})")}
    try:
        report = replay(old, iv, cols, flagged).to_dict()
    except NotReplayable as e:
        err.print(f"[yellow]not replayable:[/] {e}")
        raise SystemExit(3) from None
    if as_json:
        print(json.dumps(report))
        return
    table = Table(title=f"replay of {report['intervention']} on {report['rollouts']} rollouts")
    table.add_column("measure")
    table.add_column("value")
    for k, v in report.items():
        if k != "intervention":
            table.add_row(k, f"{v:.4f}" if isinstance(v, float) else str(v))
    console.print(table)
