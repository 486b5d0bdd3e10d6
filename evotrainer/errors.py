"""The errors a user can act on. A leaf: it imports nothing of ours, so every layer can raise them."""

from __future__ import annotations


class UserError(Exception):
    """A mistake the user can fix; the CLI prints it without a traceback and exits with code 2."""


class ConfigError(UserError):
    """A user mistake in a config file; the message names the field, the value and what is allowed."""


class HarnessError(ConfigError):
    """A harness that does not fit the domain (for example a reward term the domain lacks)."""


class EvaluatorChanged(UserError):
    """The evaluator (its code, settings, data or scorer versions) is not the one a run's verdicts
    were made under; the message says what changed."""


class InfrastructureError(UserError):
    """The run stopped for a reason outside it: a worker or node that ran an arm was lost (twice, with its
    retry). Nothing committed is lost: `evotrainer resume` redoes the unfinished stage."""


class AuditUnavailable(Exception):
    """The evaluator's own machinery (a sandbox, a test runner) failed while auditing a rollout: there is
    no verdict on the policy. Recorded as an infrastructure failure, never as a policy failure."""
