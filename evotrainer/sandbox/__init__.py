"""The sandbox: model-written code runs in a separate, resource-limited process (docs/design.md invariant 8).
The public API; the modules behind it: limits (value types), isolation (layers and command line),
process (pipes and kills), sandbox (one process), pool (pre-started workers), worker (their source)."""

from evotrainer.sandbox.isolation import mechanisms, python_executable
from evotrainer.sandbox.limits import TERMINATIONS, ExecResult, Limits
from evotrainer.sandbox.pool import WorkerPool
from evotrainer.sandbox.sandbox import run, run_python

__all__ = [
    "TERMINATIONS",
    "ExecResult",
    "Limits",
    "WorkerPool",
    "mechanisms",
    "python_executable",
    "run",
    "run_python",
]
