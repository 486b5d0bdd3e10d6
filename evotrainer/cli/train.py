"""The single-run commands: `train`, `eval`, `rollouts`, `diagnose`, `backtest`."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.table import Table

from evotrainer.cli.common import console, err, parse_overrides, print_json, run_dir
from evotrainer.cli.harness import load_harness
from evotrainer.config import load_config
from evotrainer.errors import UserError
from evotrainer.store.ledger import Ledger
from evotrainer.store.rollouts import RolloutStore, reward_terms_named


def train(
    config: Path = typer.Argument(..., help="YAML run config"),
    set_: list[str] = typer.Option([], "--set", help="Override a field, e.g. --set train.steps=50"),
    overwrite: bool = typer.Option(
        False, "--overwrite", help="Clear the run directory first if it holds a run (else a used one is refused)"
    ),
) -> None:
    """Warm-start or load the policy, evaluate, train with RL under the harness, evaluate again."""
    cfg = load_config(config, parse_overrides(set_))  # first: a mistyped field is named before torch loads
    from evotrainer.training.run import train_run

    train_run(cfg, console, overwrite=overwrite)


def eval_(run: Path = typer.Argument(..., help="Run directory")) -> None:
    """Evaluate the run's latest checkpoint on the held-out tasks (evaluator-owned)."""
    from evotrainer.envs.registry import make_domain
    from evotrainer.evaluation import evaluate
    from evotrainer.integrations.imported import imported
    from evotrainer.policies import placement
    from evotrainer.policies.hf import HFPolicy
    from evotrainer.training.run import BRANCH, progress_bar, seed_everything

    if source := imported(run_dir(run)):
        raise UserError(
            f"{run}: imported from {source.source_format} ({source.source}): no checkpoint or evaluator of ours to "
            "evaluate; diagnose, rollouts, backtest and report read it"
        )
    cfg = load_config(run / "config.yaml")
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
    as_json: bool = typer.Option(False, "--json", help="A JSON array of the rollouts instead of a table"),
) -> None:
    """Show stored rollouts (DuckDB over the run's Parquet shards)."""
    import duckdb

    store = RolloutStore(run_dir(run) / "store")
    check_reward_terms(store, "--where", where)
    try:
        rows = store.query(where=where, limit=limit)
    except duckdb.Error as e:
        raise UserError(f"--where {where!r}: {str(e).splitlines()[0]}") from None
    if as_json:
        print_json(rows)
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


def check_reward_terms(store: RolloutStore, option: str, sql: str | None) -> None:
    """A reward term named in SQL that no stored rollout carries is an error naming the terms there are:
    DuckDB reads a missing key as NULL, and the query would quietly match nothing."""
    named = reward_terms_named(sql or "")
    if not named:
        return
    known = store.reward_terms()
    if unknown := [t for t in named if t not in known]:
        raise UserError(
            f"{option} {sql!r}: no stored rollout has a reward term {unknown[0]!r}; the terms are "
            f"{', '.join(known) or '(none: the store holds no rollouts)'}"
        )


def diagnose(
    run: Path = typer.Argument(..., help="Run directory"),
    branch: str | None = typer.Option(
        None, help="Branch to read (default: a loop run's mainline, from the base to its head; `main` for train)"
    ),
    first: int = typer.Option(1, help="First step of the window"),
    last: int | None = typer.Option(None, help="Last step of the window (default: the latest)"),
    as_json: bool = typer.Option(False, "--json", help="A JSON array of the findings instead of tables"),
) -> None:
    """Run the diagnostic suite over a window of the run's rollouts; findings cite rollout ids. A loop run's
    mainline is read branch by branch (each its own window: the steps under one harness)."""
    from evotrainer.diagnostics.suite import Suite
    from evotrainer.ids import window_id

    store = RolloutStore(run_dir(run) / "store")
    suite, found = Suite.default(), []
    for name, lo, hi in windows(run, store, branch, first, last):
        findings = suite.run(store, name, lo, hi)
        store.append_findings(findings, suite.version, window_id(name, lo, hi, suite.version), name, lo, hi)
        found.append((name, lo, hi, findings))
    if as_json:
        print_json({**f.to_record(), "suite_version": suite.version} for *_, fs in found for f in fs)
        return
    if not found:
        console.print(f"0 finding(s): {run} has no training steps in steps {first}-{last or 'latest'} to diagnose")
    for name, lo, hi, findings in found:
        console.print(
            _findings_table(findings, f"{len(findings)} finding(s), {name} steps {lo}-{hi}, suite {suite.version}")
        )


def windows(
    run: Path, store: RolloutStore, branch: str | None, first: int, last: int | None
) -> list[tuple[str, int, int]]:
    """(branch, first step, last step) of each window to diagnose. A loop run: the named branch, or each
    trained branch of the mainline (base to the head, as the ledger records it). A train run: its branch."""
    if (run / "ledger.sqlite").exists():
        ledger = Ledger(run / "ledger.sqlite")
        try:
            rows = {b["id"]: b for b in ledger.branches()}
            path = [rows[branch]] if branch in rows else mainline_path(ledger)
        finally:
            ledger.close()
        if branch is not None and branch not in rows:
            raise UserError(f"--branch {branch!r}: {run} has no such branch; its branches: {', '.join(rows)}")
        spans = [(b["id"], b["first_step"], b["last_step"]) for b in path if b["kind"] != "base"]
    else:
        known = [r["branch"] for r in store.sql("SELECT DISTINCT branch FROM rollouts ORDER BY branch")]
        name = branch or "main"
        if branch is None and not known:  # nothing trained yet: nothing to diagnose, and nothing wrong
            return []
        if name not in known:
            raise UserError(
                f"--branch {name!r}: {run} has no rollouts of that branch; its branches: {', '.join(known)}"
            )
        top = store.sql("SELECT max(step) AS s FROM rollouts WHERE branch = ?", [name])[0]["s"] or 0
        spans = [(name, first, top)]
    out = []
    for name, lo, hi in spans:
        lo, hi = max(lo, first), hi if last is None else min(hi, last)
        if lo <= hi:
            out.append((name, lo, hi))
    return out


def mainline_path(ledger: Ledger) -> list[dict]:
    """The branch rows of the mainline, base first: the lineage of the head the ledger last recorded (at the
    start, a promotion or the end), then a segment trained from that head in a round not yet decided."""
    from evotrainer.stages.results import STAGE_RESULTS
    from evotrainer.stages.spend import lineage

    rows = ledger.rows(
        "SELECT round, stage, result FROM stages WHERE stage IN ('start', 'promote', 'final') "
        "ORDER BY finished DESC LIMIT 1"
    )
    if not rows:
        return []
    head = STAGE_RESULTS[rows[0]["stage"]].model_validate_json(rows[0]["result"]).head.branch
    decided = max((r["round"] for r in ledger.rows("SELECT round FROM stages WHERE stage = 'promote'")), default=0)
    branches = ledger.branches()
    on_path = lineage(ledger, head)
    path = sorted((b for b in branches if b["id"] in on_path), key=lambda b: (b["first_step"], b["round"]))
    ahead = [b for b in branches if b["parent"] == head and b["kind"] == "segment" and b["round"] > decided]
    return path + ahead[-1:]


def _findings_table(findings, title: str) -> Table:
    table = Table(title=title, show_lines=True)
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
    return table


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

    old = load_harness(run)
    try:
        iv = load_intervention(intervention).bind(old)
        new = iv.apply(old)
    except InterventionError as e:
        raise UserError(str(e)) from None
    store = RolloutStore(run / "store")
    check_reward_terms(store, "--where", where)
    check_reward_terms(store, "--flag", flag)
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
