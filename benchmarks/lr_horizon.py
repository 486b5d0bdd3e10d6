"""A trial's horizon against the run's, for SWE's learning rate (`swe_short_300k`): the regrade (`tests_restored`)
trained static from the seed's warm-started base at the naive 5e-4 and at 2.5e-4 (the rate the loop repaired with at
seeds 2-4; the hand-tuned reference runs 2e-4), each read on the seed's gate tasks at token marks from the start to
the budget. A trial reads its arms after 20 steps, about 13-17k tokens: whether the lower rate is already ahead there
says whether a trial can see its gain at all (it can: ahead at every seed from 15k tokens, benchmarks/HISTORY.md).
One cell a seed and rate, each written whole (resumable by cell):

    python -m benchmarks.lr_horizon cell SEED LR [--work DIR]
    python -m benchmarks.lr_horizon aggregate
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from benchmarks.claims.arms import arm_config
from benchmarks.claims.runners import base_checkpoint
from benchmarks.intervals import paired_interval
from benchmarks.manifest import write_result
from benchmarks.paths import RESULTS
from evotrainer.backtest.trial import ArmSpec, run_arm
from evotrainer.envs.registry import make_domain
from evotrainer.stages.context import split_heldout

DOMAIN = "swe_short_300k"
REGRADE = {"harness.reward_weights": {"tests_restored": 1.0, "format": 0.1}}
MARKS = (15_000, 30_000, 60_000, 120_000, 200_000)
"""Generated tokens at which the arm is read besides its start and its end: the first is about one trial."""
OUT = RESULTS / "lr_horizon"
NAIVE, LOW = 5e-4, 2.5e-4


def cell(seed: int, lr: float, work: Path) -> Path:
    out = OUT / f"seed{seed}-lr{lr:g}.json"
    if out.exists():
        return out
    name = f"horizon-{seed}-{lr:g}"
    cfg = arm_config(DOMAIN, "static_default", seed, work, {**REGRADE, "harness.optimizer.learning_rate": lr,
                                                            "run.name": name})  # fmt: skip
    base = str(base_checkpoint(cfg))
    domain = make_domain(cfg)
    gate_ids, _ = split_heldout([t.id for t in domain.tasks("heldout")], cfg.gate.final_fraction, cfg.run.seed)
    r = run_arm(
        ArmSpec(
            branch="horizon",
            role="control",
            run_dir=str(Path(cfg.run.out_dir) / name),
            config=cfg.model_dump(mode="json"),
            harness=cfg.harness.model_dump(mode="json"),
            start=base,
            seed=seed,
            first_step=1,
            steps=100_000,  # a cap: the arm stops at the step that reaches the budget's tokens
            gate_ids=tuple(gate_ids),
            checkpoints=(0, *MARKS),
            tokens=cfg.budget.generated_tokens,
        )
    )
    reads = {m: sum(o.values()) / max(1, len(o)) for m, o in r.checkpoint_outcomes.items()}
    reads[str(r.generated_tokens)] = r.accuracy
    write_result(
        out,
        {"seed": seed, "learning_rate": lr, "tokens": r.generated_tokens, "steps": r.last_step, "reads": reads,
         "outcomes": {**r.checkpoint_outcomes, str(r.generated_tokens): r.outcomes}},
        work=work,
        overrides={**REGRADE, "harness.optimizer.learning_rate": lr},
    )  # fmt: skip
    return out


def aggregate(out_path: Path = RESULTS / "lr_horizon.json") -> Path:
    """Each seed's reads by mark, both rates, and at every mark the lower rate minus the naive one over the seeds
    (paired on the gate tasks: the two-level bootstrap and the seed t of benchmarks.intervals)."""
    cells = [p for p in sorted(OUT.glob("seed*-lr*.json")) if not p.name.endswith(".manifest.json")]
    by = {(c["seed"], c["learning_rate"]): c for c in (json.loads(p.read_text()) for p in cells)}
    seeds = sorted(s for s, lr in by if lr == LOW and (s, NAIVE) in by)

    def at(c: dict, key: str) -> str:  # "end": the read after the step that reached the budget
        return str(c["tokens"]) if key == "end" else key

    marks = ["0", *(str(m) for m in MARKS), "end"]
    reads = {str(s): {m: [by[s, lr]["reads"][at(by[s, lr], m)] for lr in (NAIVE, LOW)] for m in marks} for s in seeds}
    differences = {
        m: paired_interval(
            [by[s, LOW]["outcomes"][at(by[s, LOW], m)] for s in seeds],
            [by[s, NAIVE]["outcomes"][at(by[s, NAIVE], m)] for s in seeds],
        ).model_dump()
        for m in marks[1:]
    }
    for m, d in differences.items():
        t = d["seed_t"]
        print(f"{m:>7}: low - naive {d['delta']:+.3f}, bootstrap [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}], seed t "
              f"[{t['ci_low']:+.3f}, {t['ci_high']:+.3f}]")  # fmt: skip
    out = {"naive": NAIVE, "low": LOW, "seeds": seeds, "reads (naive, low)": reads, "low_minus_naive": differences}
    note = f"aggregated from {2 * len(seeds)} cells in lr_horizon/"
    return write_result(out_path, out, note=note)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.lr_horizon", description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=["cell", "aggregate"])
    ap.add_argument("args", nargs="*")
    ap.add_argument("--work", type=Path, default=None)
    a = ap.parse_args(argv)
    if a.what == "aggregate":
        aggregate()
        return
    try:
        seed, lr = (int(a.args[0]), float(a.args[1])) if len(a.args) == 2 else (None, None)
    except ValueError:
        seed = None
    if seed is None:
        ap.error(f"cell takes SEED LR (an integer and a learning rate, e.g. `cell 1 5e-4`), not {a.args}")
    work = a.work or Path(tempfile.mkdtemp(prefix="lr-horizon-"))
    print(cell(seed, lr, work))


if __name__ == "__main__":
    main()
