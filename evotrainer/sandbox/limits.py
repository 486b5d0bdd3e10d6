"""What a sandboxed job may use and what came back: the sandbox's two value types."""

from __future__ import annotations

from dataclasses import dataclass

Termination = str  # "ok" | "error" | "timeout" | "memory" | "output"
TERMINATIONS = ("ok", "error", "timeout", "memory", "output")


@dataclass(frozen=True)
class Limits:
    cpu_seconds: float = 2.0
    """CPU time (RLIMIT_CPU, whole seconds, rounded up): SIGXCPU, then SIGKILL a second later."""
    wall_seconds: float = 5.0
    """Wall clock from start to exit; the whole process group is killed at the limit."""
    memory_mb: int = 256
    """Address space (RLIMIT_AS); Python raises MemoryError past it."""
    processes: int = 32
    """RLIMIT_NPROC for the job's uid (enforced where mechanisms()['nproc'])."""
    output_bytes: int = 64_000
    """stdout + stderr together; the job is killed when it writes more. Each stream keeps its tail."""
    file_bytes: int = 4_000_000
    """Largest file the job may write (RLIMIT_FSIZE)."""


@dataclass(frozen=True)
class ExecResult:
    termination: Termination
    """ok | error (nonzero exit) | timeout (wall or CPU) | memory | output (output or file size cap)."""
    returncode: int | None
    """Exit code (negative: killed by that signal); None when the sandbox killed it at a limit."""
    stdout: str
    stderr: str
    wall_seconds: float

    @property
    def ok(self) -> bool:
        return self.termination == "ok"

    @property
    def worker_lost(self) -> bool:
        """The pool lost the worker mid-job (its only `error` without an exit code): infrastructure, not the
        code it ran."""
        return self.termination == "error" and self.returncode is None
