"""What the loop's gap to the SWE reference (`swe_short_300k`) is made of: the harness the loop found, trained
static from step 1 on the same budget, against the reference, the base and the loop itself, with paired intervals
on the same fresh tasks. Reads finished cells only (each written by `python -m benchmarks.claims cell`):

    RW='harness.reward_weights={tests_restored: 1.0, format: 0.1}'
    python -m benchmarks.claims cell swe_short_300k static_default SEED \\
        --cells benchmarks/results/claims-found-harness --set "$RW" --set harness.optimizer.learning_rate=0.00025
    python -m benchmarks.claims cell swe_short_300k static_default SEED \\
        --cells benchmarks/results/claims-regrade-only --set "$RW"
    python -m benchmarks.swe_gap

The first is the harness the loop took at seeds 2 and 3 (the regrade with the learning rate halved, as a repair);
the second the one it kept at seed 1 (the regrade alone, at the naive 5e-4)."""

from __future__ import annotations

from benchmarks.claims.records import read_cell
from benchmarks.intervals import paired_interval
from benchmarks.manifest import write_result
from benchmarks.paths import RESULTS

DOMAIN = "swe_short_300k"
SEEDS = (1, 2, 3)
ARMS = {  # name -> (cells directory under results/, arm)
    "found_harness_static": ("claims-found-harness", "static_default"),
    "regrade_only_static": ("claims-regrade-only", "static_default"),
    "reference": ("claims", "static_reference"),
    "base": ("claims", "base"),
    "loop": ("claims-search", "loop_default"),
    "loop_warm": ("claims-search", "loop_default_warm"),
}
PAIRS = [
    ("found_harness_static", "reference"),
    ("found_harness_static", "base"),
    ("regrade_only_static", "base"),
    ("regrade_only_static", "reference"),
    ("loop", "found_harness_static"),
    ("loop", "reference"),
    ("loop", "base"),
    ("loop_warm", "found_harness_static"),
    ("loop_warm", "reference"),
]


def main() -> None:
    cells = {
        name: [read_cell(RESULTS / d / f"{DOMAIN}-{arm}-{s}.json") for s in SEEDS] for name, (d, arm) in ARMS.items()
    }
    for s, row in enumerate(zip(*cells.values(), strict=True)):  # one evaluator a seed, or no pairing
        if len({c.evaluator_hash for c in row}) != 1:
            raise SystemExit(f"seed {SEEDS[s]}: the cells were read by different evaluators; rerun them at one commit")
    out = {
        "accuracy": {n: [c.accuracy for c in cs] for n, cs in cells.items()},
        "differences": {
            f"{a} - {b}": paired_interval([c.outcomes for c in cells[a]], [c.outcomes for c in cells[b]]).model_dump()
            for a, b in PAIRS
        },
        "cells": {n: f"results/{d}/{DOMAIN}-{arm}-SEED.json" for n, (d, arm) in ARMS.items()},
    }
    for k, v in out["differences"].items():
        t = v["seed_t"]
        print(
            f"{k}: {v['delta']:+.3f}, bootstrap [{v['ci_low']:+.3f}, {v['ci_high']:+.3f}], "
            f"seed t [{t['ci_low']:+.3f}, {t['ci_high']:+.3f}]"
        )
    write_result(RESULTS / "swe_gap.json", out, indent=1, no_config=True, note="from finished claims cells")


if __name__ == "__main__":
    main()
