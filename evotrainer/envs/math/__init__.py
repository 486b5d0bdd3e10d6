"""The math domain: reasoning-gym tasks, single turn (config.py: its settings; domain.py: tasks, env,
reward terms and the strict audit)."""
