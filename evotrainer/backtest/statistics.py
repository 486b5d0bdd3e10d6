"""The gate's statistics on binary outcomes (one pass / fail per gate task and arm), pure functions.

Each arm is one training run, so a difference between two arms mixes two noises: which tasks flip
between runs (binomial, what a sign test over the discordant tasks measures) and how much one run
as a whole lands above another (seed-to-seed overdispersion, which a sign test does not see: on
benchmarks/gate_calibration.py's null arms it made a plain sign test promote 13% of null candidates
at a nominal 5%). The noise model here is quasi-binomial: the variance of (wins - losses) is
phi * discordant, with phi >= 1 measured on pairs of runs of one harness on other seeds (A-A pairs),
and the p-value is never below the exact sign test's."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats


def paired(a: dict[str, bool], b: dict[str, bool]) -> tuple[list[str], np.ndarray, np.ndarray]:
    ids = sorted(set(a) & set(b))
    return ids, np.array([a[i] for i in ids], dtype=float), np.array([b[i] for i in ids], dtype=float)


@dataclass(frozen=True)
class Pair:
    """Two arms on the same gate tasks: tasks the first passes and the second fails (wins), the
    reverse (losses), and how many tasks there are."""

    wins: int
    losses: int
    n: int

    @classmethod
    def of(cls, a: dict[str, bool], b: dict[str, bool]) -> Pair:
        _, x, y = paired(a, b)
        return cls(int(((x == 1) & (y == 0)).sum()), int(((x == 0) & (y == 1)).sum()), len(x))

    @property
    def discordant(self) -> int:
        return self.wins + self.losses

    @property
    def delta(self) -> float:
        """Accuracy difference, first minus second."""
        return (self.wins - self.losses) / self.n if self.n else 0.0


def sign_p(wins: int, losses: int) -> float:
    """Exact one-sided sign test (McNemar's exact form): P(at least `wins` of the discordant tasks go
    the first arm's way) when each is a fair coin. Exact where a bootstrap is permissive: a 4-0 split
    gives 0.0625."""
    m = wins + losses
    return float(stats.binom.sf(wins - 1, m, 0.5)) if m else 1.0


def bootstrap(cand: np.ndarray, ctrl: np.ndarray, level: float, resamples: int, seed: int) -> dict[str, float]:
    """Paired bootstrap over tasks of mean(cand - ctrl): the mean, a one-sided lower bound at `level` and
    the two-sided interval (kept for reports and the old `statistic: bootstrap`; tasks only, no seeds)."""
    d = cand - ctrl
    rng = np.random.default_rng(seed)
    means = d[rng.integers(0, len(d), size=(resamples, len(d)))].mean(axis=1) if len(d) else np.zeros(1)
    return {
        "delta": float(d.mean()) if len(d) else 0.0,
        "lower": float(np.quantile(means, 1 - level)),
        "ci_low": float(np.quantile(means, (1 - level) / 2)),
        "ci_high": float(np.quantile(means, 1 - (1 - level) / 2)),
        "n": int(len(d)),
    }


@dataclass(frozen=True)
class Noise:
    """The run's noise model: the overdispersion phi of A-A pairs (>= 1) and how many pairs measured it.
    `dof` is the reference t-distribution's degrees of freedom: few pairs give a noisy phi, and a t
    with few degrees of freedom widens the test accordingly."""

    phi: float
    pairs: int
    dof: float

    @property
    def valid(self) -> bool:
        return self.pairs > 0


def dispersions(pairs: list[Pair]) -> list[float]:
    """Each informative A-A pair's plug-in phi, (wins - losses)^2 / discordant (1 in expectation at the binomial
    floor); a pair with no discordant task carries none (0/0) and is left out."""
    return [(p.wins - p.losses) ** 2 / p.discordant for p in pairs if p.discordant]


def noise_of(pairs: list[Pair], prior_pairs: float, centre: float = 1.0) -> Noise:
    """phi, moderated: the mean over A-A pairs of (wins - losses)^2 / discordant, pooled with a prior of
    `prior_pairs` pseudo-pairs at phi = `centre`, and floored at 1 (the binomial floor). One pair's
    (w - l)^2 / m is phi times a chi-square with one degree of freedom: the plug-in estimate of a
    single pair is above 2.7 phi one time in ten, and on benchmarks/gate_calibration.py's arms those
    draws, not the evidence, were what kept the learning-rate fix from promotion in most rounds it
    missed. Pooling with a prior (the empirical-Bayes moderated variance of limma, Smyth 2004) makes
    the estimate and the t reference's degrees of freedom (prior plus measured pairs) agree about how
    much is known; as pairs accumulate the measured phi dominates. The prior's centre is the gate's
    (gate.PRIOR_PHI, measured on arms that are not the ones its error rates are scored on). A pair with
    no discordant task (two seeds that agreed on every task: a harness that leaves the policy where it is,
    under greedy decoding) carries no information on phi (0/0): it neither counts as a pair nor makes the
    estimate valid. A run whose control does not move the policy then tests its finalist under the
    finalist's own two runs (gate.finalist_noise)."""
    xs = dispersions(pairs)
    phi = max(1.0, (prior_pairs * centre + sum(xs)) / (prior_pairs + len(xs)))
    return Noise(phi, len(xs), prior_pairs + len(xs))


def p_value(pair: Pair, noise: Noise) -> float:
    """One-sided p of "the first arm is better" under the noise model, and never below the exact sign
    test's (which is exact when the discordant tasks are few)."""
    m = pair.discordant
    if not m:
        return 1.0
    z = (pair.wins - pair.losses) / math.sqrt(m * noise.phi)
    return max(sign_p(pair.wins, pair.losses), float(stats.t.sf(z, noise.dof)))


def combine(p1: float, p2: float, w2: float) -> float:
    """Weighted inverse-normal combination of two independent stages' one-sided p-values (weights fixed
    in advance, w1^2 + w2^2 = 1): the combined one-sided p."""
    w1 = math.sqrt(1.0 - w2 * w2)
    clip = lambda p: min(max(p, 1e-15), 1.0 - 1e-15)  # noqa: E731 -- a one-line guard for isf's domain
    z = w1 * stats.norm.isf(clip(p1)) + w2 * stats.norm.isf(clip(p2))
    return float(stats.norm.sf(z))
