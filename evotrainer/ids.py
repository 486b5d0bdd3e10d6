"""Every id a run writes, built here and parsed here: branches, trials, store files, rollouts and their groups."""

from __future__ import annotations

import re
from typing import NamedTuple

# branch_id and trial_id are defined in types.py, whose source is part of the evaluator's identity
# (evaluation.evaluator_identity hashes it for Task): moving them would make every existing run refuse a
# plain `evotrainer resume`. They are named here with the rest, and callers take them from here.
from evotrainer.types import branch_id as _branch_id
from evotrainer.types import trial_id

__all__ = [
    "DIAGNOSIS",
    "EVAL",
    "GATE",
    "REVISION",
    "TRAIN",
    "Shard",
    "branch_id",
    "final_branch",
    "group_id",
    "parse_shard",
    "rollout_id",
    "shard_id",
    "trial_id",
    "window_id",
]

TRAIN, EVAL = "s", "e"
"""Kinds of rollout: a training step's (`r01-seg-s000003-0007`) or a held-out evaluation's (`r01-c1-e000007-0012`)."""
DIAGNOSIS, REVISION, GATE = "d", "v", "g"
"""Kinds of findings file: the diagnose stage's, the revised suite's new findings, the gate's over an arm's window."""


def branch_id(rnd: int, role: str, k: int = 0) -> str:
    """types.branch_id's scheme (`r01-seg`, `r01-ctl`, `r01-c2`, `r01-c2r`, `r01-ctlr`...), and `r01-c2r2`: the
    finalist's third run, on seeds of its own, where a control run carries an exploit (race._second_replicate_due).
    Named here: a change to types.py's source is a change of the evaluator's identity."""
    if role == "second_replicate":
        return _branch_id(rnd, "replicate", k) + "2"
    return _branch_id(rnd, role, k)


def final_branch(head: str) -> str:
    """The branch the final read's rollouts are stored under, named by the mainline branch it read."""
    return f"final-{head}"


def guard_branch(head: str) -> str:
    """The branch the guard stage's read of a head on the gate tasks is stored under (stages/guard.py)."""
    return f"guard-{head}"


def shard_id(branch: str, step: int, kind: str = TRAIN) -> str:
    """A store file of one branch and step, `<branch>-<kind><step:06d>`: the rollouts and metrics of a training
    step (TRAIN) or of an evaluation (EVAL, which evaluation.record_eval spells out itself: that module is part of
    the evaluator's identity); the findings of a diagnosis (DIAGNOSIS, REVISION, GATE; `step` is the window's
    last)."""
    return f"{branch}-{kind}{step:06d}"


def rollout_id(branch: str, step: int, i: int, kind: str = TRAIN) -> str:
    """The i-th rollout of a step, or of an evaluation (where i is the task's place in the list evaluated)."""
    return f"{shard_id(branch, step, kind)}-{i:04d}"


def group_id(branch: str, step: int, g: int, kind: str = TRAIN) -> str:
    """The g-th group of a step: the rollouts of one prompt."""
    return f"{shard_id(branch, step, kind)}-g{g:03d}"


def window_id(branch: str, first: int, last: int, suite_version: str) -> str:
    """The findings file of `evotrainer diagnose` over one window under one suite version."""
    return f"{branch}-{first:06d}-{last:06d}-{suite_version}"


class Shard(NamedTuple):
    """shard_id's arguments, in its order."""

    branch: str
    step: int
    kind: str


_SHARD = re.compile(r"^(?P<branch>.+)-(?P<kind>[a-z])(?P<step>\d{6,})$")


def parse_shard(name: str) -> Shard | None:
    """shard_id's parts back from a file's stem; None for a name that is not one."""
    m = _SHARD.match(name)
    return Shard(m["branch"], int(m["step"]), m["kind"]) if m else None
