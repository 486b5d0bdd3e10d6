"""The local dataset domain: prompts and answers from a file of the user's (config.py: its settings;
domain.py: loading, splits, env, reward terms and the audit). Registered as DOMAIN (envs/domains.py)."""

from evotrainer.envs.domains import DomainSpec
from evotrainer.envs.local.config import LocalConfig

DOMAIN = DomainSpec("local", LocalConfig)
