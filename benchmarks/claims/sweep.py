"""The reference's tuning (the human's effort): static_reference at each learning rate on TUNING_SEED, read on
tasks that no benchmark seed trains on, is gated on or is read on (benchmarks/results/reference_sweep-DOMAIN.json)."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.claims.arms import (
    DOMAIN_SETS,
    READ_TASKS,
    SEEDS,
    TUNING_SEED,
    arm_config,
    config_file,
    read_tasks,
    task_key,
)
from benchmarks.claims.runners import static_arm
from benchmarks.manifest import write_result
from benchmarks.paths import RESULTS
from evotrainer.config import RunConfig
from evotrainer.envs.registry import make_domain
from evotrainer.evaluation import evaluate
from evotrainer.policies.hf import HFPolicy


def sweep(domain: str, lrs: list[float], work: Path, sets: dict) -> list[dict]:
    """Each learning rate's static reference arm read on the tuning tasks (a rate already in the result file
    is not run again; 0 is the base, untrained)."""
    out = RESULTS / f"reference_sweep-{domain}.json"
    done = {r["learning_rate"]: r for r in (json.loads(out.read_text()) if out.exists() else [])}
    tasks: list = []
    for lr in lrs:
        if lr in done:
            continue
        over = {**sets, "harness.optimizer.learning_rate": lr}
        sweep_work = work / f"sweep-lr{lr:g}"
        cfg = arm_config(domain, "static_reference", TUNING_SEED, sweep_work, over)
        res = static_arm(cfg, cfg.budget.generated_tokens if lr else 0)  # rate 0: the base, untrained
        tasks = tasks or tuning_tasks(cfg, READ_TASKS[domain])  # the same for every rate
        ev = evaluate(HFPolicy.load(res["checkpoint"]), make_domain(cfg), tasks, cfg.eval)
        done[lr] = {"learning_rate": lr, "accuracy": ev.accuracy, "tasks": len(tasks), **res}
        # One manifest for the file: the rates in it may come from several sittings, each named in the note.
        written = sorted(done.values(), key=lambda r: r["learning_rate"])
        rates = ", ".join(f"{r['learning_rate']:g}" for r in written)
        write_result(
            out,
            written,
            work=work,
            indent=1,
            configs=[config_file(domain, "static_reference")],
            overrides={**DOMAIN_SETS.get(domain, {}), **sets},
            note=f"learning rates {rates} (each its own harness.optimizer.learning_rate); the last written: {lr:g}",
        )
        print(f"lr {lr:g}: {ev.accuracy:.3f} on {len(tasks)} tuning tasks", flush=True)
    return list(done.values())


def tuning_tasks(cfg: RunConfig, n: int) -> list:
    """Up to n tasks drawn under the seed after TUNING_SEED, minus the tuning run's own train and
    held-out questions (as the benchmark's read) and minus every question a benchmark seed is gated or read
    on (its held-out split and its read tasks). Questions a benchmark seed trains on may remain: a tuning
    read on them leaks no reported figure."""
    own = make_domain(cfg)
    seen = {task_key(t) for split in ("train", "heldout") for t in own.tasks(split)}
    for s in SEEDS:
        bench = with_seed(cfg, s)
        seen |= {task_key(t) for t in read_tasks(bench, n) + make_domain(bench).tasks("heldout")}
    draw = cfg.model_copy(
        update={
            "run": cfg.run.model_copy(update={"seed": TUNING_SEED + 1}),
            "eval": cfg.eval.model_copy(update={"heldout_size": 4 * n}),
        }
    )
    return [t for t in make_domain(draw).tasks("heldout") if task_key(t) not in seen][:n]


def with_seed(cfg: RunConfig, seed: int) -> RunConfig:
    return cfg.model_copy(update={"run": cfg.run.model_copy(update={"seed": seed})})
