"""Environments: the contract (env.py), one folder per domain (math, digits, code, swe, local) that registers
itself with the domain registry (domains.py), the settings they share (config.py), what single-turn answer domains
share (single_turn.py), user reward terms by import path (reward_functions.py), and the factory that builds the
configured domain (registry.py)."""
