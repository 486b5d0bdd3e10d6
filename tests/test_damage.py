"""Damaged files a resumed run finds: a truncated checkpoint weight or optimizer file and a truncated rollout
shard are detected and named; one of unfinished work is set aside and its arm's done mark removed (the arm
is redone), one of a committed branch stops the run. Real files written by the real writers; the whole
loop's version of this is benchmarks/soak.py (corrupt_shard, corrupt_checkpoint)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from evotrainer.harness.harness import Harness
from evotrainer.policies.hf import HFPolicy
from evotrainer.policies.tiny import build_model, build_tokenizer
from evotrainer.store.checkpoints import damaged
from evotrainer.store.damage import DamagedFile, mend
from evotrainer.store.ledger import Ledger
from evotrainer.store.rollouts import RolloutStore
from evotrainer.training.grpo import GRPOTrainer


def _half(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 2)


def _run(tmp: Path, committed: list[str]) -> tuple[Path, Ledger, RolloutStore]:
    """A run directory with checkpoints base and r01-ctl (each with an arm result), a metrics shard of
    each, and a ledger in which `committed` branches are recorded."""
    tok = build_tokenizer(["12 + 34 = <answer>46</answer>"] * 20, 200)
    trainer = GRPOTrainer(HFPolicy(build_model(tok, 32, 1, 2, 64, seed=0), tok), Harness())
    store = RolloutStore(tmp / "store")
    for branch in ("base", "r01-ctl"):
        trainer.save(tmp / "checkpoints" / branch)
        (tmp / "checkpoints" / branch / "arm.json").write_text("{}")
        store.append_metrics("t", branch, 1, {"reward": 0.5}, f"{branch}-s000001")
    ledger = Ledger(tmp / "ledger.sqlite")
    record = {"parent": None, "round": 0, "kind": "base", "harness_version": "h", "suite_version": "s"}
    record |= {"first_step": 0, "last_step": 0, "seed": 0, "heldout_accuracy": None}
    branches = [{**record, "id": b, "checkpoint": str(tmp / "checkpoints" / b)} for b in committed]
    ledger.finish_stage(0, "start", {}, branches=branches)
    return tmp, ledger, store


@pytest.mark.parametrize("victim", ["model.safetensors", "optimizer.pt"])
def test_a_truncated_checkpoint_file_is_named_by_check_and_by_load(tmp_path, victim):
    run, _, _ = _run(tmp_path, ["base"])
    ckpt = run / "checkpoints" / "r01-ctl"
    assert damaged(ckpt) == []
    _half(ckpt / victim)
    [(path, why)] = damaged(ckpt)
    assert path == ckpt / victim and "truncated" in why
    if victim == "model.safetensors":  # the loader names the file instead of failing inside safetensors
        with pytest.raises(DamagedFile, match="model.safetensors"):
            HFPolicy.load(ckpt)


def test_damaged_files_of_unfinished_work_are_set_aside_and_their_arm_redone(tmp_path):
    run, ledger, store = _run(tmp_path, ["base"])
    _half(run / "checkpoints" / "r01-ctl" / "model.safetensors")
    _half(run / "store" / "metrics" / "r01-ctl-s000001.parquet")
    notes = mend(run, ledger, store, "arm.json")
    assert len(notes) == 2 and all("r01-ctl" in n and "set aside" in n for n in notes)
    assert not (run / "checkpoints" / "r01-ctl" / "arm.json").exists()  # the arm is redone
    assert (run / "checkpoints" / "base" / "arm.json").exists()
    assert store.unreadable() == [] and damaged(run / "checkpoints" / "r01-ctl") == []
    assert store.metrics("base") == {1: {"reward": 0.5}}  # the store reads again


@pytest.mark.parametrize("victim", ["checkpoints/r01-ctl/model.safetensors", "store/metrics/r01-ctl-s000001.parquet"])
def test_a_damaged_file_of_a_committed_branch_stops_the_run_naming_it(tmp_path, victim):
    run, ledger, store = _run(tmp_path, ["base", "r01-ctl"])
    _half(run / victim)
    with pytest.raises(DamagedFile, match=f"{run / victim}.*committed"):
        mend(run, ledger, store, "arm.json")
    assert (run / victim).exists() and (run / "checkpoints" / "r01-ctl" / "arm.json").exists()  # nothing touched
