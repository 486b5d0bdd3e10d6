"""Domains by name: the environments EvoTrainer trains on."""
from __future__ import annotations

from typing import Any

from evotrainer.config import ConfigError, RunConfig
from evotrainer.envs.env import Domain


def make_domain(cfg: RunConfig) -> Domain:
    """The configured domain; a setting the domain cannot honour is a ConfigError naming the field."""
    try:
        return _make_domain(cfg)
    except ValueError as err:
        raise ConfigError(str(err)) from None


def _make_domain(cfg: RunConfig) -> Domain:
    e = cfg.env
    if e.domain == "math":
        from evotrainer.envs.math import MathDomain

        return MathDomain([d.model_dump() for d in e.datasets], seed=cfg.run.seed, train_size=e.train_size,
                          heldout_size=cfg.eval.heldout_size, scorer=e.scorer)
    if e.domain == "digits":
        from evotrainer.envs.digits import DigitsDomain

        return DigitsDomain(seed=cfg.run.seed, num_digits=e.num_digits, train_size=e.train_size,
                            heldout_size=cfg.eval.heldout_size, infra_error_rate=e.infra_error_rate)
    if e.domain == "swe":
        from evotrainer.envs.swe import SweDomain

        return SweDomain(seed=cfg.run.seed, levels=e.levels, train_size=e.train_size, heldout_size=cfg.eval.heldout_size,
                         max_output=e.max_output)
    if e.domain == "code":
        from evotrainer.envs.code import CodeDomain

        return CodeDomain(source=e.code_source, seed=cfg.run.seed, train_size=e.train_size,
                          heldout_size=cfg.eval.heldout_size, path=e.code_path)
    raise ValueError(f"env.domain: unknown domain {e.domain!r}")


def domain_key(cfg: RunConfig) -> dict[str, Any]:
    """What a warm-started base depends on in the env config (its cache key)."""
    # Fields that do not change the demonstrations stay out, so changing them reuses the base.
    # The swe and code fields are left out of other domains' keys, so adding them kept those bases' cache keys.
    skip = {"infra_error_rate"} | ({"levels", "max_output"} if cfg.env.domain != "swe" else set()) \
        | ({"code_source", "code_path"} if cfg.env.domain != "code" else set())
    key = {"env": cfg.env.model_dump(mode="json", exclude=skip), "heldout_size": cfg.eval.heldout_size}
    if cfg.env.domain == "code":  # the demonstration recipe lives in code, not config: key on it too
        from evotrainer.envs.code import DEMO_RECIPE

        key["demos"] = DEMO_RECIPE
    return key
