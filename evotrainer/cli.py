"""The `evotrainer` command line."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
import yaml
from rich.console import Console
from rich.table import Table

from evotrainer.config import ConfigError, load_config

app = typer.Typer(add_completion=False, no_args_is_help=True, help="RL post-training whose harness evolves with the policy.")
console = Console()
err = Console(stderr=True, soft_wrap=True)  # error messages stay whole lines, easy to copy and grep


class UserError(Exception):
    """A mistake the user can fix; printed without a traceback, exit code 2."""


def _overrides(values: list[str]) -> dict:
    out = {}
    for v in values:
        if "=" not in v:
            raise UserError(f"--set {v!r}: expected KEY=VALUE, for example --set train.steps=50")
        k, raw = v.split("=", 1)
        out[k] = yaml.safe_load(raw)
    return out


def _run_dir(run: Path) -> Path:
    if not (run / "config.yaml").exists():
        raise UserError(f"{run}: not a run directory (no config.yaml); pass the directory `evotrainer train` created, e.g. runs/NAME")
    return run


@app.command()
def train(config: Path = typer.Argument(..., help="YAML run config"),
          set_: list[str] = typer.Option([], "--set", help="Override a field, e.g. --set train.steps=50")) -> None:
    """Warm-start or load the policy, evaluate, train with RL under the harness, evaluate again."""
    from evotrainer.training.run import train_run

    cfg = load_config(config, _overrides(set_))
    train_run(cfg, console)


@app.command("eval")
def eval_(run: Path = typer.Argument(..., help="Run directory")) -> None:
    """Evaluate the run's latest checkpoint on the held-out tasks (evaluator-owned)."""
    from evotrainer.envs import make_domain
    from evotrainer.evaluation import evaluate
    from evotrainer.policies.hf import HFPolicy
    from evotrainer.training.run import BRANCH, progress_bar, seed_everything

    cfg = load_config(_run_dir(run) / "config.yaml")
    ckpt = run / "checkpoints" / BRANCH
    if not ckpt.exists():
        raise UserError(f"{run}: no checkpoint yet ({ckpt}); the run has not finished a step")
    seed_everything(cfg)
    domain = make_domain(cfg)
    policy = HFPolicy.load(ckpt)
    with progress_bar(console) as progress:
        res = evaluate(policy, domain, domain.tasks("heldout"), cfg.eval, progress)
    console.print(f"held-out accuracy: [bold]{res.accuracy:.3f}[/] on {len(res.outcomes)} tasks (evaluator {res.evaluator_hash})")


@app.command()
def rollouts(run: Path = typer.Argument(..., help="Run directory"),
             where: Optional[str] = typer.Option(None, help="SQL condition, e.g. \"reward > 0.5 AND split = 'train'\""),
             limit: int = typer.Option(20, help="Rows to show"),
             as_json: bool = typer.Option(False, "--json", help="JSON lines instead of a table")) -> None:
    """Show stored rollouts (DuckDB over the run's Parquet shards)."""
    import duckdb

    from evotrainer.store.rollouts import RolloutStore

    store = RolloutStore(_run_dir(run) / "store")
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
        table.add_row(r["id"], str(r["step"]), r["split"], r["termination"], f"{r['reward']:.3f}", str(r["audit"]), text[:80])
    console.print(table)


@app.command()
def diagnose(run: Path = typer.Argument(..., help="Run directory"),
             branch: str = typer.Option("main", help="Branch to read"),
             first: int = typer.Option(1, help="First step of the window"),
             last: Optional[int] = typer.Option(None, help="Last step of the window (default: the latest)"),
             as_json: bool = typer.Option(False, "--json", help="JSON lines instead of a table")) -> None:
    """Run the diagnostic suite over a window of the run's rollouts; findings cite rollout ids."""
    from evotrainer.diagnostics.suite import Suite
    from evotrainer.store.rollouts import RolloutStore

    store = RolloutStore(_run_dir(run) / "store")
    if last is None:
        last = store.sql("SELECT coalesce(max(step), 0) AS s FROM rollouts WHERE branch = ?", [branch])[0]["s"]
    suite = Suite.default()
    findings = suite.run(store, branch, first, last)
    store.append_findings(findings, suite.version, f"{branch}-{first:06d}-{last:06d}-{suite.version}", branch, first, last)
    if as_json:
        for f in findings:
            print(json.dumps({**f.to_record(), "suite_version": suite.version}))
        return
    table = Table(title=f"{len(findings)} finding(s), {branch} steps {first}-{last}, suite {suite.version}", show_lines=True)
    for col in ("finding", "severity", "value", "threshold", "message", "evidence", "knobs"):
        table.add_column(col, overflow="fold")
    for f in findings:
        style = "red" if f.validity or f.severity == "critical" else None
        table.add_row(f.name, f.severity, f"{f.value:.4g}", f"{f.threshold:.4g}", f.message, "\n".join(f.evidence[:4]),
                      "\n".join(f.knobs), style=style)
    console.print(table)


harness_app = typer.Typer(no_args_is_help=True, help="Show and compare harness versions.")
app.add_typer(harness_app, name="harness")


def _load_harness(target: Path):
    """A harness from a harness YAML, a run config YAML, a run directory, or RUN/harness/VERSION.yaml."""
    from evotrainer.harness.harness import Harness

    if target.is_dir():
        target = _run_dir(target) / "config.yaml"
    if not target.is_file():
        raise UserError(f"{target}: no such harness file or run directory")
    raw = yaml.safe_load(target.read_text()) or {}
    if isinstance(raw, dict) and "harness" in raw:
        raw = raw["harness"]
    from pydantic import ValidationError

    from evotrainer.config import format_validation_error

    try:
        return Harness.model_validate(raw)
    except ValidationError as e:
        raise UserError(format_validation_error(e, str(target))) from None


@harness_app.command("show")
def harness_show(target: Path = typer.Argument(..., help="Harness YAML, run config, or run directory")) -> None:
    """Print a harness as YAML with its version."""
    h = _load_harness(target)
    console.print(f"# version {h.version} (parent {h.parent})")
    print(yaml.safe_dump(h.model_dump(mode="json"), sort_keys=False), end="")


@harness_app.command("diff")
def harness_diff(a: Path = typer.Argument(..., help="Harness A (file or run)"), b: Path = typer.Argument(..., help="Harness B")) -> None:
    """The knobs that differ between two harnesses."""
    from evotrainer.harness.interventions import diff

    ha, hb = _load_harness(a), _load_harness(b)
    changes = diff(ha, hb)
    table = Table(title=f"{ha.version} -> {hb.version}")
    for col in ("knob", "A", "B"):
        table.add_column(col)
    for path, old, new in changes:
        table.add_row(path, repr(old), repr(new))
    console.print(table if changes else "no knob differs")


@app.command()
def knobs(as_json: bool = typer.Option(False, "--json", help="JSON lines instead of a table")) -> None:
    """Every harness knob: type, range, default, meaning, and its TRL / verl / OpenRLHF names."""
    from evotrainer.harness.knobs import registry

    ks = registry()
    if as_json:
        for k in ks:
            print(json.dumps(k.to_dict(), default=str))
        return
    table = Table(show_lines=True)
    for col in ("knob", "type", "range", "default", "meaning", "TRL", "verl", "OpenRLHF", "replay"):
        table.add_column(col, overflow="fold")
    for k in ks:
        rng = "|".join(map(str, k.choices)) if k.choices else (f"[{k.low}, {k.high}]" if k.low is not None or k.high is not None else "")
        table.add_row(k.path, k.type, rng, repr(k.default), k.meaning, k.trl, k.verl, k.openrlhf, "yes" if k.replayable else "trial")
    console.print(table)


@app.command()
def backtest(run: Path = typer.Argument(..., help="Run directory"),
             intervention: Path = typer.Option(..., help="Intervention YAML (one single-factor change)"),
             where: str = typer.Option("split = 'train'", help="Which retained rollouts to replay (SQL)"),
             flag: str = typer.Option("audit = false AND reward > 0", help="SQL predicate of flagged rollouts"),
             as_json: bool = typer.Option(False, "--json")) -> None:
    """Replay retained rollouts under the harness with the intervention applied (no training)."""
    from evotrainer.backtest.replay import NotReplayable, load_columns, replay
    from evotrainer.harness.interventions import InterventionError, load_intervention
    from evotrainer.store.rollouts import RolloutStore

    old = _load_harness(run)
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


def main() -> None:
    import evotrainer.cli_loop  # noqa: F401 -- registers run, resume, status, report, skills

    try:
        app(standalone_mode=False)
    except (ConfigError, UserError) as e:
        err.print(f"[red]error:[/] {e}")
        raise SystemExit(2)
    except (typer.Exit, SystemExit) as e:
        raise SystemExit(getattr(e, "exit_code", getattr(e, "code", 0)))
    except Exception as e:
        # Usage errors (unknown command, bad option) print their message, not a traceback. Checked by
        # shape: typer may vendor click, so its exception classes are not always click's.
        if hasattr(e, "show") and isinstance(getattr(e, "exit_code", None), int):
            e.show()
            raise SystemExit(e.exit_code)
        raise


if __name__ == "__main__":
    # Through the package module, so that `python -m evotrainer.cli` and the console script register
    # the loop's commands on the same app.
    from evotrainer.cli import main as _main

    _main()
