"""The harness commands: `harness show|diff` and `knobs`."""

from __future__ import annotations

import json
from pathlib import Path

import typer
import yaml
from rich.table import Table

from evotrainer.cli.common import console, run_dir
from evotrainer.errors import UserError
from evotrainer.harness.knobs import Knob, registry

harness_app = typer.Typer(no_args_is_help=True, help="Show and compare harness versions.")


def load_harness(target: Path):
    """A harness from a harness YAML, a run config YAML, a run directory, or RUN/harness/VERSION.yaml."""
    from evotrainer.harness.harness import Harness

    if target.is_dir():
        target = run_dir(target) / "config.yaml"
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
    h = load_harness(target)
    console.print(f"# version {h.version} (parent {h.parent})")
    print(yaml.safe_dump(h.model_dump(mode="json"), sort_keys=False), end="")


@harness_app.command("diff")
def harness_diff(
    a: Path = typer.Argument(..., help="Harness A (file or run)"), b: Path = typer.Argument(..., help="Harness B")
) -> None:
    """The knobs that differ between two harnesses."""
    from evotrainer.harness.interventions import diff

    ha, hb = load_harness(a), load_harness(b)
    changes = diff(ha, hb)
    table = Table(title=f"{ha.version} -> {hb.version}")
    for col in ("knob", "A", "B"):
        table.add_column(col)
    for path, old, new in changes:
        table.add_row(path, repr(old), repr(new))
    console.print(table if changes else "no knob differs")


def knobs(as_json: bool = typer.Option(False, "--json", help="JSON lines instead of a table")) -> None:
    """Every harness knob: type, range, default, meaning, and its TRL / verl / OpenRLHF names."""
    ks = registry()
    if as_json:
        for k in ks:
            print(json.dumps(k.to_dict(), default=str))
        return
    cols = ("knob", "type", "range", "default", "meaning", "TRL", "verl", "OpenRLHF", "replay")
    rows = [
        (
            k.path,
            k.type,
            _range(k),
            repr(k.default),
            k.meaning,
            k.trl,
            k.verl,
            k.openrlhf,
            "yes" if k.replayable else "trial",
        )
        for k in ks
    ]
    if not console.is_terminal:
        # A pipe or a file gets a Markdown table, one knob per line: rich would fold it to 80 columns.
        print("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
        for r in rows:
            print("| " + " | ".join(c.replace("|", "\\|") for c in r) + " |")
        return
    table = Table(show_lines=True)
    for col in cols:
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(*r)
    console.print(table)


def _range(k: Knob) -> str:
    if k.choices:
        return "|".join(map(str, k.choices))
    return f"[{_num(k.low)}, {_num(k.high)}]" if k.low is not None or k.high is not None else ""


def _num(x: float | None) -> str:
    return "" if x is None else f"{x:g}"
