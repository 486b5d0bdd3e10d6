"""Durable checkpoints: a save killed or failing at any step leaves a whole checkpoint (model and optimizer
of one save) at its path, and every file and directory is fsynced before save returns."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
import torch

from evotrainer.harness.harness import Harness
from evotrainer.policies.hf import POLICY_FILE, HFPolicy
from evotrainer.policies.tiny import build_model, build_tokenizer
from evotrainer.training.grpo import GRPOTrainer


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory) -> Path:
    """A tiny untrained model saved the ordinary Hugging Face way (the base of the LoRA case)."""
    tok = build_tokenizer(["12 + 34 = <answer>46</answer>"] * 20, 200)
    policy = HFPolicy(build_model(tok, 32, 1, 2, 64, seed=0), tok)
    d = tmp_path_factory.mktemp("base") / "model"
    policy.save(d)
    return d


def trainer(base_dir: Path, lora: bool, lr: float) -> GRPOTrainer:
    """A trainer whose weights and optimizer state both say which save they came from (`lr`)."""
    policy = HFPolicy.load(base_dir, lora_rank=2 if lora else 0)
    with torch.no_grad():
        for p in policy.model.parameters():
            if p.requires_grad:
                p.fill_(lr)
    return GRPOTrainer(policy, Harness(optimizer={"learning_rate": lr}))


def saved_lr(path: Path) -> tuple[float, float]:
    """(the weights' marker, the optimizer's learning rate) of the checkpoint at `path`."""
    policy = HFPolicy.load(path)
    weight = next(p for p in policy.model.parameters() if p.requires_grad)
    opt = torch.load(path / "optimizer.pt", weights_only=True)
    return round(weight.flatten()[0].item(), 6), opt["param_groups"][0]["lr"]


class Crash:
    """Makes the k-th file-system change under `root` (rename, replace, rmtree) fail, and in `kill` mode
    every later one too: a process killed there runs no clean-up, so nothing after it happens."""

    def __init__(self, monkeypatch, root: Path, k: int, kill: bool):
        self.root, self.k, self.kill, self.calls = str(root), k, kill, 0
        for mod, name in ((os, "replace"), (os, "rename"), (shutil, "rmtree")):
            monkeypatch.setattr(mod, name, self.wrap(getattr(mod, name)))

    def wrap(self, real):
        def fake(*args, **kwargs):
            if any(str(a).startswith(self.root) for a in args[:2]):
                self.calls += 1
                if self.calls == self.k or (self.kill and self.calls > self.k):
                    raise OSError(f"simulated crash at file-system change {self.calls}")
            return real(*args, **kwargs)

        return fake


@pytest.mark.parametrize("lora", [False, True])
@pytest.mark.parametrize("kill", [False, True])
@pytest.mark.parametrize("k", range(1, 7))
def test_interrupted_save_leaves_a_whole_checkpoint(base_dir, tmp_path, monkeypatch, lora, kill, k):
    path = tmp_path / "checkpoints" / "main"
    trainer(base_dir, lora, 0.1).save(path)
    assert saved_lr(path) == (0.1, 0.1)
    new = trainer(base_dir, lora, 0.2)
    with monkeypatch.context() as m:
        crash = Crash(m, tmp_path, k, kill)
        try:
            new.save(path)
        except OSError:
            pass
    if not kill:  # the exception ran save's clean-up: a checkpoint stands at the path without help
        assert (path / POLICY_FILE).exists()
    # The old checkpoint or the new one, whole: weights and optimizer state from the same save.
    assert saved_lr(path) in ((0.1, 0.1), (0.2, 0.2)), f"crash at change {k} of {crash.calls}"
    trainer(base_dir, lora, 0.3).save(path)  # the next save recovers and leaves nothing behind
    assert saved_lr(path) == (0.3, 0.3)
    assert sorted(p.name for p in path.parent.iterdir()) == ["main"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads fd paths from /proc/self/fd")
def test_save_fsyncs_every_file_and_directory_before_returning(base_dir, tmp_path, monkeypatch):
    path = tmp_path / "checkpoints" / "ckpt"  # in a directory the save creates
    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def replace(src, dst, *args, **kwargs):
        events.append(("replace", f"{os.path.realpath(src)} -> {os.path.realpath(dst)}"))
        return real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    trainer(base_dir, False, 0.1).save(path)
    path, tmp = path.resolve(), path.resolve().with_name("ckpt.tmp")
    names = sorted(p.name for p in path.iterdir())
    assert {"optimizer.pt", POLICY_FILE, "config.json", "tokenizer.json"} <= set(names)
    swap = events.index(("replace", f"{tmp} -> {path}"))
    synced_before = {p for kind, p in events[:swap] if kind == "fsync"}
    # Every file of the checkpoint, and its directory, reached the disk before it was renamed in...
    assert {str(tmp / n) for n in names} | {str(tmp)} <= synced_before
    # ...and the rename itself (an entry of the parent directory, itself new) before save returned.
    assert {("fsync", str(path.parent)), ("fsync", str(path.parent.parent))} <= set(events[swap + 1 :])
