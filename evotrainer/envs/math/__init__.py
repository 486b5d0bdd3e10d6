"""The math domain: reasoning-gym tasks, single turn (config.py: its settings; domain.py: tasks, env,
reward terms and the strict audit). Registered as DOMAIN (envs/domains.py)."""

from evotrainer.envs.domains import DomainSpec
from evotrainer.envs.math.config import MathConfig

DOMAIN = DomainSpec("math", MathConfig)
