"""Damaged files a resumed run finds: rollout shards and checkpoint weights that no longer read whole.
Every writer here is atomic, so a kill never leaves one; a disk fault, a full disk on another tool's write or
a hand can. A damaged file of unfinished work is set aside and its arm redone; one that committed records
depend on stops the run, named, since a committed stage is never redone."""

from __future__ import annotations

from pathlib import Path

from evotrainer.errors import UserError
from evotrainer.ids import parse_shard
from evotrainer.store.checkpoints import damaged
from evotrainer.store.ledger import Ledger
from evotrainer.store.rollouts import RolloutStore


class DamagedFile(UserError):
    """A file the run's committed records depend on does not read whole; the message names it."""


def mend(run_dir: Path, ledger: Ledger, store: RolloutStore, arm_result: str) -> list[str]:
    """Check the store's shards and the checkpoints' weights before a resumed run goes on. A damaged file of
    a branch no stage has committed is set aside (renamed hidden) and that branch's arm result (`arm_result`,
    its done mark) removed, so the unfinished stage redoes the arm; returns what was done, one line each.
    Raises DamagedFile for a damaged file of a committed branch."""
    committed = {b["id"] for b in ledger.branches()}
    notes = []
    for path, why in store.unreadable():
        branch = shard.branch if (shard := parse_shard(path.stem)) else None
        if branch is None or branch in committed:
            raise DamagedFile(
                f"{path}: {why}. It holds records of {f'branch {branch}' if branch else 'the run'}, which a "
                "committed stage depends on, and a committed stage is never redone: restore the file from a "
                "backup, or start the run again"
            )
        notes.append(f"{path}: {why}; set aside as {_set_aside(path).name}, and {branch}'s arm is redone")
        (run_dir / "checkpoints" / branch / arm_result).unlink(missing_ok=True)
    ckpts = run_dir / "checkpoints"
    # A save's temporary and set-aside directories (`<branch>.tmp`, `.old`) are no checkpoint: save clears them.
    for ckpt in sorted(p for p in ckpts.iterdir() if p.is_dir() and "." not in p.name) if ckpts.is_dir() else []:
        for path, why in damaged(ckpt):
            if ckpt.name in committed:
                raise DamagedFile(
                    f"{path}: {why}. Branch {ckpt.name} is committed and its stage is never redone: restore "
                    "the file from a backup, or start the run again"
                )
            notes.append(f"{path}: {why}; set aside as {_set_aside(path).name}, and {ckpt.name}'s arm is redone")
            (ckpt / arm_result).unlink(missing_ok=True)
    return notes


def _set_aside(path: Path) -> Path:
    """Out of every reader's way (no longer *.parquet or a weight file), kept for whoever looks into it."""
    aside = path.with_name(f".{path.name}.damaged")
    path.replace(aside)
    return aside
