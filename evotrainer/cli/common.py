"""What every command module shares: the consoles, `--set` overrides, and the run-directory checks."""

from __future__ import annotations

from pathlib import Path

import yaml
from rich.console import Console

from evotrainer.errors import UserError

console = Console()
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
