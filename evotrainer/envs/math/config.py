"""The math domain's settings (`env.domain: math`)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from evotrainer.envs.config import DomainConfig
from evotrainer.section import Section


class MathDataset(Section):
    name: str = "chain_sum"
    """reasoning-gym dataset name."""
    weight: float = Field(1.0, gt=0.0)
    """Share of this dataset in the task mix."""
    difficulty: int = Field(0, ge=0)
    """Difficulty level recorded on its tasks."""
    config: dict[str, Any] = Field(
        default_factory=lambda: {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}
    )
    """Keyword arguments of reasoning_gym.create_dataset (difficulty settings)."""


class MathConfig(DomainConfig):
    """reasoning-gym arithmetic and friends, single turn: the first action is the answer."""

    factory: ClassVar[str] = "evotrainer.envs.math.domain:MathDomain"
    demo_neutral: ClassVar[frozenset[str]] = frozenset({"scorer", "answer_format"})
    drawn: ClassVar[bool] = True

    domain: Literal["math"] = "math"
    """Which environment (see config.EnvConfig)."""
    datasets: list[MathDataset] = Field(default_factory=lambda: [MathDataset()])
    """reasoning-gym datasets mixed by weight."""
    scorer: Literal["dataset", "math_verify"] = "dataset"
    """The `correct` reward and the audit use the dataset's own scorer or math-verify (free-form answers)."""
    train_size: int = Field(20000, ge=1)
    """Size of the train task pool."""
    answer_format: Literal["tag", "free"] = "tag"
    """How an answer is read. `tag`: from `<answer>...</answer>`, which the tiny default learns in its warm start;
    the `format` term pays one tag that ends the action, and the audit wants the whole action to be one tag. `free`:
    as a pretrained instruct model writes it, in free text ("The answer is 191."): a tag when there is one, else
    what math-verify extracts from the text; `format` pays an action that ended by itself with an answer to read,
    and the audit wants a correct answer from an action the token cap did not cut."""
