"""Domains by config: the env section names its domain, whose config class names the factory. Also the
warm-start cache key: what a warm-started base depends on in the env config and the domain's code."""

from __future__ import annotations

import json
from typing import Any

from evotrainer.config import RunConfig
from evotrainer.envs.config import ImportedConfig
from evotrainer.envs.env import Domain, EnvCheckError, check_env
from evotrainer.envs.reward_functions import add_reward_functions, import_user_module
from evotrainer.errors import ConfigError

# What the loop reads of a domain beyond its methods (the Domain protocol's attributes).
DOMAIN_ATTRIBUTES = ("name", "stop", "reward_terms", "evaluator_settings", "evaluator_packages", "demo_recipe")


def load_factory(path: str) -> Any:
    """A class or function given as `module:attribute`."""
    module, _, attr = path.partition(":")
    return getattr(import_user_module(module), attr)


# Generated domains (env config `drawn`) already drawn in this process, by what they are drawn from. Every arm
# of a loop run asks for its domain, and drawing one costs seconds (code: 20,000 generated functions) to a
# minute (SWE: 4,200 generated repositories, each one's tests run); a drawn domain is not changed afterwards
# (its sandbox pool starts on first use and is then shared). A domain read from a file, or a user's, is built
# each time: the file may have changed, the factory may keep state.
_DRAWN: dict[str, Domain] = {}
_DRAWN_MAX = 4


def domain_key(cfg: RunConfig) -> str:
    """What a domain is drawn from: its env section, the seed and the held-out size."""
    return json.dumps([cfg.env.model_dump(mode="json"), cfg.run.seed, cfg.eval.heldout_size], sort_keys=True)


def make_domain(cfg: RunConfig) -> Domain:
    """The configured domain with its `env.reward_functions` added (each checked on demonstrations); a
    setting the domain cannot honour is a ConfigError naming the field."""
    imported = isinstance(cfg.env, ImportedConfig)
    key = domain_key(cfg)
    if cfg.env.drawn and key in _DRAWN:
        return _DRAWN[key]
    domain = _build(cfg, imported)
    if cfg.env.drawn:
        while len(_DRAWN) >= _DRAWN_MAX:
            _DRAWN.pop(next(iter(_DRAWN)))
        _DRAWN[key] = domain
    return domain


def _build(cfg: RunConfig, imported: bool) -> Domain:
    try:
        factory = load_factory(cfg.env.factory)
    except (ImportError, AttributeError) as err:  # only a user's path can fail: ours are fixed
        raise ConfigError(f"env.domain = {cfg.env.factory!r}: cannot import it ({err})") from None
    try:
        domain = factory.from_config(cfg.env, seed=cfg.run.seed, heldout_size=cfg.eval.heldout_size)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    if imported:
        check_imported(domain, cfg.env.factory)
    sampling = cfg.harness.sampling
    add_reward_functions(domain, cfg.env.reward_functions, sampling.prompts_per_step, sampling.num_generations)
    return domain


def check_imported(domain: Domain, path: str) -> None:
    """A user's domain meets the contract (envs/env.py Domain) and passes check_env, or the run stops
    here naming env.domain."""
    missing = [a for a in DOMAIN_ATTRIBUTES if not hasattr(domain, a)]
    if missing:
        raise ConfigError(f"env.domain = {path!r}: the domain lacks {missing} (see evotrainer/envs/env.py Domain)")
    try:
        check_env(domain)
    except EnvCheckError as err:
        raise ConfigError(f"env.domain = {path!r}: check_env failed: {err}") from None


def warm_start_key(cfg: RunConfig, domain: Domain) -> dict[str, Any]:
    """What a warm-started base depends on: the env settings that change the demonstrations (each
    domain's config says which do not), the held-out size (held-out tasks are drawn first), and the
    domain's demonstration recipe, which lives in code. Reward functions never change a demonstration:
    adding one reuses the base."""
    env = cfg.env.model_dump(mode="json", exclude=set(type(cfg.env).demo_neutral) | {"reward_functions"})
    return {"env": env, "heldout_size": cfg.eval.heldout_size, "demos": dict(domain.demo_recipe)}
