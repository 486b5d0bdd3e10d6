"""Environments: the contract (env.py), one folder per domain (math, digits, code, swe), and the
registry that builds the configured one (registry.py)."""
