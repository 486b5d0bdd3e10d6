"""Intervals on a paired accuracy difference measured at several seeds: the two-level bootstrap (seeds, then
tasks within a seed) and the t interval on the per-seed differences, which with few seeds is the wider."""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
from pydantic import BaseModel
from scipy import stats

LEVEL = 0.95
TAILS = (0.025, 0.975)  # LEVEL's quantiles, written out: (1 - LEVEL) / 2 is 0.025 only to 16 digits


class SeedT(BaseModel):
    """The t interval on the per-seed differences (scipy.stats.t, df = seeds - 1): seeds as the only unit of
    replication. A two-level bootstrap over three seeds draws at most three distinct seed values and so
    understates how far a fourth seed could land; this does not."""

    ci_low: float | None
    ci_high: float | None
    """None with a single seed: no spread to measure."""
    df: int
    per_seed: list[float]


class PairedInterval(BaseModel):
    """Mean difference a - b over seeds (each seed's mean over its tasks, paired by task). `ci_low` and
    `ci_high` are the two-level bootstrap (the keys claims.json has always had); `seed_t` the t interval."""

    delta: float
    ci_low: float
    ci_high: float
    ci_method: str = "two_level_bootstrap"
    seed_t: SeedT


def paired_differences(a: list[dict[str, bool]], b: list[dict[str, bool]]) -> list[np.ndarray]:
    """Per seed, the per-task differences a - b on the tasks both read (outcomes by task id)."""
    diffs = []
    for oa, ob in zip(a, b, strict=True):
        ids = sorted(set(oa) & set(ob))
        diffs.append(np.array([float(oa[i]) - float(ob[i]) for i in ids]))
    return diffs


def two_level_bootstrap(diffs: list[np.ndarray], n_boot: int = 4000, seed: int = 0) -> tuple[float, float]:
    """95% interval of the mean difference: seeds resampled, then tasks within each seed."""
    rng = np.random.default_rng(seed)
    boot = np.empty(n_boot)
    for k in range(n_boot):
        picked = rng.integers(len(diffs), size=len(diffs))
        boot[k] = np.mean([diffs[j][rng.integers(len(diffs[j]), size=len(diffs[j]))].mean() for j in picked])
    return float(np.quantile(boot, TAILS[0])), float(np.quantile(boot, TAILS[1]))


def seed_t_interval(per_seed: list[float]) -> SeedT:
    """The t interval of the mean of the per-seed differences."""
    x, df = np.asarray(per_seed, dtype=float), len(per_seed) - 1
    if df < 1:
        return SeedT(ci_low=None, ci_high=None, df=df, per_seed=list(per_seed))
    sd = x.std(ddof=1)
    if sd == 0:  # every seed the same difference (scipy gives NaN): the interval is that point
        return SeedT(ci_low=float(x.mean()), ci_high=float(x.mean()), df=df, per_seed=[float(v) for v in x])
    low, high = stats.t.interval(LEVEL, df, loc=x.mean(), scale=sd / np.sqrt(len(x)))
    return SeedT(ci_low=float(low), ci_high=float(high), df=df, per_seed=[float(v) for v in x])


def paired_interval(a: list[dict[str, bool]], b: list[dict[str, bool]]) -> PairedInterval:
    """Both intervals of the mean accuracy difference a - b over seeds (outcomes by task id, one dict a seed)."""
    diffs = paired_differences(a, b)
    low, high = two_level_bootstrap(diffs)
    per_seed = [float(d.mean()) for d in diffs]
    return PairedInterval(
        delta=float(np.mean([d.mean() for d in diffs])), ci_low=low, ci_high=high, seed_t=seed_t_interval(per_seed)
    )


Verdict = Literal["above", "at_or_above", "below", "not_shown"]


def read_margin(accuracy: float, tasks: int) -> float:
    """One standard error of one read of `tasks` tasks at `accuracy`: a loss smaller than this cannot be seen by a
    user who reads the benchmark once, so it is the margin within which an arm counts as at another (the
    non-inferiority margin of the claim "at or above the reference", HISTORY.md, "Is the loop at the reference?")."""
    return math.sqrt(accuracy * (1.0 - accuracy) / tasks)


def verdict(t: SeedT, margin: float) -> Verdict:
    """What the seed-level interval of a - b shows against a margin: above b (its low end over 0), at or above b
    (over -margin), below b (its high end under -margin), or neither. One seed shows nothing."""
    if t.ci_low is None or t.ci_high is None:
        return "not_shown"
    if t.ci_low > 0:
        return "above"
    if t.ci_low > -margin:
        return "at_or_above"
    return "below" if t.ci_high < -margin else "not_shown"
