"""EvoTrainer: RL post-training of language models whose training harness evolves with the policy."""

__version__ = "0.1.0"
