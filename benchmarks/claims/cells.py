"""One claims cell: an arm of one domain and seed trained, its final policy read on the seed's fresh tasks,
and the result written whole with its manifest; finished cells are read back, not run again."""

from __future__ import annotations

import time
from pathlib import Path

from benchmarks.claims.arms import (
    ACROSS_FROM,
    DOMAIN_SETS,
    PROJECT_SEEDS,
    READ_TASKS,
    arm_config,
    config_file,
    read_tasks,
)
from benchmarks.claims.records import Cell, cell_name, read_cell
from benchmarks.claims.runners import loop_arm, static_arm
from benchmarks.manifest import write_result
from benchmarks.paths import RESULTS
from evotrainer.envs.registry import make_domain
from evotrainer.evaluation import evaluate
from evotrainer.policies.hf import HFPolicy

CELLS = RESULTS / "claims"
SKILLS_READ = ("loop_default", "loop_default_warm", "loop_default_across", "loop_default_project")
"""The arms whose every round's mainline is read on the cell's tasks (tokens to reach the cold run's final read)."""


def libraries(domain: str, arm: str, seed: int, work: Path, sets: dict, cells: Path) -> list[Path]:
    """The libraries a warm arm starts with, each a cold loop_default run's (run first where not finished): the same
    seed's (warm), another domain's at the same seed (across), or PROJECT_SEEDS' merged (project)."""
    if arm not in ("loop_default_warm", "loop_default_across", "loop_default_project"):
        return []
    source = ACROSS_FROM[domain] if arm == "loop_default_across" else domain
    seeds = PROJECT_SEEDS if arm == "loop_default_project" else (seed,)
    for s in seeds:
        run_cell(source, "loop_default", s, work, sets, cells)
    return [Path(arm_config(source, "loop_default", s, work, sets).loop.skills_dir) for s in seeds]


def run_cell(domain: str, arm: str, seed: int, work: Path, sets: dict, cells: Path = CELLS) -> Cell:
    out = cells / f"{cell_name(domain, arm, seed)}.json"
    if out.exists():
        return read_cell(out)
    cfg = arm_config(domain, arm, seed, work, sets)
    t0 = time.perf_counter()
    if arm.startswith("static") or arm == "base":
        res = static_arm(cfg, 0 if arm == "base" else cfg.budget.generated_tokens)
    else:
        res = loop_arm(cfg, libraries(domain, arm, seed, work, sets, cells))
    tasks = read_tasks(cfg, READ_TASKS[domain])
    ev = evaluate(HFPolicy.load(res["checkpoint"]), make_domain(cfg), tasks, cfg.eval)
    seconds = time.perf_counter() - t0  # the arm and its read; the skills read below is not counted
    trajectory = None
    if arm in SKILLS_READ:  # the skills read: each round's mainline on the same tasks
        trajectory = [
            (tok, evaluate(HFPolicy.load(ck), make_domain(cfg), tasks, cfg.eval).accuracy)
            for tok, ck in res["trajectory"]
        ]
    cell = Cell(
        domain=domain,
        arm=arm,
        seed=seed,
        budget_tokens=cfg.budget.generated_tokens,
        accuracy=ev.accuracy,
        outcomes=ev.outcomes,
        evaluator_hash=ev.evaluator_hash,
        seconds=seconds,
        overrides={**DOMAIN_SETS.get(domain, {}), **sets},
        **{k: v for k, v in res.items() if k != "trajectory"},
        trajectory=trajectory,
    )
    # A cell is done only once whole (written atomically), so a killed cell is run again, not read half. Its
    # config hash covers the config file and the overrides the cell records (the rest is the commit's code).
    write_result(
        out,
        cell.model_dump(mode="json", exclude_none=True),
        work=work,
        indent=1,
        configs=[config_file(domain, arm)],
        overrides=cell.overrides,
    )
    print(f"{domain} {arm} seed {seed}: accuracy {ev.accuracy:.3f} ({time.perf_counter() - t0:.0f} s)", flush=True)
    return read_cell(out)  # as written (its checkpoint under $WORK), the same whether run now or before
