"""Proposers: the contract (proposer.py), the offline heuristic catalog, and the LLM proposer."""
