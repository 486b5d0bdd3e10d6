"""The small run that the tests and the CPU benchmarks share: the tiny policy (a 2-layer model whose warm
start takes seconds) on one-digit sums with a small held-out set. One definition, so that a test and the
benchmark that measures the same situation (benchmarks/soak_runs.py, benchmarks/trl_backend.py) cannot
drift apart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

TINY_POLICY = {"hidden_size": 64, "num_layers": 2, "num_heads": 2, "vocab_size": 200, "max_positions": 256}
WARM_START = {"steps": 150, "batch_size": 64, "learning_rate": 3e-3, "demonstrations": 4000}
ONE_DIGIT_SUMS = [{"name": "chain_sum", "config": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}}]
SMALL_SAMPLING = {"num_generations": 8, "prompts_per_step": 16, "max_completion_length": 8}


def small_raw(out_dir: Path, cache_dir: Path | str, seed: int = 0, name: str = "t") -> dict[str, Any]:
    """The raw config (evotrainer.config.parse_config's input) of a small math run: fresh dicts each call,
    so a caller may update its sections."""
    return {
        "run": {"name": name, "out_dir": str(out_dir), "seed": seed},
        "policy": {
            "kind": "tiny",
            "cache_dir": str(cache_dir),
            "tiny": dict(TINY_POLICY),
            "warm_start": dict(WARM_START),
        },
        "env": {"domain": "math", "train_size": 400, "datasets": [dict(d) for d in ONE_DIGIT_SUMS]},
        "harness": {"sampling": dict(SMALL_SAMPLING)},
        "train": {"steps": 5, "max_seconds": 120},
        "eval": {"heldout_size": 60, "max_new_tokens": 8, "max_turns": 6},
    }
