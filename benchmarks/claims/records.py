"""The claims' records: a cell (one domain, arm and seed, measured) and the aggregate of a domain's cells,
each read and written through its model so that a renamed key fails where it is read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from benchmarks.intervals import PairedInterval, Verdict
from benchmarks.manifest import manifest_path, read_manifest, results_in


class PlantedOutcome(BaseModel):
    round: int
    outcome: str
    """Where the round's planted candidate stopped (cells.planted_outcome): `promote: ...` is a failure."""


class Cell(BaseModel):
    """benchmarks/results/claims/<domain>-<arm>-<seed>.json: an arm's final policy read on the seed's fresh
    tasks, and what the arm did (a static arm's steps; a loop's rounds, promotions and plants)."""

    # Cells of earlier versions load: keys dropped since are ignored.
    model_config = ConfigDict(extra="ignore")

    domain: str
    arm: str
    seed: int
    budget_tokens: int
    accuracy: float
    outcomes: dict[str, bool]
    """Fresh read task id -> audit passed: arms are compared task by task."""
    evaluator_hash: str
    seconds: float
    overrides: dict[str, Any]
    checkpoint: str
    """The final policy's checkpoint, under the cell's scratch directory ($WORK/...): which run and branch."""
    steps: int | None = None
    """A static arm's training steps."""
    rounds: int | None = None
    stop_reason: str | None = None
    generated_tokens: int
    promoted: list[dict[str, Any]] = []
    """Each promotion: its round, its proposer source and the intervention's fields."""
    rejected_with_findings: int | None = None
    planted: list[PlantedOutcome] = []
    trajectory: list[tuple[int, float]] | None = None
    """loop_default and its warm twin: (tokens spent through round r, the mainline's accuracy after it) a
    round, then the final head: the skills read."""

    @property
    def name(self) -> str:
        return cell_name(self.domain, self.arm, self.seed)


def cell_name(domain: str, arm: str, seed: int) -> str:
    return f"{domain}-{arm}-{seed}"


def read_cell(path: Path) -> Cell:
    return Cell.model_validate_json(path.read_text())


def read_cells(folder: Path) -> list[Cell]:
    """Every cell of a folder (its result files, not their manifests), in file-name order."""
    return [read_cell(p) for p in results_in(folder)]


def machine_of(path: Path) -> str | None:
    """The machine a cell ran on, from its manifest; None where it is not recorded (cells before 2026-12-01)."""
    return read_manifest(path).machine if manifest_path(path).is_file() else None


def mixed_machines(cells: list[tuple[Cell, str | None]]) -> str:
    """Why cells of one domain and seed cannot be compared, "" when they can: each arm starts from a base
    warm-started where it ran, and another CPU's floating-point sums warm-start another base (benchmarks.manifest
    .Manifest.machine), so arms of one seed that ran on two machines did not start from one policy. A cell whose
    machine is not recorded counts as a machine of its own."""
    seen: dict[tuple[str, int], set[str | None]] = {}
    for cell, machine in cells:
        seen.setdefault((cell.domain, cell.seed), set()).add(machine)
    mixed = [f"{d} seed {s}: {sorted(m or 'not recorded' for m in ms)}" for (d, s), ms in seen.items() if len(ms) > 1]
    if not mixed:
        return ""
    return (
        f"cells of one seed ran on several machines ({'; '.join(mixed)}), so they did not start from one base; "
        "run every arm of a seed on one machine"
    )


class DomainClaims(BaseModel):
    """One domain's entry of benchmarks/results/claims.json, over the seeds with all four main arms."""

    budget_tokens: int
    seeds: list[int]
    evaluator_hashes: list[str]
    """Every evaluator that read a cell. A seed's read tasks leave out that seed's own train and held-out
    questions, so where the fresh draw meets them (a small question space: the real model's two-term sums) seeds
    are read on different tasks, each with its own hash."""
    stale_seeds: list[int] = []
    """Seeds whose arms were read by more than one evaluator: arms are compared task by task within a seed, so
    such a seed's cells are stale and must be run again, and the domain is not compared."""
    static_default: list[float]
    static_reference: list[float]
    loop_default: list[float]
    loop_reference: list[float]
    base: list[float | None]
    loop_default_vs_reference: PairedInterval
    loop_reference_vs_reference: PairedInterval
    loop_default_over_reference: float
    """The issue's "gain over the reference": the loop's mean accuracy over the reference's."""
    margin: float | None = None
    """The loss within which the loop counts as at the reference: one standard error of one final read of the
    reference (intervals.read_margin). None in aggregates written before it."""
    verdict: Verdict | None = None
    """loop_default - reference's seed-level interval against `margin` (intervals.verdict)."""
    promoted: dict[str, list[dict[str, Any]]]
    invalid_planted: int
    invalid_promoted: int
    invalid_outcomes: list[str]


class OverBase(BaseModel):
    """An arm against the untrained base, task by task on each seed's read tasks, over the seeds that have
    both cells: whether RL helped at all (issue #26: static RL on a pretrained model, 3 seeds, paired)."""

    seeds: list[int]
    arm: list[float]
    base: list[float]
    vs_base: PairedInterval


class SkillPair(BaseModel):
    domain: str
    seed: int
    cold_final: float
    cold_tokens: int | None
    warm_tokens: int | None
    """Tokens the warm run spent to reach the cold run's final accuracy; None if it never did."""
    warm_final: float | None = None
    """The warm run's own final accuracy (it spends the same budget)."""
    arm: str = "loop_default_warm"
    """loop_default_warm (the cold run's own library), loop_default_across (another domain's) or loop_default_project
    (arms.PROJECT_SEEDS' cold runs', merged)."""
    library_from: str | None = None
    """For loop_default_across: the domain whose cold run left the library."""
    margin: float | None = None
    """One standard error of one read of the cold final on the cold run's final tasks (intervals.read_margin)."""
    cold_tokens_within: int | None = None
    warm_tokens_within: int | None = None
    """Each run's tokens to its first round head read at or above cold_final - margin: reached within one read's
    noise, the same rule for both runs (HISTORY.md, "Do warm runs reach the cold run's final?"); None if never."""


class SkillsMet(BaseModel):
    """One domain and warm arm over its seeds: the warm run's tokens over the cold run's, each way of reading
    "reached", and whether it is at most SKILLS_TARGET at a majority of the seeds."""

    seeds: list[int]
    strict: list[float | None]
    """Ratio of the tokens to the cold final read itself (None: the warm run never read it)."""
    within: list[float | None]
    """Ratio of the tokens to the cold final within one read's noise (SkillPair.cold/warm_tokens_within)."""
    within_at_or_under: int
    """Seeds whose `within` ratio is at most the target."""
    met: bool
    """At most the target at more than half the seeds, within one read's noise (the pre-registered reading)."""


class Skills(BaseModel):
    cold_tokens: int
    warm_tokens: int | None
    """None unless every warm run reached its cold run's final accuracy."""
    pairs: list[SkillPair]
    warm_vs_cold: dict[str, PairedInterval] = {}
    """Per domain with two seeds or more: the warm run's final read minus the cold run's, task by task."""
    met: dict[str, SkillsMet] = {}
    """Per domain and warm arm (keyed as warm_vs_cold): the tokens ratios and the verdict against the target."""
