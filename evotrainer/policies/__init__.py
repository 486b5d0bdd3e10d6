"""Policies: the contract in policy.py, Hugging Face models in hf.py, the embedded tiny default in tiny.py."""

from __future__ import annotations

from evotrainer.config import RunConfig
from evotrainer.envs.env import Domain
from evotrainer.envs.registry import warm_start_key
from evotrainer.errors import ConfigError
from evotrainer.policies.hf import HFPolicy
from evotrainer.policies.tiny import tiny_base


def load_policy(cfg: RunConfig, domain: Domain, progress=None, log=print) -> HFPolicy:
    """The run's starting policy: a local model directory, or the warm-started tiny default."""
    p = cfg.policy
    if p.kind == "hf":
        if p.path is None:
            raise ConfigError("policy.path: required when policy.kind is 'hf' (a local model directory)")
        try:
            return HFPolicy.load(p.path, lora_rank=p.lora_rank)
        except FileNotFoundError as e:
            raise ConfigError(str(e)) from None
    return HFPolicy.load(
        tiny_base(p, domain, warm_start_key(cfg, domain), cfg.run.seed, progress=progress, log=log),
        lora_rank=p.lora_rank,
    )
