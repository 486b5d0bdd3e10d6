"""The digits domain: a small multi-turn tool environment for tests and failure scenarios (config.py: its
settings; domain.py: tasks, env, reward terms and the audit). Registered as DOMAIN (envs/domains.py)."""

from evotrainer.envs.digits.config import DigitsConfig
from evotrainer.envs.domains import DomainSpec

DOMAIN = DomainSpec("digits", DigitsConfig)
