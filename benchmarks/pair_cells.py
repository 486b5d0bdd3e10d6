"""Two sets of finished claims cells against each other, paired task by task on the same fresh read tasks: one
change's effect where both sets ran the same arm on the same bases (a loop with a setting changed, beside the loop
without it), with both intervals of benchmarks/intervals.py. Reads cells only (each written by `python -m
benchmarks.claims cell`), so it costs nothing to rerun:

    python -m benchmarks.pair_cells --domain math --a results/claims-checkpoint-tasks \\
        --b results/claims-checkpoint-tasks-250 --out results/claims-checkpoint-tasks-pair.json

Cells of one seed read under different evaluators, or run on different machines (so from different bases), are not
paired: the command stops and names the seed."""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks.claims.records import cell_name, machine_of, mixed_machines, read_cell
from benchmarks.intervals import paired_interval
from benchmarks.manifest import write_result
from benchmarks.paths import ROOT


def pair(a_dir: Path, b_dir: Path, domain: str, arm_a: str, arm_b: str, seeds: list[int]) -> dict:
    """The mean accuracy difference a - b over `seeds`, with its intervals and each side's accuracies."""
    pa = [a_dir / f"{cell_name(domain, arm_a, s)}.json" for s in seeds]
    pb = [b_dir / f"{cell_name(domain, arm_b, s)}.json" for s in seeds]
    a, b = [read_cell(p) for p in pa], [read_cell(p) for p in pb]
    if why := mixed_machines([(c, machine_of(p)) for c, p in zip(a + b, pa + pb)]):
        raise SystemExit(why)
    for s, x, y in zip(seeds, a, b, strict=True):
        if x.evaluator_hash != y.evaluator_hash:
            raise SystemExit(
                f"seed {s}: {x.evaluator_hash} and {y.evaluator_hash} are two evaluators, so the cells read different "
                "tasks or settings; run both sets at one evaluator"
            )
    diff = paired_interval([c.outcomes for c in a], [c.outcomes for c in b])
    return {
        "a": {"cells": str(a_dir), "arm": arm_a, "accuracy": [c.accuracy for c in a]},
        "b": {"cells": str(b_dir), "arm": arm_b, "accuracy": [c.accuracy for c in b]},
        "seeds": seeds,
        "a_minus_b": diff.model_dump(),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.pair_cells", description=__doc__.split("\n\n")[0])
    ap.add_argument("--domain", required=True)
    ap.add_argument("--a", type=Path, required=True, help="cells directory of the first set")
    ap.add_argument("--b", type=Path, required=True, help="cells directory of the second set")
    ap.add_argument("--arm", default="loop_default", help="the first set's arm")
    ap.add_argument("--arm-b", default=None, help="the second set's arm (default: --arm)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    a_dir, b_dir = (d if d.is_absolute() else ROOT / "benchmarks" / d for d in (args.a, args.b))
    out = pair(a_dir, b_dir, args.domain, args.arm, args.arm_b or args.arm, args.seeds)
    d, t = out["a_minus_b"], out["a_minus_b"]["seed_t"]
    print(
        f"{args.domain} a - b: {d['delta']:+.3f}, bootstrap [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}], "
        f"seed t [{t['ci_low']:+.3f}, {t['ci_high']:+.3f}]"
    )
    out_path = args.out if args.out.is_absolute() else ROOT / "benchmarks" / args.out
    write_result(out_path, out, indent=1, no_config=True, note="from finished claims cells")


if __name__ == "__main__":
    main()
