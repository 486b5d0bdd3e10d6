"""The worker pool: the sandbox's fast path for many small Python jobs (code tests, SWE test runs).
Starting a sandboxed interpreter costs tens of milliseconds and pytest ~0.7 s; a pre-started worker
(worker.py, under the same isolation as sandbox.run) forks each job from a warm interpreter in
a few milliseconds (benchmarks/sandbox.py)."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import tempfile
import threading
import time
import weakref
from pathlib import Path

from evotrainer.sandbox import worker
from evotrainer.sandbox.isolation import command, give, next_uid, python_executable, require_isolation
from evotrainer.sandbox.limits import ExecResult, Limits
from evotrainer.sandbox.process import read_exact, spawn, stop

_WORKER_SOURCE = Path(worker.__file__).read_text()
# Everything a pool worker's jobs may hold on disk at once (one job at a time, so one job's files).
WORKER_TMPFS_BYTES = 256 << 20


class _Worker:
    """One sandboxed worker process (worker.py) with its own directory and uid."""

    def __init__(self) -> None:
        m = require_isolation()
        self.root = Path(tempfile.mkdtemp(prefix="evotrainer-sbx-")).resolve()
        self.uid = next_uid() if m["uid_drop"] else None
        give(self.root, self.uid)
        # kill(-1) after each job is scoped to the pid namespace, or to the worker's own uid.
        cfg = {"root": str(self.root), "nproc": m["nproc"], "kill_all": m["pidns"] or self.uid is not None}
        # No --die-with-parent: it fires when the *thread* that started bwrap exits, and pools are used
        # from short-lived threads. The worker exits on EOF, which comes when the trainer closes the pipe
        # or dies; close() ends its namespace earlier (_stop).
        cmd = command(
            [python_executable(), "-S", "-I", "-c", _WORKER_SOURCE, json.dumps(cfg)],
            str(self.root),
            None,
            (),
            die_with_parent=False,
            uid=self.uid,
            tmpfs_bytes=WORKER_TMPFS_BYTES,
        )
        self.proc, self.ns_fd = spawn(cmd, self.root, stderr=subprocess.DEVNULL)

    def call(self, job: dict, timeout: float) -> dict | None:
        """The worker's answer, or None when it died or missed the deadline (then it is killed)."""
        data = json.dumps(job).encode()
        try:
            self.proc.stdin.write(struct.pack(">Q", len(data)) + data)
            self.proc.stdin.flush()
            fd = self.proc.stdout.fileno()
            hdr = read_exact(fd, 8, timeout)
            body = read_exact(fd, struct.unpack(">Q", hdr)[0], timeout) if hdr else None
            return json.loads(body) if body else None
        except (OSError, ValueError):
            return None

    def close(self) -> None:
        stop(self.proc, self.ns_fd)
        shutil.rmtree(self.root, ignore_errors=True)


class WorkerPool:
    """Pre-started sandboxed workers for many small Python executions. Each job runs in a forked child
    of a worker, in a fresh private directory, under its own rlimits; the worker kills the job's whole
    process group (and every other process in its sandbox) after each job, so nothing a job starts
    outlives it. A worker that dies (a job killed it) or stops answering is killed and replaced.
    Thread-safe: up to `size` jobs run at once. Fails closed like sandbox.run: SandboxUnavailable, here
    and when a worker starts, where no isolation layer works and the user has not opted in."""

    def __init__(self, size: int = 1, limits: Limits = Limits()) -> None:
        if size < 1:
            raise ValueError(f"WorkerPool size must be at least 1, got {size}")
        require_isolation()  # refuse now rather than at the first job
        self.limits = limits
        self._idle: list[_Worker] = []
        self._free = threading.Semaphore(size)
        self._lock = threading.Lock()
        self._all: set[_Worker] = set()
        self._closed = False
        self._finalizer = weakref.finalize(self, WorkerPool._shutdown, self._all)

    def run_python(
        self, source: str, files: dict[str, str] | None = None, limits: Limits | None = None, stdin: str = ""
    ) -> ExecResult:
        """Run `source` as main.py with `files` beside it (names relative to the job's directory)."""
        lim = limits or self.limits
        for name in files or {}:
            if os.path.isabs(name) or ".." in Path(name).parts:
                raise ValueError(f"sandbox file name {name!r} must be relative and stay inside the job directory")
        job = {
            "source": source,
            "files": files or {},
            "stdin": stdin,
            "cpu": lim.cpu_seconds,
            "wall": lim.wall_seconds,
            "memory_mb": lim.memory_mb,
            "processes": lim.processes,
            "output_bytes": lim.output_bytes,
            "file_bytes": lim.file_bytes,
        }
        t0 = time.monotonic()
        with self._free:
            worker, patience = self._take(), lim.wall_seconds + 5.0
            t1 = time.monotonic()
            res = worker.call(job, patience)
            if res is None:  # died or hung: kill its whole sandbox, start a fresh one next time
                # By the clock, not by poll(): the channel closes before bwrap is reaped, so a worker that
                # died can still look alive for a moment, and a death must not read as a timeout.
                timed_out = time.monotonic() - t1 >= patience
                self._drop(worker)
                return ExecResult(
                    "timeout" if timed_out else "error",
                    None,
                    "",
                    "[sandbox] the worker " + ("stopped answering" if timed_out else "died during the job"),
                    time.monotonic() - t0,
                )
            with self._lock:
                self._idle.append(worker)
        return ExecResult(res["termination"], res["returncode"], res["stdout"], res["stderr"], res["wall_seconds"])

    def _take(self) -> _Worker:
        with self._lock:
            if self._closed:
                raise RuntimeError("WorkerPool is closed")
            while self._idle:
                w = self._idle.pop()
                if w.proc.poll() is None:
                    return w
                self._all.discard(w)
                w.close()
            w = _Worker()
            self._all.add(w)
            return w

    def _drop(self, worker: _Worker) -> None:
        with self._lock:
            self._all.discard(worker)
        worker.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._idle.clear()
        self._finalizer()

    @staticmethod
    def _shutdown(workers: set[_Worker]) -> None:
        for w in list(workers):
            w.close()
        workers.clear()

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
