"""The digits domain: a small multi-turn tool environment for tests and failure scenarios."""
