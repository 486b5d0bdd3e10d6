"""Environments: the contract (env.py), one folder per domain (math, digits, code, swe, local), the
settings they share (config.py), user reward terms by import path (reward_functions.py), and the
registry that builds the configured one (registry.py)."""
