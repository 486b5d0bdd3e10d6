"""`evotrainer skills list|show|export|import`: the skill library shared across runs."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from evotrainer.cli.common import console

skills_app = typer.Typer(no_args_is_help=True, help="The skill library shared across runs.")


def _library(skills_dir: Path | None):
    from evotrainer.config import LoopSection
    from evotrainer.skills.library import SkillLibrary

    return SkillLibrary(skills_dir or LoopSection().skills_dir)


_DIR = typer.Option(
    None, "--dir", help="Skill library directory (default: loop.skills_dir's default, ~/.evotrainer/skills)"
)


@skills_app.command("list")
def skills_list(skills_dir: Path | None = _DIR) -> None:
    """List the skills: template, trigger signature, evidence, quarantine."""
    t = Table("id", "intervention", "signature", "domains", "won", "lost", "mean effect", "status")
    for s in _library(skills_dir).all():
        change = f"x{s.factor:g}" if s.factor is not None else repr(s.value)
        t.add_row(
            s.id,
            f"{s.kind} {s.target} {change}",
            ", ".join(s.signature) or "-",
            ", ".join(s.domains),
            str(s.wins),
            str(s.losses),
            f"{s.mean_effect:+.3f}",
            "quarantined" if s.quarantined else "active",
        )
    console.print(t)


@skills_app.command("show")
def skills_show(skill: str = typer.Argument(..., help="Skill id (k-...)"), skills_dir: Path | None = _DIR) -> None:
    """One skill in full, with its evidence and lineage."""
    console.print_json(_library(skills_dir).get(skill).model_dump_json())


@skills_app.command("export")
def skills_export(dest: Path = typer.Argument(..., help="JSON file to write"), skills_dir: Path | None = _DIR) -> None:
    """Write every skill to one JSON file (to share a library)."""
    console.print(f"exported {_library(skills_dir).export(dest)} skill(s) to {dest}")


@skills_app.command("import")
def skills_import(
    src: Path = typer.Argument(..., help="A file written by `skills export`"), skills_dir: Path | None = _DIR
) -> None:
    """Merge skills from an export; evidence already present is not counted twice."""
    console.print(f"imported {_library(skills_dir).import_(src)} skill(s) from {src}")
