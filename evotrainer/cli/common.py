"""What every command module shares: the consoles, `--set` overrides, JSON output, and the run-directory checks."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console

from evotrainer.errors import UserError

# Off a terminal (a log file, CI) rich would fold every line and table at 80 columns: there a line stays one
# line, and a table takes the width its cells need unless COLUMNS says otherwise.
_PIPED = not sys.stdout.isatty()
console = Console(soft_wrap=_PIPED, width=4096 if _PIPED and "COLUMNS" not in os.environ else None)
err = Console(stderr=True, soft_wrap=True)  # error messages stay whole lines, easy to copy and grep


def parse_overrides(values: list[str]) -> dict:
    """`--set KEY=VALUE` pairs as {dotted key: YAML value}."""
    out = {}
    for v in values:
        if "=" not in v:
            raise UserError(f"--set {v!r}: expected KEY=VALUE, for example --set train.steps=50")
        k, raw = v.split("=", 1)
        out[k] = yaml.safe_load(raw)
    return out


def print_json(items: Iterable[Any]) -> None:
    """A listing's `--json`: one JSON array (`[]` when there is nothing), an element per line, so that the
    whole output parses and a line still greps."""
    lines = [json.dumps(x, default=str) for x in items]
    print("[\n" + ",\n".join(lines) + "\n]" if lines else "[]")


def run_dir(run: Path) -> Path:
    """A run directory (any command's): it holds the run's config.yaml."""
    if not (run / "config.yaml").exists():
        raise UserError(
            f"{run}: not a run directory (no config.yaml); "
            "pass the directory `evotrainer train` created, e.g. runs/NAME"
        )
    return run


def loop_dir(run: Path) -> Path:
    """A loop run's directory: it holds the ledger."""
    if not (run / "ledger.sqlite").exists():
        raise UserError(
            f"{run}: not a loop run directory (no ledger.sqlite); "
            "pass the directory `evotrainer run` created, e.g. runs/NAME"
        )
    return run
