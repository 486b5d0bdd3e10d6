"""Where benchmarks keep their scratch run directories and their results, and how machine paths stay out of results."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent  # the repository
RESULTS = ROOT / "benchmarks" / "results"
WORK = "$WORK"  # what a scratch directory reads as in a result: the runs it held are not in the repository

# An absolute path under a scratch or home root, with the directory below that root: what a result would
# otherwise carry of the machine it ran on (/tmp/evotrainer-claims/..., /root/..., /work/clone/...).
_MACHINE_PATH = re.compile(r"(?<![\w.$/])/(?:tmp|root|work|var/tmp|home/[^/\s\"'`]+)/[^/\s\"'`]+")


def scratch(name: str) -> Path:
    """The default scratch directory of a benchmark: run directories and cells that do not belong in the
    repository (checkpoints, stores, ledgers), kept between sittings so that cells resume."""
    return Path(tempfile.gettempdir()) / name


def scrub(obj: Any, work: str | Path | None = None) -> Any:
    """`obj` (JSON-like) with machine paths taken out of every string: the repository's own paths made
    relative to it, `work` and any other scratch directory written as $WORK (so a checkpoint reads as
    `$WORK/code-loop_default-1/checkpoints/r04-seg`: which run and branch, not where it lay)."""
    if isinstance(obj, dict):
        return {k: scrub(v, work) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [scrub(v, work) for v in obj]
    if not isinstance(obj, str):
        return obj
    out = obj.replace(f"{ROOT}/", "")
    if work is not None:
        out = out.replace(str(Path(work).resolve()), WORK).replace(str(work), WORK)
    return _MACHINE_PATH.sub(WORK, out)


def relative(path: str | Path) -> str:
    """A path as the repository names it (relative to its root), or scrubbed when it lies outside."""
    p = Path(path).resolve()
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else scrub(str(p))
