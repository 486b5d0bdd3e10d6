"""A skill library in one file: `evotrainer skills export` writes it, `import` merges it into another library.

The file carries the losses beside the skills: a library shared without them would offer again, and pace trials
as if nothing had lost, what its project already rejected (SkillLibrary.losses_in, record_in)."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import ValidationError

from evotrainer.errors import ConfigError
from evotrainer.skills.library import Loss, Skill, SkillLibrary
from evotrainer.store.files import atomic_write_text


def export_file(lib: SkillLibrary, dest: str | Path) -> tuple[int, int]:
    """Every skill and every loss of `lib` in one JSON file. Returns (skills, losses) written."""
    skills, losses = lib.all(), lib.all_losses()
    dump = {k: [r.model_dump(mode="json") for r in v] for k, v in (("skills", skills), ("losses", losses))}
    atomic_write_text(Path(dest), json.dumps(dump, indent=2))  # the library's own writes are atomic too
    return len(skills), len(losses)


def import_file(lib: SkillLibrary, src: str | Path) -> int:
    """Merge an export file's skills and losses into `lib` (an export of earlier versions, a list of skills alone,
    still loads): evidence is united by (run, trial), so importing twice or importing a library's own export changes
    nothing. Returns how many records it read; a file that is not an export is refused before anything is written."""
    src = Path(src)
    if not src.is_file():
        raise ConfigError(f"skills import: file not found: {src}")
    try:
        data = json.loads(src.read_text())
        data = {"skills": data} if isinstance(data, list) else data
        skills = [Skill.model_validate(x) for x in data["skills"]]
        losses = [Loss.model_validate(x) for x in data.get("losses", [])]
    except (json.JSONDecodeError, ValidationError, TypeError, KeyError, AttributeError) as e:
        raise ConfigError(
            f"skills import: {src} is not a skills export ({type(e).__name__}); "
            "create one with `evotrainer skills export FILE`"
        ) from None
    return lib.take(skills, losses)
