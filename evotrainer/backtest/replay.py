"""The replay backtest: re-scores retained rollouts under a candidate harness, without training, and
reports what would change: advantage signs, informative groups, reward-audit agreement, and the
weight that flagged rollouts carry. It runs the same vectorized code that training runs."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pyarrow as pa

from evotrainer.harness.filters import std_cuts, trainable
from evotrainer.harness.harness import Harness
from evotrainer.harness.interventions import Intervention
from evotrainer.harness.rewards import total_reward
from evotrainer.store.rollouts import RolloutStore
from evotrainer.training.grpo import ZERO_STD, advantages


class NotReplayable(ValueError):
    """The intervention changes sampling or optimization; only a trial can evaluate it."""


@dataclass
class Columns:
    """Retained rollouts as arrays: what replay needs, nothing more (no text)."""

    ids: np.ndarray
    group: np.ndarray  # integer codes
    terms: dict[str, np.ndarray]
    completion_tokens: np.ndarray
    max_action_tokens: np.ndarray
    termination: np.ndarray
    audit: np.ndarray  # float: 1 pass, 0 fail, NaN not audited
    reward: np.ndarray  # as recorded under the harness that trained on it
    step: np.ndarray

    def __len__(self) -> int:
        return len(self.ids)


def load_columns(store: RolloutStore, terms: list[str], where: str = "split = 'train'") -> Columns:
    """One DuckDB scan of the shards, straight into Arrow: reward terms become columns."""
    cols = ", ".join(f"rewards['{t}'] AS \"t_{t}\"" for t in terms)
    con = store.connect()
    try:
        table: pa.Table = con.sql(
            f"SELECT id, group_id, step, completion_tokens, max_action_tokens, termination, audit, "
            f"reward{', ' + cols if cols else ''} "
            f"FROM rollouts WHERE {where}"
        ).to_arrow_table()
    finally:
        con.close()
    _, group = np.unique(table.column("group_id").to_numpy(zero_copy_only=False), return_inverse=True)
    audit = table.column("audit").to_numpy(zero_copy_only=False)
    return Columns(
        ids=table.column("id").to_numpy(zero_copy_only=False),
        group=group,
        terms={
            t: np.nan_to_num(table.column(f"t_{t}").to_numpy(zero_copy_only=False).astype(np.float64)) for t in terms
        },
        completion_tokens=table.column("completion_tokens").to_numpy(zero_copy_only=False).astype(np.float64),
        max_action_tokens=table.column("max_action_tokens").to_numpy(zero_copy_only=False).astype(np.float64),
        termination=table.column("termination").to_numpy(zero_copy_only=False).astype(str),
        audit=np.array([np.nan if a is None else float(a) for a in audit], dtype=np.float64),
        reward=table.column("reward").to_numpy(zero_copy_only=False).astype(np.float64),
        step=table.column("step").to_numpy(zero_copy_only=False).astype(np.int64),
    )


@dataclass
class Scored:
    total: np.ndarray
    adv: np.ndarray
    keep: np.ndarray
    group_std: np.ndarray


def rescore(h: Harness, c: Columns) -> Scored:
    total = total_reward(h, c.terms, c.completion_tokens, c.max_action_tokens, c.termination)
    adv, std = advantages(total, c.group, h.loss.advantage_estimator, h.loss.scale_rewards)
    keep = trainable(h, c.termination, std, std_cuts(h, std, c.group, c.step)[0])
    return Scored(total, np.where(keep, adv, 0.0), keep, std)


# A rollout whose total is within this share of its rewards' scale of its group's mean is a tie: a mean of
# float rewards (0.1 + 0.2 ...) lands a few ulps off a member's value, and which side of it a member falls
# then depends on the order the CPU's kernels summed in, not on the harness.
TIE = 1e-9
# A shift of advantage weight below this is float noise (sums of a few thousand shares), not a reweighting.
WEIGHT_SHIFT = 1e-6


def advantage_side(s: Scored, group: np.ndarray) -> np.ndarray:
    """Each rollout's advantage sign (-1, 0, +1): its total's side of the group mean, a tie within TIE of the
    rewards' scale counted as 0, and 0 where the harness leaves it out. Every estimator and scaling keeps this
    sign (rloo's baseline is n / (n - 1) times the deviation), so it is the sign the update sees."""
    mean = np.bincount(group, weights=s.total) / np.maximum(np.bincount(group), 1)
    dev = s.total - mean[group]
    scale = max(1.0, float(np.abs(s.total).max())) if len(s.total) else 1.0
    return np.where((np.abs(dev) <= TIE * scale) | (s.adv == 0), 0.0, np.sign(dev))


def auc(score: np.ndarray, label: np.ndarray) -> float:
    """Probability that a random audit-passing rollout outscores a failing one (ties count half):
    the Mann-Whitney U statistic from average ranks. NaN without both classes."""
    pos, neg = label.sum(), len(label) - label.sum()
    if pos == 0 or neg == 0:
        return float("nan")
    order = np.argsort(score, kind="mergesort")
    ranks = np.empty(len(score), dtype=np.float64)
    sorted_scores = score[order]
    # Average rank within ties.
    uniq, first, counts = np.unique(sorted_scores, return_index=True, return_counts=True)
    avg = first + (counts + 1) / 2.0
    ranks[order] = np.repeat(avg, counts)
    return float((ranks[label.astype(bool)].sum() - pos * (pos + 1) / 2) / (pos * neg))


@dataclass
class ReplayReport:
    intervention: str
    rollouts: int
    groups: int
    frac_advantage_sign_flipped: float
    informative_groups_before: int
    informative_groups_after: int
    effective_samples_before: int
    effective_samples_after: int
    audited: int
    reward_audit_auc_before: float
    reward_audit_auc_after: float
    flagged: int
    flagged_weight_before: float
    flagged_weight_after: float
    recorded_reward_mismatch: float
    seconds: float
    # How far the advantage weight moves between rollouts: half the L1 distance between each rollout's share of the
    # batch's total |advantage|, before and after. A scaling change (scale_rewards) flips no sign and drops no
    # rollout, but reweights groups by how spread their rewards are; without this the replay dropped it as a no-op.
    # 0.0 in records written before it.
    advantage_weight_shift: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def has_effect(self) -> bool:
        return (
            self.frac_advantage_sign_flipped > 0
            or self.effective_samples_after != self.effective_samples_before
            or self.flagged_weight_after != self.flagged_weight_before
            or self.advantage_weight_shift > WEIGHT_SHIFT
        )


def replay(
    old: Harness, intervention: Intervention, c: Columns, flagged: set[str] | np.ndarray | None = None
) -> ReplayReport:
    """Compare the harness that produced the rollouts with the candidate on the same rollouts.
    `flagged`: ids that findings cite (or a boolean mask); their share of the advantage weight is reported."""
    import time

    if not intervention.replayable:
        raise NotReplayable(
            f"{intervention.target} changes what is sampled or how weights move; it needs a trial, not a replay "
            "(replayable: reward weights, shaping, filters, masks, advantage estimator and scaling)"
        )
    t0 = time.perf_counter()
    new = intervention.apply(old)
    a, b = rescore(old, c), rescore(new, c)
    sa, sb = advantage_side(a, c.group), advantage_side(b, c.group)
    moved = (sa != 0) | (sb != 0)
    flip = float((sa[moved] != sb[moved]).mean()) if moved.any() else 0.0
    audited = ~np.isnan(c.audit)
    if flagged is None:
        fmask = np.zeros(len(c), dtype=bool)
    elif isinstance(flagged, np.ndarray) and flagged.dtype == bool:
        fmask = flagged
    else:
        fmask = np.isin(c.ids, np.array(sorted(flagged), dtype=object))

    def informative(s: Scored) -> tuple[int, int]:
        live = (s.group_std >= ZERO_STD) & s.keep
        return len(np.unique(c.group[live])), int(live.sum())

    def weight(s: Scored) -> float:
        total = np.abs(s.adv).sum()
        return float(np.abs(s.adv[fmask]).sum() / total) if total > 0 else 0.0

    (ga, ea), (gb, eb) = informative(a), informative(b)
    return ReplayReport(
        intervention=intervention.describe(),
        rollouts=len(c),
        groups=int(c.group.max() + 1) if len(c) else 0,
        frac_advantage_sign_flipped=flip,
        informative_groups_before=ga,
        informative_groups_after=gb,
        effective_samples_before=ea,
        effective_samples_after=eb,
        audited=int(audited.sum()),
        reward_audit_auc_before=auc(a.total[audited], c.audit[audited]),
        reward_audit_auc_after=auc(b.total[audited], c.audit[audited]),
        flagged=int(fmask.sum()),
        flagged_weight_before=weight(a),
        flagged_weight_after=weight(b),
        recorded_reward_mismatch=float(np.abs(a.total - c.reward).max()) if len(c) else 0.0,
        seconds=time.perf_counter() - t0,
        advantage_weight_shift=_weight_shift(a.adv, b.adv),
    )


def _weight_shift(a: np.ndarray, b: np.ndarray) -> float:
    """Half the L1 distance between the two advantage-weight distributions (each rollout's |advantage| over the
    total); 0 where either trains nothing (the informative counts say that change)."""
    ta, tb = np.abs(a).sum(), np.abs(b).sum()
    if ta == 0 or tb == 0:
        return 0.0
    return float(0.5 * np.abs(np.abs(a) / ta - np.abs(b) / tb).sum())
