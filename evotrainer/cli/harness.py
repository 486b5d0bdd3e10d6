"""The harness commands: `harness show|diff|export` and `knobs`."""

from __future__ import annotations

from enum import Enum
from pathlib import Path

import typer
import yaml
from rich.table import Table

from evotrainer.cli.common import console, print_json, run_dir
from evotrainer.errors import UserError
from evotrainer.harness.export import TRL_VERSIONS, export
from evotrainer.harness.knobs import TARGETS, TITLES, Knob, registry

harness_app = typer.Typer(no_args_is_help=True, help="Show, compare and export harness versions.")

# The export targets, as a choice typer validates (an unknown one is a usage error, exit 2).
Target = Enum("Target", {t: t for t in TARGETS}, type=str)


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
    a: Path = typer.Argument(..., help="Harness A (file or run)"),
    b: Path = typer.Argument(..., help="Harness B"),
    as_json: bool = typer.Option(False, "--json", help="A JSON array of {knob, a, b} instead of a table"),
) -> None:
    """The knobs that differ between two harnesses."""
    from evotrainer.harness.interventions import diff

    ha, hb = load_harness(a), load_harness(b)
    changes = diff(ha, hb)
    if as_json:
        print_json({"knob": path, "a": old, "b": new} for path, old, new in changes)
        return
    table = Table(title=f"{ha.version} -> {hb.version}")
    for col in ("knob", "A", "B"):
        table.add_column(col)
    for path, old, new in changes:
        table.add_row(path, repr(old), repr(new))
    console.print(table if changes else "no knob differs")


@harness_app.command("export")
def harness_export(
    target: Path = typer.Argument(..., help="Harness YAML, run config, or run directory"),
    to: Target = typer.Option(
        ...,
        "--to",
        help="trl: GRPOConfig keywords (JSON); verl: Hydra overrides (key=value lines); openrlhf: "
        "train_ppo_ray flags (one per line)",
    ),
) -> None:
    """Print a harness as another trainer's settings on stdout; the knobs that do not carry over (no
    equivalent, or a value the trainer cannot express) and those that carry over with a difference go to
    stderr, each with the reason."""
    ex = export(load_harness(target), to.value)
    print(ex.render())
    typer.echo(ex.report(), err=True)
    if to.value == "trl":
        typer.echo(
            f"# For TRL {TRL_VERSIONS} (the range the trl extra requires): GRPOConfig(**settings). On a "
            "machine without a GPU add use_cpu=True (GRPOConfig refuses to build there without it).",
            err=True,
        )


def knobs(as_json: bool = typer.Option(False, "--json", help="A JSON array instead of a table")) -> None:
    """Every harness knob: type, range, default, meaning, and its TRL / verl / OpenRLHF names."""
    ks = registry()
    if as_json:
        print_json(k.to_dict() for k in ks)
        return
    cols = ("knob", "type", "range", "default", "meaning", *(TITLES[t] for t in TARGETS), "replay")
    rows = [
        (
            k.path,
            k.type,
            _range(k),
            repr(k.default),
            k.meaning,
            *(_name(k, t) for t in TARGETS),
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


def _name(k: Knob, target: str) -> str:
    """A knob's setting in a target with its note; "-": none."""
    n = k.name(target)
    return f"{n.key} ({n.note})" if n.note else n.key


def _range(k: Knob) -> str:
    if k.choices:
        return "|".join(map(str, k.choices))
    return f"[{_num(k.low)}, {_num(k.high)}]" if k.low is not None or k.high is not None else ""


def _num(x: float | None) -> str:
    return "" if x is None else f"{x:g}"
