"""The gate's error rates on every path, from simulated arms run through the gate's own functions.

benchmarks/gate_calibration.py resamples real arms (two domains, three bases each) through every path at the
spread those arms have. This benchmark covers what a pool cannot: nulls whose seed-to-seed spread (phi) runs
from the binomial floor to twice what real arms showed, with the mean unchanged, and K beyond what pools of a
dozen arms a base can draw. Rows are fresh draws, not the arms the noise prior was centred on (gate.PRIOR_PHI).

The arms: each gate task has a latent margin z ~ N(0.4, 1) that the round's starting policy passes when z > 0
(its read, fixed for the round). An arm trained on from it on its own seeds passes when z + e + u + delta > 0:
e ~ N(0, 0.15) per task and arm (which tasks flip), u ~ N(0, sigma) per arm (how far the run as a whole lands
above another: the overdispersion), delta the candidate's true effect (0 under the null; the fix: +0.05 accuracy).
sigma is set by bisection so that A-A pairs show the wanted phi. The paths are benchmarks/gate_paths.py's (the
race never stops a simulated arm: these arms have no checkpoint reads).

Per run: ROUNDS raced rounds with the bank growing; the round's level comes from the run's error control
(gate.round_alpha, LORD++) or, for comparison, the old fixed per-round level.

    python -m benchmarks.gate_simulation [--rounds 4000] [--runs 2000]

Writes benchmarks/results/gate_simulation.json (rows: path, K, phi, error_control, rates with Clopper-Pearson
intervals, nominal, power, what each count counts) and its manifest.
"""

from __future__ import annotations

import argparse
import functools
import math
from pathlib import Path

import numpy as np
from scipy import stats

from benchmarks.gate_paths import PATHS, one_round
from benchmarks.manifest import write_result
from benchmarks.paths import RESULTS
from benchmarks.tables import markdown_table
from evotrainer.backtest import gate
from evotrainer.backtest.statistics import Pair, dispersions

TASKS = 250  # the main job's gate tasks
FLIP = 0.15  # e's scale: A-A pairs then disagree on about 20 of 250 tasks, as the main job's did
FIX = 0.05  # the fix's true gain in accuracy
ALPHA = 0.05  # 1 - gate.level's default
ROUNDS_PER_RUN = 6
PHIS = (1.0, 1.5, 3.0)


class Arms:
    """Draws arms of one round: the start's margins and read, then arms trained on from it."""

    def __init__(self, rng: np.random.Generator, sigma: float):
        self.rng, self.sigma = rng, sigma
        self.z = rng.normal(0.4, 1.0, TASKS)
        self.ids = [f"t{i}" for i in range(TASKS)]
        self.start = self.outcomes(self.z > 0)
        # the fix's shift in margin for +FIX accuracy: the density of margins near 0 sets it
        self.shift = FIX / max(1e-6, float(stats.norm.pdf(0.0, 0.4, math.hypot(1.0, FLIP))))

    def outcomes(self, passed: np.ndarray) -> dict[str, bool]:
        return dict(zip(self.ids, passed.tolist(), strict=True))

    def arm(self, fix: bool = False) -> dict[str, bool]:
        u = self.rng.normal(0.0, self.sigma) + (self.shift if fix else 0.0)
        return self.outcomes(self.z + self.rng.normal(0.0, FLIP, TASKS) + u > 0)

    def stopped(self, cand: dict[str, bool], control: dict[str, bool]) -> bool:
        return False


@functools.cache
def sigma_for(phi: float, seed: int = 0, pairs: int = 3000) -> float:
    """The run-effect scale at which A-A pairs show `phi` (their mean (w - l)^2 / discordant), by bisection."""

    def measured(sigma: float) -> float:
        rng = np.random.default_rng(seed)
        aa = []
        for _ in range(pairs // 10):
            arms = Arms(rng, sigma)
            aa += [Pair.of(arms.arm(), arms.arm()) for _ in range(10)]
        return float(np.mean(dispersions(aa)))  # unfloored: the bisection reads phi below 1 too

    lo, hi = 0.0, 0.5
    for _ in range(18):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if measured(mid) < phi else (lo, mid)
    return (lo + hi) / 2


def run(
    rng: np.random.Generator,
    sigma: float,
    path: str,
    k: int,
    scheme: str,
    fix_round: int | None,
    rounds: int = ROUNDS_PER_RUN,
) -> list[bool]:
    """`rounds` raced rounds of one run, each from a fresh start (the policy moved on); the levels from
    `scheme` ("run": LORD++ over the run; "round": ALPHA every round). The own_noise path banks nothing, and
    against_start banks one A-A pair before its first round (a round whose control was healthy)."""
    bank = _warm_bank(rng, sigma, path)
    promoted, found = [], []
    for t in range(1, rounds + 1):
        alpha = gate.round_alpha(ALPHA, t, found) if scheme == "run" else ALPHA
        p, _ = one_round(Arms(rng, sigma), path, k, bank, alpha, fix_round == t)
        promoted.append(p)
        if p:
            found.append(t)
    return promoted


def rate(hits: int, n: int) -> dict:
    ci = stats.binomtest(hits, n).proportion_ci(0.95, method="exact") if n else None
    return {"rate": hits / n if n else None, "ci95": [round(ci.low, 4), round(ci.high, 4)] if ci else None}


def cell(path: str, k: int, phi: float, scheme: str, rounds: int, runs: int, seed: int) -> dict:
    """One row: the per-round false-promotion rate (the run's first raced round, under the null), the per-run rate
    (any promotion in ROUNDS_PER_RUN null rounds), and the power to promote the fix raced in the first round."""
    sigma = sigma_for(phi)
    rng = np.random.default_rng(seed)
    first = [run(rng, sigma, path, k, scheme, None, rounds=1) for _ in range(rounds)]
    null_runs = [run(rng, sigma, path, k, scheme, None) for _ in range(runs)]
    fixes = [
        one_round(Arms(rng, sigma), path, k, _warm_bank(rng, sigma, path), _alpha1(scheme), True)[1]
        for _ in range(runs // 4)
    ]
    per_round = sum(r[0] for r in first) + sum(r[0] for r in null_runs)
    n_round = len(first) + len(null_runs)
    return {
        "path": path,
        "K": k,
        "phi": phi,
        "error_control": scheme,
        "false_promotion_rate": rate(per_round, n_round),
        "per_run_false_promotion_rate": rate(sum(any(r) for r in null_runs), len(null_runs)),
        "nominal_round": round(_alpha1(scheme), 5),
        "nominal_run": ALPHA if scheme == "run" else None,
        "power": rate(sum(fixes), len(fixes)),
        "counts": {
            "null_first_rounds": n_round,
            "null_runs": len(null_runs),
            "rounds_per_run": ROUNDS_PER_RUN,
            "fix_rounds": len(fixes),
        },
    }


def _alpha1(scheme: str) -> float:
    return gate.round_alpha(ALPHA, 1, []) if scheme == "run" else ALPHA


def _warm_bank(rng: np.random.Generator, sigma: float, path: str) -> list[Pair]:
    """The bank a run brings to its first raced round: one A-A pair on the against_start path, else none."""
    if path != "against_start":
        return []
    arms = Arms(rng, sigma)
    return [Pair.of(arms.arm(), arms.arm())]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gate_simulation", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2000, help="null first rounds per row (besides the runs')")
    ap.add_argument("--runs", type=int, default=600, help="null runs per row")
    ap.add_argument("--ks", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--phis", type=float, nargs="+", default=list(PHIS))
    ap.add_argument("--paths", nargs="+", default=list(PATHS), choices=PATHS)
    ap.add_argument("--schemes", nargs="+", default=["run", "round"], choices=["run", "round"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="gate_simulation.json", help="the result file, under benchmarks/results/")
    a = ap.parse_args(argv)
    if Path(a.out).name != a.out or not a.out.endswith(".json"):  # checked before the minutes of simulation
        ap.error(f"--out {a.out!r}: give a file name ending in .json (it is written under benchmarks/results/)")
    rows = []
    for path in a.paths:
        for k in a.ks:
            for phi in a.phis:
                for scheme in a.schemes:
                    rows.append(cell(path, k, phi, scheme, a.rounds, a.runs, a.seed))
                    r = rows[-1]
                    print(
                        f"{path} K={k} phi={phi} {scheme}: round {r['false_promotion_rate']['rate']:.4f} "
                        f"run {r['per_run_false_promotion_rate']['rate']:.4f} power {r['power']['rate']:.3f}",
                        flush=True,
                    )
    out = write_result(RESULTS / a.out, rows, indent=1, note=f"seed {a.seed}")
    print(
        markdown_table(
            ["path", "K", "phi", "control", "per round", "per run", "power"],
            [
                [
                    r["path"],
                    r["K"],
                    r["phi"],
                    r["error_control"],
                    _fmt(r["false_promotion_rate"]),
                    _fmt(r["per_run_false_promotion_rate"]),
                    _fmt(r["power"]),
                ]
                for r in rows
            ],
        )
    )
    print(f"wrote {out}")


def _fmt(r: dict) -> str:
    return f"{r['rate']:.3f} [{r['ci95'][0]:.3f}, {r['ci95'][1]:.3f}]"


if __name__ == "__main__":
    main()
