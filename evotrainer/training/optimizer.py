"""The policy's optimizer as both trainers (grpo.py, trl_backend.py) make, save and load it: AdamW over the
trainable parameters, its state saved beside the weights as optimizer.pt, so an arm forks from a checkpoint
written under either backend."""

from __future__ import annotations

import io
from pathlib import Path

import torch

from evotrainer.harness.harness import Optimizer
from evotrainer.policies.hf import HFPolicy

OPTIMIZER_FILE = "optimizer.pt"


def make_optimizer(policy: HFPolicy, o: Optimizer) -> torch.optim.AdamW:
    """AdamW over the policy's trainable parameters at the harness's base rate and weight decay."""
    params = [p for p in policy.model.parameters() if p.requires_grad]
    return torch.optim.AdamW(params, lr=o.learning_rate, betas=(0.9, 0.99), weight_decay=o.weight_decay)


def save_checkpoint(policy: HFPolicy, optimizer: torch.optim.Optimizer, path: str | Path) -> None:
    """Policy checkpoint plus optimizer state, swapped in together and on disk when this returns (a ledger row
    may point at it next; a fork copies both)."""
    buf = io.BytesIO()
    torch.save(optimizer.state_dict(), buf)
    policy.save(path, extra_files={OPTIMIZER_FILE: buf.getvalue()})


def load_optimizer_state(optimizer: torch.optim.Optimizer, path: str | Path) -> None:
    """The optimizer state saved with the checkpoint at `path`, if it has one (a base model has none). It
    restores the saved param-group settings too: the caller sets the harness's back."""
    f = Path(path) / OPTIMIZER_FILE
    if f.exists():
        optimizer.load_state_dict(torch.load(f, weights_only=True))
