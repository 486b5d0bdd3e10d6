"""The example configs a new user starts from run as they are, from the repository root: examples/trl.yaml
(train.backend trl, TRL's conversational data format, a TRL reward function imported from the working
directory) and examples/hf.yaml (a Hugging Face model directory, with LoRA). Only their sizes are shrunk."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from rich.console import Console

from evotrainer.config import load_config
from evotrainer.store.rollouts import RolloutStore
from evotrainer.testing import TINY_POLICY, WARM_START
from evotrainer.training.run import train_run

ROOT = Path(__file__).resolve().parents[1]
QUIET = Console(file=open("/dev/null", "w"))
SMALL = {
    "harness.sampling": {"num_generations": 4, "prompts_per_step": 4, "max_completion_length": 8},
    "train.steps": 2,
    "eval.heldout_size": 30,
    "eval.max_new_tokens": 8,
}


def _run(name: str, tmp_path: Path, **overrides) -> list[dict]:
    cfg = load_config(ROOT / "examples" / name, {**SMALL, "run.out_dir": str(tmp_path / "runs"), **overrides})
    summary = train_run(cfg, QUIET)
    assert summary["steps"] == 2
    return RolloutStore(tmp_path / "runs" / cfg.run.name / "store").query(where="split = 'train'")


@pytest.fixture
def from_the_root(monkeypatch):
    monkeypatch.chdir(ROOT)  # where the examples are run from: env.path and the reward function are read there


def test_the_trl_example_runs(tmp_path, from_the_root, math_setup):
    rows = _run(
        "trl.yaml",
        tmp_path,
        **{"policy.cache_dir": os.environ["EVOTRAINER_TEST_CACHE"], "policy.tiny": TINY_POLICY},
        **{"policy.warm_start": WARM_START},
    )
    assert rows and all(set(r["rewards"]) == {"correct", "format", "contains_answer"} for r in rows)
    # The conversational prompt as messages, not as the text of a Python list.
    assert all(r["prompt"].startswith("system: Add the numbers.") and "{'role'" not in r["prompt"] for r in rows)


def test_the_hugging_face_example_runs(tmp_path, from_the_root, math_setup):
    math_setup[2].save(tmp_path / "model")  # a Hugging Face model directory (the tiny warm-started base)
    rows = _run("hf.yaml", tmp_path, **{"policy.path": str(tmp_path / "model")})
    assert rows and all("contains_answer" in r["rewards"] for r in rows)
