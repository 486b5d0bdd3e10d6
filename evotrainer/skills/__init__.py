"""The skill library shared across runs."""
