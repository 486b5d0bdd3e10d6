"""Filters and masks: which rollouts the loss sees under a harness (vectorized; shared by training
and the replay backtest)."""

from __future__ import annotations

import numpy as np

from evotrainer.harness.harness import Harness

# The std filter never keeps a group below this spread, whatever its threshold (the paper's minimum std).
MIN_STD = 1e-6


def std_cuts(
    h: Harness, group_std: np.ndarray, group: np.ndarray, step: np.ndarray, previous: float | None = None
) -> tuple[np.ndarray | None, float | None]:
    """The std filter's threshold for each rollout, and the threshold after the last step (the state the
    next step starts from); (None, None) when `filters.std_keep_ratio` is off. Per step, in step order: the
    threshold moves from `previous` toward the std under which the lowest (1 - keep ratio) of that step's
    groups fall, by `std_ema_decay` (the first step starts at that quantile). An EMA, so one step of
    unusually spread groups does not cut the next step's ordinary ones."""
    f = h.filters
    if f.std_keep_ratio is None or not len(group_std):
        return None, None
    cut = np.empty(len(group_std), dtype=np.float64)
    ema = previous
    for s in np.unique(step):
        rows = step == s
        _, first = np.unique(group[rows], return_index=True)
        q = float(np.quantile(group_std[rows][first], 1.0 - f.std_keep_ratio))
        ema = q if ema is None else f.std_ema_decay * ema + (1.0 - f.std_ema_decay) * q
        cut[rows] = max(ema, MIN_STD)
    return cut, ema


def trainable(
    h: Harness, termination: np.ndarray, group_std: np.ndarray, std_cut: np.ndarray | None = None
) -> np.ndarray:
    """True where the rollout enters the loss. Masked rollouts still count in the loss denominators
    and in every metric, so masking never hides a rollout from the diagnostics. `std_cut`: the std
    filter's threshold per rollout (std_cuts), None when it is off."""
    ok = np.ones(len(termination), dtype=bool)
    if h.loss.mask_truncated_completions:
        ok &= termination != "length"
    if h.multi_turn.tool_error == "mask":
        ok &= termination != "tool_error"
    if h.filters.mask_terminations:
        ok &= ~np.isin(termination, list(h.filters.mask_terminations))
    if h.filters.zero_std_threshold is not None:
        ok &= group_std >= h.filters.zero_std_threshold
    if std_cut is not None:
        ok &= group_std >= std_cut
    return ok
