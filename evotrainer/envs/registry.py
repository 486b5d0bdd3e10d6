"""Domains by config: the env section names its domain, whose config class names the factory. Also the
warm-start cache key: what a warm-started base depends on in the env config and the domain's code."""

from __future__ import annotations

import importlib
from typing import Any

from evotrainer.config import RunConfig
from evotrainer.envs.env import Domain
from evotrainer.errors import ConfigError


def load_factory(path: str) -> Any:
    """A class or function given as `module:attribute`."""
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


def make_domain(cfg: RunConfig) -> Domain:
    """The configured domain; a setting the domain cannot honour is a ConfigError naming the field."""
    try:
        return load_factory(cfg.env.factory).from_config(
            cfg.env, seed=cfg.run.seed, heldout_size=cfg.eval.heldout_size
        )
    except ValueError as err:
        raise ConfigError(str(err)) from None


def warm_start_key(cfg: RunConfig, domain: Domain) -> dict[str, Any]:
    """What a warm-started base depends on: the env settings that change the demonstrations (each
    domain's config says which do not), the held-out size (held-out tasks are drawn first), and the
    domain's demonstration recipe, which lives in code."""
    env = cfg.env.model_dump(mode="json", exclude=set(type(cfg.env).demo_neutral))
    return {"env": env, "heldout_size": cfg.eval.heldout_size, "demos": dict(domain.demo_recipe)}
