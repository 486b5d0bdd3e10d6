"""Policies: the contract in policy.py, Hugging Face models in hf.py, the embedded tiny default in tiny.py."""
from __future__ import annotations

from evotrainer.config import ConfigError, RunConfig
from evotrainer.envs.env import Domain
from evotrainer.policies.hf import HFPolicy


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
    from evotrainer.envs import domain_key
    from evotrainer.policies.tiny import tiny_base

    return HFPolicy.load(tiny_base(p, domain, domain_key(cfg), cfg.run.seed, progress=progress, log=log), lora_rank=p.lora_rank)
