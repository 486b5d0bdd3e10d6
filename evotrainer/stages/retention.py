"""Checkpoint retention (run.keep_checkpoints): once a round's decision is committed in the ledger, the
weights and optimizer state of the branches no later stage or resume can fork from are deleted.

`lineage` keeps the mainline's lineage (the base, every segment and head it passed through): their weights,
and the optimizer state of the current head and of the mainline's best read (nothing else forks from an earlier
one again: a rollback returns to the head the round started from, which is the current head until the round is
decided, or the guard's to that best read); `heads` keeps only the base (the KL reference of every arm), the
current head and that best read; `all` deletes nothing. A round not yet
decided is never touched (its start, segment and arms are still needed), and a pruned arm keeps its small
files (arm.json, pass_rates.json, config, tokenizer), so the ledger, the report and a resume read it as before.

Crash safety: prune runs after the round's last ledger commit and is idempotent. What it is about to delete is
recorded (ledger meta `pruned_checkpoints`, branch -> bytes) before any file goes, so a prune killed half way
is finished by the next one (a resume replays the decided rounds) without counting a byte twice."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from evotrainer.ids import branch_id
from evotrainer.stages.spend import lineage
from evotrainer.store.checkpoints import tree_bytes, weight_files
from evotrainer.store.ledger import Ledger

PRUNED = "pruned_checkpoints"
OPTIMIZER = "optimizer.pt"


def retained(ledger: Ledger, mode: str, head: str, peak: str | None = None) -> set[str] | None:
    """The branches whose checkpoints stay once the mainline is at `head` (None: all of them), with the mainline's
    best read so far (`peak`, Mainline.peak), which the guard stage may send it back to."""
    if mode == "all":
        return None
    if mode == "heads":
        return {branch_id(0, "base"), head} | ({peak} if peak else set())
    return lineage(ledger, head) | {branch_id(0, "base")} | ({peak} if peak else set())


def pruned(ledger: Ledger) -> dict[str, int]:
    """What pruning has deleted so far: bytes freed, by branch."""
    saved = ledger.get_meta(PRUNED)
    return json.loads(saved) if saved else {}


def prune(
    ledger: Ledger, run_dir: str | Path, mode: str, rnd: int, head: str, peak: str | None = None
) -> dict[str, int]:
    """Delete the weights and optimizer state of the branches of rounds up to `rnd` (decided, with the mainline
    at `head` and its best read at `peak`) that `mode` does not retain; returns the bytes freed now, by branch
    (empty when nothing was left to delete)."""
    keep = retained(ledger, mode, head, peak)
    if keep is None:
        return {}
    ckpts = Path(run_dir) / "checkpoints"
    gone = [b["id"] for b in ledger.branches() if b["round"] <= rnd and b["id"] not in keep]
    done = pruned(ledger)
    files = {b: weight_files(ckpts / b) for b in gone}
    for b in keep - {head, peak}:  # the lineage behind the head: weights stay, optimizer state goes (keyed apart)
        opt = ckpts / b / OPTIMIZER
        files[f"{b}/{OPTIMIZER}"] = [opt] if opt.is_file() else []
    new = {b: sum(f.stat().st_size for f in fs) for b, fs in files.items() if fs and b not in done}
    if new:  # recorded before anything is deleted: a prune killed half way is finished, not counted, next time
        ledger.set_meta(PRUNED, json.dumps({**done, **new}, sort_keys=True))
    for fs in files.values():
        for f in fs:
            f.unlink(missing_ok=True)
    return new


@dataclass(frozen=True)
class DiskUse:
    """A run directory's size on disk, its checkpoints' share, and what pruning freed."""

    run_bytes: int
    checkpoint_bytes: int
    pruned_bytes: int


def disk_use(ledger: Ledger, run_dir: str | Path) -> DiskUse:
    run_dir = Path(run_dir)
    return DiskUse(tree_bytes(run_dir), tree_bytes(run_dir / "checkpoints"), sum(pruned(ledger).values()))
