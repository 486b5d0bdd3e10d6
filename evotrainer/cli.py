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
err = Console(stderr=True)


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


def main() -> None:
    try:
        app(standalone_mode=False)
    except (ConfigError, UserError) as e:
        err.print(f"[red]error:[/] {e}")
        raise SystemExit(2)
    except ValueError as e:  # configuration that only the domain or harness can check
        err.print(f"[red]error:[/] {e}")
        raise SystemExit(2)
    except (typer.Exit, SystemExit) as e:
        raise SystemExit(getattr(e, "exit_code", getattr(e, "code", 0)))
    except Exception as e:
        import click

        if isinstance(e, click.ClickException):
            e.show()
            raise SystemExit(e.exit_code)
        raise


if __name__ == "__main__":
    main()
