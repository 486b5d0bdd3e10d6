"""The local dataset domain's settings (`env.domain: local`)."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field

from evotrainer.envs.config import DomainConfig


class LocalConfig(DomainConfig):
    """Prompt and answer pairs from a local JSONL or Parquet file or a `datasets` save_to_disk directory,
    single turn: the policy answers in <answer>...</answer>."""

    factory: ClassVar[str] = "evotrainer.envs.local.domain:LocalDomain"
    # The path is neutral because the data's digest (the domain's demo_recipe) keys the cache instead.
    demo_neutral: ClassVar[frozenset[str]] = frozenset({"scorer", "path"})

    domain: Literal["local"] = "local"
    """Which environment (see config.EnvConfig)."""
    path: Path | None = None
    """The data: a .jsonl (one JSON object a line) or .parquet file, or a directory written by
    `datasets.Dataset.save_to_disk`. Required; a relative path is read from the working directory."""
    prompt_column: str = "prompt"
    """The column holding the prompt the policy sees (say there to answer in <answer>...</answer>)."""
    answer_column: str = "answer"
    """The column holding the reference answer."""
    scorer: Literal["math_verify", "exact"] = "math_verify"
    """How the `correct` reward and the audit compare an answer with the reference: math-verify
    (equivalent numbers and expressions) or exact match after trimming whitespace."""
    train_size: int = Field(20000, ge=1)
    """Most train tasks kept (the rows left after the held-out set, in seeded order)."""
