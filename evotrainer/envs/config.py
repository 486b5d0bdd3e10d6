"""The settings every domain shares (`env.reward_functions`); each domain's config class extends it."""

from __future__ import annotations

from typing import ClassVar

from pydantic import ConfigDict, Field

from evotrainer.section import Section


class DomainConfig(Section):
    factory: ClassVar[str]
    """The domain's class or function as `module:attribute`, with a `from_config(env, seed, heldout_size)`."""
    demo_neutral: ClassVar[frozenset[str]] = frozenset()
    """Fields that do not change the demonstrations: left out of the warm-start cache key."""
    drawn: ClassVar[bool] = False
    """The domain is generated from its config and the seed alone (no file, no user code), so a process
    draws it once and reuses it (envs/registry.py make_domain)."""

    reward_functions: dict[str, str] = Field(default_factory=dict)
    """Extra reward terms by import path, {name: "module:function"}: a TRL reward function
    `(prompts, completions, **columns) -> list[float | None]` or a verl
    `compute_score(data_source, solution_str, ground_truth, extra_info) -> float | {"score": ...}`.
    Stored on every rollout like the domain's own terms; weight one with `harness.reward_weights`."""


class ImportedConfig(DomainConfig):
    """A user's domain by import path (`env.domain: "mypkg.envs:MyDomain"`); its other env fields are its
    own (read as attributes), passed unchecked to its `from_config(env, seed=, heldout_size=)`. check_env
    runs on it before anything else does."""

    model_config = ConfigDict(extra="allow")

    domain: str = Field(pattern=r"^[\w.]+:\w+$")
    """The domain's class as `module:Class`."""

    @property
    def factory(self) -> str:  # the class is this config's value, not fixed per config class
        return self.domain
