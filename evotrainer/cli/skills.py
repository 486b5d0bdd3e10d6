"""`evotrainer skills list|losses|show|export|import`: a skill library (the project's, beside its runs, unless
told)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from evotrainer.cli.common import console, print_json
from evotrainer.errors import UserError
from evotrainer.skills.exchange import export_file, import_file
from evotrainer.skills.library import GLOBAL_LIBRARY, PROJECT_LIBRARY, SkillLibrary, library_dir

skills_app = typer.Typer(
    no_args_is_help=True,
    help=f"A skill library: by default the project's ({Path('runs') / PROJECT_LIBRARY}, beside its runs).",
)


def _library(skills_dir: Path | None, shared: bool, *, read: bool = True) -> SkillLibrary:
    """The library named (`read`: one that must already exist, since a command that reads one where none is, a
    mistyped --dir say, would otherwise answer "no skills" for a library that was never there)."""
    if shared and skills_dir is not None:
        raise UserError("--dir and --global name two libraries; pass one")
    # The project's library is the default run.out_dir's (runs/skills): where `evotrainer run` writes it.
    lib = SkillLibrary(GLOBAL_LIBRARY if shared else library_dir(skills_dir, "runs"))
    if read and not lib.root.is_dir():
        raise UserError(
            f"no skill library at {lib.root}: a loop run writes one as it remembers its verdicts (loop.skills_dir, "
            f"default OUT_DIR/{PROJECT_LIBRARY}); name an existing one with --dir DIR or --global"
        )
    return lib


_DIR = typer.Option(
    None,
    "--dir",
    help=f"Skill library directory (default: {Path('runs') / PROJECT_LIBRARY}, the library loop.skills_dir "
    "defaults to for runs under runs/; for other run.out_dir values, OUT_DIR/skills)",
)
_GLOBAL = typer.Option(False, "--global", help=f"The library shared across projects, {GLOBAL_LIBRARY}")


@skills_app.command("list")
def skills_list(
    skills_dir: Path | None = _DIR,
    shared: bool = _GLOBAL,
    as_json: bool = typer.Option(False, "--json", help="A JSON array of the skills instead of a table"),
) -> None:
    """List the skills: what each sets, trigger signature, where it won, evidence (wins, losses, repairs), reuse,
    quarantine."""
    skills = _library(skills_dir, shared).all()
    if as_json:
        print_json(
            {
                **s.model_dump(mode="json"),
                "wins": s.wins,
                "losses": s.losses,
                "repairs": s.repairs,
                "quarantined": s.quarantined,
                "reused": len(s.reuses),
            }
            for s in skills
        )
        return
    t = Table(
        "id",
        "intervention",
        "signature",
        "domains",
        "models",
        "won",
        "lost",
        "repaired",
        "mean effect",
        "reused",
        "status",
    )
    for s in skills:
        change = f"x{s.factor:g}" if s.factor is not None else repr(s.value)
        reused = s.reuses
        bought = [e.effect for e in reused if e.effect is not None]
        t.add_row(
            s.id,
            f"{s.kind} {s.target} {change}" + (f" + {s.paired.describe()}" if s.paired else ""),
            ", ".join(s.signature) or "-",
            ", ".join(s.domains),
            ", ".join(s.models) or "-",
            str(s.wins),
            str(s.losses),
            str(s.repairs),
            f"{s.mean_effect:+.3f}",
            f"{len(reused)} ({sum(bought) / len(bought):+.3f})" if bought else str(len(reused)),
            "quarantined" if s.quarantined else "active",
        )
    console.print(t)


@skills_app.command("losses")
def skills_losses(
    skills_dir: Path | None = _DIR,
    shared: bool = _GLOBAL,
    as_json: bool = typer.Option(False, "--json", help="A JSON array of the loss records instead of a table"),
) -> None:
    """List the losses: each rejected trial of a change, with its run, context and the step it forked from. A later
    run in the same domain and model, on the same harness version, does not race the change again near that step."""
    losses = _library(skills_dir, shared).all_losses()
    if as_json:
        print_json(loss.model_dump(mode="json") for loss in losses)
        return
    t = Table("id", "change", "run / trial", "domain", "model", "harness", "step", "effect")
    for loss in losses:
        for e in loss.evidence:
            effect = f"{e.effect:+.3f}" if e.effect is not None else "-"
            t.add_row(loss.id, loss.intervention.describe(), f"{e.run} / {e.trial}", e.domain, e.model or "-",
                      e.harness or "-", "-" if e.step is None else str(e.step), effect)  # fmt: skip
    console.print(t)


@skills_app.command("show")
def skills_show(
    skill: str = typer.Argument(..., help="Skill id (k-...)"), skills_dir: Path | None = _DIR, shared: bool = _GLOBAL
) -> None:
    """One skill in full, with its evidence and lineage."""
    console.print_json(_library(skills_dir, shared).get(skill).model_dump_json())


@skills_app.command("export")
def skills_export(
    dest: Path = typer.Argument(..., help="JSON file to write"), skills_dir: Path | None = _DIR, shared: bool = _GLOBAL
) -> None:
    """Write every skill and every loss to one JSON file (to share a library whole)."""
    skills, losses = export_file(_library(skills_dir, shared), dest)
    console.print(f"exported {skills} skill(s) and {losses} loss record(s) to {dest}")


@skills_app.command("import")
def skills_import(
    src: Path = typer.Argument(..., help="A file written by `skills export`, or another library's directory"),
    skills_dir: Path | None = _DIR,
    shared: bool = _GLOBAL,
) -> None:
    """Merge skills and losses from an export, or from another library's directory (a project's runs' libraries
    gathered into one); evidence already present is not counted twice."""
    lib = _library(skills_dir, shared, read=False)  # an import may start a library
    if src.is_dir():
        if not any(src.glob("[kr]-*.json")):
            raise UserError(
                f"skills import: {src} holds no skills (k-*.json) or losses (r-*.json); name a library's "
                "directory, such as runs/skills, or a file written by `evotrainer skills export`"
            )
        console.print(f"merged {lib.merge(SkillLibrary(src))} skill and loss record(s) from the library {src}")
        return
    console.print(f"imported {import_file(lib, src)} skill and loss record(s) from {src}")
