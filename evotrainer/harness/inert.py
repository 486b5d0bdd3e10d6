"""Changes that cannot change training. A trial of one spends five arms to learn nothing: its candidate and control
train the same weights, and the race reads them level on every gate task (600k seed 5 raced the reference's
clip-higher so, and the README main job raced clip ranges three times). The screen (proposers/proposer.py) refuses
them, whoever proposed, and says which knob would make them act.

The clip ranges act only through the importance ratio between the policy being updated and the policy that sampled.
With one optimizer pass over each sampled batch (loss.num_iterations 1) both trainers take the policy that sampled
to be the update's own weights, detached (training/grpo.py; TRL's GRPOTrainer likewise, where a generation batch is
one step's, as the trl backend sets it), so the ratio is exactly 1: no token is clipped, and min(r * A, clip(r) * A)
has the same value and gradient for every clip range (tests/test_grpo.py checks the weights are bit-equal)."""

from __future__ import annotations

from evotrainer.harness.harness import Harness, Loss
from evotrainer.harness.interventions import knob_value

RATIO_ONLY = ("loss.epsilon", "loss.epsilon_high")
"""Knobs that act only through the importance ratio, hence only at loss.num_iterations above 1."""


def _acting(h: Harness) -> str:
    """h's canonical spec with every knob that cannot act under it set to its default."""
    if h.loss.num_iterations > 1:
        return h.canonical()
    default = Loss()
    loss = h.loss.model_copy(update={"epsilon": default.epsilon, "epsilon_high": default.epsilon_high})
    return h.model_copy(update={"loss": loss}).canonical()


def inert(old: Harness, new: Harness) -> str | None:
    """Why training under `new` cannot differ from training under `old` (which differs from it), or None where it
    can."""
    if new.canonical() == old.canonical() or _acting(new) != _acting(old):
        return None
    moved = [k for k in RATIO_ONLY if knob_value(old, k) != knob_value(new, k)]
    return (
        f"inert: {' and '.join(moved)} acts only through the importance ratio, which is exactly 1 with one optimizer "
        "pass over each batch (loss.num_iterations 1): no token is clipped, and candidate and control would train "
        "the same weights; raise loss.num_iterations first"
    )
