"""The SWE domain's settings (`env.domain: swe`)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from evotrainer.envs.config import DomainConfig


class SweConfig(DomainConfig):
    """Fix a seeded bug in a generated mini-repository with ls / cat / grep / replace / test / submit."""

    factory: ClassVar[str] = "evotrainer.envs.swe.domain:SweDomain"
    demo_neutral: ClassVar[frozenset[str]] = frozenset()
    drawn: ClassVar[bool] = True

    domain: Literal["swe"] = "swe"
    """Which environment (see config.EnvConfig)."""
    levels: list[int] = Field(default_factory=lambda: [0, 1, 2])
    """Difficulty levels of the generated repositories, drawn in equal shares. 0: one module and its
    test file; 1: two modules; 2: the tested module calls helpers in an untested module, and the bug
    may sit in a helper, two files away from the failing test; 3 (long-horizon): as 2 with two bugs, one in
    each module, each failing a visible test: read both files, edit, run the tests, read the failure, edit
    again (seven tool calls for the scripted solver)."""
    max_output: int = Field(400, ge=40, le=100_000)
    """Characters of one tool observation (file view, grep hits, test output) before it is cut."""
    train_size: int = Field(20000, ge=1)
    """Size of the train task pool."""
