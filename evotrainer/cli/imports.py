"""`evotrainer import trl|verl`: a run trained elsewhere, as a run directory the other commands read."""

from __future__ import annotations

from pathlib import Path

import typer

from evotrainer.cli.common import console
from evotrainer.errors import UserError

import_app = typer.Typer(
    no_args_is_help=True,
    help="Import a run trained with TRL or verl: its logged rollouts, for diagnose, rollouts, backtest and report.",
)

_RUN = typer.Option(None, "--run", help="Run directory to create (default: runs/NAME, NAME the source's)")
_TOKENIZER = typer.Option(None, help="Tokenizer directory to count completion tokens (default: the one saved beside)")
_OVERWRITE = typer.Option(False, "--overwrite", help="Clear the run directory first if it holds a run")


def _run_dir(source: Path, run: Path | None) -> Path:
    if run is not None:
        return run
    d = source.parent if source.is_file() else source
    name = d.parent.name if d.name in ("completions", "rollout_data", "rollouts") else d.name
    return Path("runs") / (name or "imported")


def _weights(values: list[str]) -> dict[str, float]:
    out = {}
    for v in values:
        name, eq, raw = v.partition("=")
        try:
            out[name] = float(raw)
        except ValueError:
            eq = ""
        if not eq or not name:
            raise UserError(f"--reward-weight {v!r}: expected NAME=WEIGHT, for example --reward-weight accuracy=1.0")
    return out


def _said(summary: dict, run: Path) -> None:
    console.print(
        f"imported {summary['rollouts']} rollouts of {summary['steps']} step(s) from {summary['imported_from']} "
        f"into {run} (harness {summary['harness_version']})"
    )
    for note in summary["notes"]:
        console.print(f"  note: {note}", markup=False, highlight=False)
    console.print(f"next: evotrainer diagnose {run}", markup=False, highlight=False)


@import_app.command("trl")
def trl(
    source: Path = typer.Argument(
        ..., help="A TRL output_dir, its completions/ directory, or one completions_N.parquet"
    ),
    run: Path | None = _RUN,
    tokenizer: Path | None = _TOKENIZER,
    max_completion_length: int | None = typer.Option(
        None, min=1, help="GRPOConfig.max_completion_length (default: read from the logged metrics where it shows)"
    ),
    reward_weight: list[str] = typer.Option([], help="NAME=W: GRPOConfig.reward_weights (default 1.0 each)"),
    overwrite: bool = _OVERWRITE,
) -> None:
    """A TRL GRPOTrainer run: the completion tables `log_completions=True` writes, with its logged metrics."""
    from evotrainer.integrations.trl_logs import import_trl

    out = _run_dir(source, run)
    _said(import_trl(source, out, tokenizer, max_completion_length, _weights(reward_weight), overwrite), out)


@import_app.command("verl")
def verl(
    source: Path = typer.Argument(..., help="verl's trainer.rollout_data_dir (STEP.jsonl files), or one dump"),
    run: Path | None = _RUN,
    tokenizer: Path | None = _TOKENIZER,
    max_response_length: int | None = typer.Option(None, min=1, help="verl's data.max_response_length"),
    overwrite: bool = _OVERWRITE,
) -> None:
    """A verl run: the rollout dumps it writes with trainer.rollout_data_dir set."""
    from evotrainer.integrations.verl_dumps import import_verl

    out = _run_dir(source, run)
    _said(import_verl(source, out, tokenizer, max_response_length, overwrite), out)
