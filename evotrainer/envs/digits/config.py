"""The digits domain's settings (`env.domain: digits`)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from evotrainer.envs.config import DomainConfig


class DigitsConfig(DomainConfig):
    """A multi-turn tool test env: the policy asks for a hidden number's digits one call at a time, then answers."""

    factory: ClassVar[str] = "evotrainer.envs.digits.domain:DigitsDomain"
    demo_neutral: ClassVar[frozenset[str]] = frozenset({"infra_error_rate"})
    drawn: ClassVar[bool] = True

    domain: Literal["digits"] = "digits"
    """Which environment (see config.EnvConfig)."""
    num_digits: int = Field(3, ge=1, le=8)
    """Length of the hidden number."""
    infra_error_rate: float = Field(0.0, ge=0.0, le=1.0)
    """Chance that a tool call fails in the (simulated) backend, ending the episode with termination
    `error`: a stand-in for flaky sandboxes in tests and failure scenarios."""
    train_size: int = Field(20000, ge=1)
    """Size of the train task pool."""
