"""Is the gate's error rate what its level says on real arms, on every path, and can it still promote a known fix?

Pools of real arms (benchmarks/gate_pools.py): per domain (math, single-turn; digits, multi-turn tools) three
bases of their own seeds, each trained one segment to the round's start, and from it null arms (the start's
harness on other seeds: a candidate that changes nothing) and fix arms (the domain's known-good learning rate),
trained as the loop's trials are now (to equal tokens, read at the race's checkpoints). Rounds are resampled
from these arms' per-task gate outcomes, each from one base, with distinct arms for the control, the K
candidates, the finalist's replicate and the control replicate, and run through the gate's own functions on
each path (benchmarks/gate_paths.py): the race stops losers at its checkpoints (stopping.futile on the arms' own
reads), then gate.finalist and gate.confirmed. On the paths where the control carries an exploit the round's
arms are compared with the start; a null there is a comparator of the arms' own mean, so another null arm of
the same base stands in for the start's read (the real start sits below arms trained from it: a trained
candidate's gain over it is no false promotion).

Two null families per domain (`null`): the start's harness raced against itself (the fix arms stay the fix,
for power), and the fix's harness raced against itself (arms that move further from the same start and spread
more: the spread changes, the mean within the family does not).

Per row (domain, null family, path, K):
- false_promotion_rate: the share of null first raced rounds that promote anything, at the first round's level
  under the run's error control (gate.round_alpha), with an exact interval over rounds, per base, and a
  pool-level interval (a bootstrap over each base's arms: how much the rate depends on which arms were trained);
- per_run_false_promotion_rate: the share of null runs of ROUNDS_PER_RUN raced rounds (each from a base drawn at
  random; the noise bank grows as the run's does; LORD++ levels) that promote anything, nominal 1 - gate.level;
- power: the share of first raced rounds with the fix as candidate 1 (among K - 1 nulls) that promote it (the
  start's family; the fix's effect on each base is in gate_pools.json: where it has none, no gate finds it).

    python -m benchmarks.gate_calibration [--nulls 12] [--fixes 10] [--rounds 2000] [--runs 500]

Writes benchmarks/results/gate_calibration.json (rows) and gate_pools.json (each pool's start, arms' accuracies,
fix effect and measured dispersion), with manifests. The arms are cells under --work: a sitting that ends keeps them.
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

import numpy as np
from scipy import stats

from benchmarks.gate_paths import PATHS, one_round
from benchmarks.gate_pools import BASE_SEEDS, DOMAINS, build_all
from benchmarks.manifest import write_result
from benchmarks.paths import RESULTS, scratch
from benchmarks.tables import markdown_table
from evotrainer.backtest import gate, stopping
from evotrainer.backtest.statistics import Pair, dispersions

ALPHA = 0.05  # 1 - gate.level's default
ROUNDS_PER_RUN = 6
KS = (1, 2)  # the example configs race 1 (code, swe) or 2 (math) candidates
NULLS = ("start", "fix")  # the null arms' harness (as_nulls)


class Exhausted(Exception):
    """A bootstrap pool holds too few distinct arms for the round."""


class PoolRound:
    """One round's arms, drawn without replacement from one pool (gate_paths.Round). `stand_in`: another null
    arm is the start's read (the exploit paths' null)."""

    def __init__(self, pool: dict, rng: np.random.Generator, stand_in: bool):
        self._nulls, self._fixes = _distinct(pool["nulls"], rng), _distinct(pool["fixes"], rng)
        self._curves: dict[int, dict] = {}
        self.start = self._take(self._nulls) if stand_in else pool["start"]

    def _take(self, arms) -> dict[str, bool]:
        a = next(arms, None)
        if a is None:
            raise Exhausted
        self._curves[id(a["final"])] = a["curve"]
        return a["final"]

    def arm(self, fix: bool = False) -> dict[str, bool]:
        return self._take(self._fixes if fix else self._nulls)

    def stopped(self, cand: dict[str, bool], control: dict[str, bool]) -> bool:
        c, x = self._curves[id(control)], self._curves[id(cand)]
        marks = sorted(c, key=int)
        return any(stopping.futile(x[m], c[m], i == 0) for i, m in enumerate(marks))


def _distinct(arms: list[dict], rng: np.random.Generator):
    """The arms in random order, each once (a bootstrap pool repeats some)."""
    seen = set()
    for i in rng.permutation(len(arms)):
        if id(arms[i]) not in seen:
            seen.add(id(arms[i]))
            yield arms[i]


def run(pools: list[dict], rng: np.random.Generator, path: str, k: int, fix_first: bool, rounds: int) -> list[bool]:
    """`rounds` raced rounds of one run, each from a base drawn at random, at LORD++ levels; the fix raced in
    the first when `fix_first` (then: whether the fix was promoted). against_start's run brings one A-A pair
    banked before its first round (a round whose control was healthy); own_noise's banks none."""
    bank = [Pair.of(*_aa(pools, rng))] if path == "against_start" else []
    out, found = [], []
    for t in range(1, rounds + 1):
        pool = pools[rng.integers(len(pools))]
        fix = fix_first and t == 1
        promoted, fixed = one_round(
            PoolRound(pool, rng, path != "race_confirmation"), path, k, bank, gate.round_alpha(ALPHA, t, found), fix
        )
        out.append(fixed if fix else promoted)
        found += [t] if promoted else []
    return out


def _aa(pools: list[dict], rng: np.random.Generator) -> tuple[dict, dict]:
    r = PoolRound(pools[rng.integers(len(pools))], rng, False)
    return r.arm(), r.arm()


def first_rounds(pools: list[dict], rng: np.random.Generator, path: str, k: int, n: int, fix: bool) -> list[bool]:
    """n first raced rounds (a fresh run each). A round from a base too thin for it (a bootstrap pool's repeats)
    is drawn again from a base drawn again; Exhausted when most rounds cannot be drawn."""
    out, tries = [], 0
    while len(out) < n:
        tries += 1
        if tries > 20 * n:
            raise Exhausted
        try:
            out.append(run(pools, rng, path, k, fix, 1)[0])
        except Exhausted:
            continue
    return out


def boot_rate(pools: list[dict], rng: np.random.Generator, path: str, k: int, n: int) -> float:
    """The false-promotion rate of n first rounds on the pools resampled (a resample too thin to draw them from
    is drawn again)."""
    while True:
        try:
            return float(np.mean(first_rounds(resampled(pools, rng), rng, path, k, n, False)))
        except Exhausted:
            continue


def resampled(pools: list[dict], rng: np.random.Generator) -> list[dict]:
    """Each pool with its null and fix arms drawn again with replacement (the pool-level bootstrap)."""

    def again(arms):
        return [arms[i] for i in rng.integers(len(arms), size=len(arms))]

    return [{**p, "nulls": again(p["nulls"]), "fixes": again(p["fixes"])} for p in pools]


def rate(hits: int, n: int) -> dict:
    ci = stats.binomtest(hits, n).proportion_ci(0.95, method="exact")
    return {"rate": round(hits / n, 5), "ci95": [round(ci.low, 4), round(ci.high, 4)], "n": n}


def as_nulls(pools: list[dict], family: str) -> list[dict]:
    """The pools with `family`'s arms as the nulls: `start` (the start's own harness: the fix arms stay the fix)
    or `fix` (the fix's harness, raced against itself: arms that move further, and spread more, from the same
    start; no fix left to find)."""
    return pools if family == "start" else [{**p, "nulls": p["fixes"], "fixes": []} for p in pools]


def cell(domain: str, pools: list[dict], path: str, k: int, family: str, a: argparse.Namespace) -> dict:
    rng = np.random.default_rng([a.seed, k, PATHS.index(path), list(DOMAINS).index(domain), NULLS.index(family)])
    power = first_rounds(pools, rng, path, k, a.power_rounds, True) if family == "start" else []
    pools = as_nulls(pools, family)
    nulls = first_rounds(pools, rng, path, k, a.rounds, False)
    by_base = {
        str(p["base_seed"]): rate(sum(x := first_rounds([p], rng, path, k, a.rounds // 3, False)), len(x))
        for p in pools
    }
    boot = [boot_rate(pools, rng, path, k, a.boot_rounds) for _ in range(a.boot)]
    null_runs = [run(pools, rng, path, k, False, ROUNDS_PER_RUN) for _ in range(a.runs)]
    return {
        "domain": domain,
        "path": path,
        "K": k,
        "null": f"{family} harness",
        "error_control": "run",
        "false_promotion_rate": rate(sum(nulls), len(nulls)),
        "false_promotion_rate_pool_ci95": [round(float(q), 4) for q in np.quantile(boot, [0.025, 0.975])],
        "false_promotion_rate_by_base": by_base,
        "per_run_false_promotion_rate": rate(sum(any(r) for r in null_runs), len(null_runs)),
        "nominal": round(gate.round_alpha(ALPHA, 1, []), 5),
        "nominal_run": ALPHA,
        # The mode a new run may use: `sign` is measured to show why it is refused (start.check_gate).
        "gate_mode": "refused for new runs" if path == "sign" else "in use",
        "power": rate(sum(power), len(power)) if power else None,
        "counts": {
            "null_first_rounds": len(nulls),
            "null_runs": len(null_runs),
            "rounds_per_run": ROUNDS_PER_RUN,
            "fix_first_rounds": len(power),
            "bootstrap": f"{a.boot} resampled pools x {a.boot_rounds} first rounds",
            "bases": len(pools),
            "null_arms_per_base": len(pools[0]["nulls"]),
        },
    }


def describe(pool: dict) -> dict:
    """What a pool measured: its A-A pairs' dispersion (mean (w - l)^2 / discordant over every pair of null
    arms, 1 at the binomial floor; the gate's prior is centred at gate.PRIOR_PHI) and the fix's effect."""
    acc = [np.mean(list(a["final"].values())) for a in pool["nulls"]]
    fix = [np.mean(list(a["final"].values())) for a in pool["fixes"]]
    pairs = [Pair.of(x["final"], y["final"]) for x, y in itertools.combinations(pool["nulls"], 2)]
    phi = np.mean(dispersions(pairs))
    return {
        "domain": pool["domain"],
        "base_seed": pool["base_seed"],
        "start_accuracy": round(float(np.mean(list(pool["start"].values()))), 4),
        "null_accuracy": [round(float(x), 4) for x in acc],
        "fix_accuracy": [round(float(x), 4) for x in fix],
        "fix_effect": round(float(np.mean(fix) - np.mean(acc)), 4),
        "phi_aa": round(float(phi), 3),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gate_calibration", description=__doc__.split("\n\n")[0])
    ap.add_argument("--domains", nargs="+", default=list(DOMAINS), choices=list(DOMAINS))
    ap.add_argument("--bases", type=int, nargs="+", default=list(BASE_SEEDS), help="base seeds per domain")
    ap.add_argument("--nulls", type=int, default=12, help="null arms per base")
    ap.add_argument("--fixes", type=int, default=10, help="fix arms per base (also the second null family)")
    ap.add_argument("--ks", type=int, nargs="+", default=list(KS))
    ap.add_argument("--paths", nargs="+", default=list(PATHS), choices=PATHS)
    ap.add_argument("--rounds", type=int, default=2000, help="null first rounds per row")
    ap.add_argument("--runs", type=int, default=500, help="null runs per row")
    ap.add_argument("--power-rounds", type=int, default=500)
    ap.add_argument("--boot", type=int, default=40, help="bootstrap pools per row")
    ap.add_argument("--boot-rounds", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", type=Path, default=scratch("evotrainer-gate-pools"), help="the arms (cells)")
    ap.add_argument("--out", type=Path, default=RESULTS / "gate_calibration.json")
    a = ap.parse_args(argv)
    # A round draws up to K + 4 distinct arms of one family (control, K candidates, the finalist's replicate, the
    # control replicate, and another null standing in for the start): said before any arm trains.
    need = max(a.ks) + 4
    if min(a.ks) < 1 or a.nulls < need or a.fixes < need:
        ap.error(
            f"--ks {a.ks} needs K >= 1 and at least K + 4 = {need} arms a base in --nulls ({a.nulls}) and "
            f"--fixes ({a.fixes}): raise them, or race fewer candidates"
        )
    pools = build_all(a.work, a.domains, a.bases, a.nulls, a.fixes)
    rows = []
    for domain in a.domains:
        mine = [p for p in pools if p["domain"] == domain]
        for family, path, k in itertools.product(NULLS, a.paths, a.ks):
            rows.append(cell(domain, mine, path, k, family, a))
            print(_line(rows[-1]), flush=True)
    described = [describe(p) for p in pools]
    configs = [str(DOMAINS[d][0]) for d in a.domains]
    out = write_result(a.out, rows, work=a.work, indent=1, configs=configs, note=f"seed {a.seed}")
    write_result(a.out.with_name("gate_pools.json"), described, work=a.work, indent=1, configs=configs)
    print(
        markdown_table(
            ["domain", "null", "path", "K", "per round (nominal 0.0125)", "pool interval", "per run (0.05)", "power"],
            [
                [
                    r["domain"],
                    r["null"],
                    r["path"],
                    r["K"],
                    _fmt(r["false_promotion_rate"]),
                    r["false_promotion_rate_pool_ci95"],
                    _fmt(r["per_run_false_promotion_rate"]),
                    _fmt(r["power"]),
                ]
                for r in rows
            ],
        )
    )
    print(
        markdown_table(
            ["domain", "base", "start", "null mean", "fix effect", "phi (A-A)"],
            [
                [
                    d["domain"],
                    d["base_seed"],
                    d["start_accuracy"],
                    round(float(np.mean(d["null_accuracy"])), 3),
                    d["fix_effect"],
                    d["phi_aa"],
                ]
                for d in described
            ],
        )
    )
    print(f"wrote {out}")


def _line(r: dict) -> str:
    return (
        f"{r['domain']} {r['null']} {r['path']} K={r['K']}: round {_fmt(r['false_promotion_rate'])} "
        f"run {_fmt(r['per_run_false_promotion_rate'])} power {_fmt(r['power'])}"
    )


def _fmt(r: dict | None) -> str:
    if r is None:
        return "-"
    return f"{r['rate']:.3f} [{r['ci95'][0]:.3f}, {r['ci95'][1]:.3f}]"


if __name__ == "__main__":
    main()
