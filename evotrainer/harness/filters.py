"""Filters and masks: which rollouts the loss sees under a harness (vectorized; shared by training
and the replay backtest)."""

from __future__ import annotations

import numpy as np

from evotrainer.harness.harness import Harness


def trainable(h: Harness, termination: np.ndarray, group_std: np.ndarray) -> np.ndarray:
    """True where the rollout enters the loss. Masked rollouts still count in the loss denominators
    and in every metric, so masking never hides a rollout from the diagnostics."""
    ok = np.ones(len(termination), dtype=bool)
    if h.loss.mask_truncated_completions:
        ok &= termination != "length"
    if h.multi_turn.tool_error == "mask":
        ok &= termination != "tool_error"
    if h.filters.mask_terminations:
        ok &= ~np.isin(termination, list(h.filters.mask_terminations))
    if h.filters.zero_std_threshold is not None:
        ok &= group_std >= h.filters.zero_std_threshold
    return ok
