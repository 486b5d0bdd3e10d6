"""A trial's horizon against the run's, for SWE's learning rate (`swe_short_300k`): the regrade (`tests_restored`)
trained static from the seed's warm-started base at the naive 5e-4 and at 2.5e-4 (the rate the loop repaired with at
seeds 2-4; the hand-tuned reference runs 2e-4), each read on the seed's gate tasks at token marks from the start to
the budget. A trial reads its arms after 20 steps, about 13-17k tokens; where the lower rate trails there and leads
by the end, no trial of that length can promote it, and the gate (a supported gain on the held-out tasks) never
takes a lower rate except as a repair. One cell a seed and rate, each written whole (resumable by cell):

    python -m benchmarks.lr_horizon cell SEED LR [--work DIR]
    python -m benchmarks.lr_horizon aggregate
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from benchmarks.claims.arms import arm_config
from benchmarks.claims.runners import static_arm
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
    base = static_arm(cfg.model_copy(), 0)["checkpoint"]  # builds the seed's base checkpoint, trains nothing
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


def aggregate() -> Path:
    """Each seed's reads by mark, both rates, and the lower rate minus the naive one at every mark both reached."""
    cells = [read_json(p) for p in sorted(OUT.glob("seed*-lr*.json"))]
    by = {(c["seed"], c["learning_rate"]): c for c in cells}
    seeds = sorted({s for s, _ in by})
    rows = {}
    for s in seeds:
        lo, hi = by.get((s, LOW)), by.get((s, NAIVE))
        if lo is None or hi is None:
            continue
        marks = [m for m in lo["reads"] if m in hi["reads"]]  # the marks both passed (the end differs a little)
        rows[str(s)] = {m: {"naive": hi["reads"][m], "low": lo["reads"][m], "low_minus_naive":
                            round(lo["reads"][m] - hi["reads"][m], 4)} for m in marks}  # fmt: skip
        ends = (lo["tokens"], hi["tokens"])
        rows[str(s)]["end"] = {
            "naive": hi["reads"][str(ends[1])],
            "low": lo["reads"][str(ends[0])],
            "low_minus_naive": round(lo["reads"][str(ends[0])] - hi["reads"][str(ends[1])], 4),
        }
    for s, r in rows.items():
        print(f"seed {s}: " + "; ".join(f"{m} {v['naive']:.2f}/{v['low']:.2f}" for m, v in r.items()))
    return write_result(RESULTS / "lr_horizon.json", {"naive": NAIVE, "low": LOW, "seeds": rows},
                        note=f"aggregated from {len(cells)} cells in lr_horizon/")  # fmt: skip


def read_json(p: Path) -> dict:
    return json.loads(p.read_text())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.lr_horizon", description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=["cell", "aggregate"])
    ap.add_argument("args", nargs="*")
    ap.add_argument("--work", type=Path, default=None)
    a = ap.parse_args(argv)
    if a.what == "aggregate":
        aggregate()
        return
    seed, lr = int(a.args[0]), float(a.args[1])
    work = a.work or Path(tempfile.mkdtemp(prefix="lr-horizon-"))
    print(cell(seed, lr, work))


if __name__ == "__main__":
    main()
