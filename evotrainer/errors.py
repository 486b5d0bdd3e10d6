"""The errors a user can act on. A leaf: it imports nothing of ours, so every layer can raise them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import ValidationError


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


def validation_lines(
    e: ValidationError, source: str, where: Callable[[dict[str, Any]], tuple[list[Any], Any]] | None = None
) -> str:
    """A pydantic error as the user's mistakes: one line per field, `  path.to.field = value: what is wrong`.
    `where` maps an error to the (location, value) the user wrote, where the model's differ (a union's tag)."""
    lines = [f"{source}: {e.error_count()} invalid field(s)"]
    for err in e.errors():
        loc, value = where(err) if where else (list(err["loc"]), err.get("input"))
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown field; check the spelling against the documented fields"
        elif err["type"] == "literal_error":
            msg = f"must be one of {err['ctx']['expected']}"
        lines.append(f"  {'.'.join(str(p) for p in loc)} = {value!r}: {msg}")
    return "\n".join(lines)
