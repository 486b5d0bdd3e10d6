"""The sandbox: each escape attempt is a real program run in a real sandboxed process; the tests assert
the termination reason and that nothing happened outside the sandbox."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import pytest

from evotrainer import sandbox
from evotrainer.sandbox import Limits, WorkerPool, isolation

FAST = Limits(cpu_seconds=1, wall_seconds=1.5, memory_mb=256, processes=16, output_bytes=10_000)
# scripts/setup.sh installs bubblewrap where it runs as root with apt-get: there a missing bwrap is a
# broken set-up, and the tests that need it fail instead of skipping.
SETUP_INSTALLS_BWRAP = os.geteuid() == 0 and shutil.which("apt-get") is not None


def lacking(what: str, why: str) -> None:
    """Fail where the set-up should have provided `what`: bwrap is not installed (and not turned off by the
    test) where the set-up installs it. Skip, saying why, only where nothing could have provided it."""
    bwrap_off = "bwrap" in os.environ.get("EVOTRAINER_SANDBOX_DISABLE", "")
    if SETUP_INSTALLS_BWRAP and not bwrap_off and not shutil.which("bwrap"):
        pytest.fail(
            f"{what} missing: bubblewrap is not installed, yet this machine runs as root with apt-get, where "
            "scripts/setup.sh installs it (apt-get install bubblewrap)"
        )
    if shutil.which("bwrap") and not bwrap_off:
        why = f"bubblewrap is installed but could not create a sandbox here (namespaces not permitted?); {why}"
    pytest.skip(f"{what} missing, and nothing here could provide it: {why}")


NO_NAMESPACES = "the kernel or container allows no pid + net namespaces here"
NO_FILE_ISOLATION = (
    "without bwrap only a dropped uid keeps the job from the trainer's files, and that needs root and an "
    "interpreter an unprivileged uid can reach (a pyenv under /root is not)"
)


@pytest.fixture(params=["full", "unshare"])
def mode(request, monkeypatch):
    """Every test runs under the strongest layers this machine has, and again without bwrap (the
    unshare fallback), so the fallback a user without bubblewrap gets is tested too."""
    monkeypatch.delenv(isolation.UNISOLATED_ENV, raising=False)
    if request.param == "unshare":
        monkeypatch.setenv("EVOTRAINER_SANDBOX_DISABLE", "bwrap")
    monkeypatch.setattr(isolation, "_mech", None)
    m = sandbox.mechanisms()
    if request.param == "full" and not shutil.which("bwrap") and SETUP_INSTALLS_BWRAP:
        lacking("bubblewrap", "")  # fails: the set-up installs it here
    if not isolation.isolated(m):  # the sandbox refuses here: test_refuses_without_isolation_unless_accepted
        where = "bwrap is off in this mode" if request.param == "unshare" else "no working bubblewrap"
        lacking(
            "every isolation layer",
            f"{where}; {NO_NAMESPACES}; no uid to drop to (needs root and a reachable interpreter)",
        )
    if request.param == "unshare" and not m["netns"]:
        pytest.skip(f"the unshare fallback: {NO_NAMESPACES}")
    yield m
    monkeypatch.setattr(isolation, "_mech", None)


def execute(where, source: str, tmp_path: Path, limits: Limits = FAST, stdin: str = ""):
    """Run `source` either through run_python in a fresh directory or through the pool."""
    if where == "run":
        d = tmp_path / f"job-{uuid.uuid4().hex[:6]}"
        d.mkdir()
        return sandbox.run_python(source, d, limits, stdin)
    return where.run_python(source, None, limits, stdin)


def surviving(marker: str) -> list[int]:
    """Host pids whose command line carries `marker`."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                out.append(int(pid))
        except OSError:
            pass
    return out


@pytest.fixture(params=["run", "pool"])
def where(request, mode):
    if request.param == "run":
        yield "run"
    else:
        with WorkerPool(1, FAST) as p:
            yield p


def test_ok_stdout_stdin_and_files(mode, tmp_path):
    r = execute("run", "import sys; print(sys.stdin.read().upper())", tmp_path, stdin="hello")
    assert r.termination == "ok" and r.returncode == 0 and r.stdout == "HELLO\n"
    with WorkerPool(1, FAST) as p:
        r = p.run_python(
            "import helper, os; print(helper.X, os.getcwd() == os.environ['HOME'])", {"helper.py": "X = 7"}
        )
        assert r.stdout == "7 True\n"
        # Each job gets a fresh directory: what one job wrote, the next does not see.
        assert p.run_python("open('left.txt', 'w').write('x')").ok
        assert p.run_python("import os; print(os.listdir('.'))").stdout == "['main.py']\n"
        with pytest.raises(ValueError, match="relative"):
            p.run_python("pass", {"../escape.py": ""})


def test_infinite_loop_times_out(where, tmp_path):
    r = execute(where, "while True:\n    pass\n", tmp_path)
    # Stopped by the limits, not left to run: the margin is the kill's latency on a loaded machine, not a timing.
    assert r.termination == "timeout" and r.wall_seconds < FAST.wall_seconds + 10.0
    # The CPU limit alone (the wall limit far off): under `unshare` the child's SIGXCPU is lost on the way out
    # ("unshare: sigprocmask unblock failed", exit 1), and must still read as a timeout, not an error.
    cpu_only = Limits(cpu_seconds=1, wall_seconds=60, memory_mb=256, processes=16, output_bytes=10_000)
    r = execute(where, "while True:\n    pass\n", tmp_path, cpu_only)
    assert r.termination == "timeout" and r.wall_seconds < 30, (r.termination, r.returncode, r.stderr[-300:])
    # A job that exits 1 printing that line itself before the CPU limit could have fired is an error.
    r = execute(where, "import sys\nsys.exit('unshare: sigprocmask unblock failed')\n", tmp_path, cpu_only)
    assert r.termination == "error"
    r = execute(where, "import time\ntime.sleep(60)\n", tmp_path)  # no CPU used: the wall limit
    assert r.termination == "timeout" and r.returncode is None


def test_fork_bomb_is_stopped_and_leaves_nothing(where, tmp_path):
    marker = f"forkbomb-{uuid.uuid4().hex}"
    # Children leave the session (setsid) and become long sleepers: a process-group kill alone would miss them.
    bomb = (
        "import os, sys\n"
        "for _ in range(500):\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError:\n"
        "        continue\n"
        "    if pid == 0:\n"
        "        os.setsid()\n"
        f"        os.execv(sys.executable, [sys.executable, '-S', '-c', 'import time; time.sleep(60)', '{marker}'])\n"
        "while True:\n"
        "    pass\n"
    )
    r = execute(where, bomb, tmp_path)
    assert r.termination in ("timeout", "error")
    assert surviving(marker) == []
    if where != "run":
        assert where.run_python("print(1)").stdout == "1\n"  # the pool still works


def test_memory_bomb(where, tmp_path):
    r = execute(where, "blocks = []\nwhile True:\n    blocks.append(bytearray(50 * 2**20))\n", tmp_path)
    assert r.termination == "memory" and "MemoryError" in r.stderr


def test_no_network(where, tmp_path, mode):
    if not mode["netns"]:
        lacking("a network namespace", NO_NAMESPACES)
    src = "import socket\ns = socket.create_connection(('1.1.1.1', 53), timeout=1)\nprint('connected')\n"
    r = execute(where, src, tmp_path)
    assert r.termination == "error" and "connected" not in r.stdout
    assert "Network is unreachable" in r.stderr


def test_cannot_write_outside_its_directory(where, tmp_path, mode):
    if not (mode["mountns"] or mode["uid_drop"]):
        lacking("a mount namespace or a dropped uid", NO_FILE_ISOLATION)
    outside = tmp_path / "outside.txt"
    in_tmp = Path(f"/tmp/escaped-{uuid.uuid4().hex}")
    src = (
        f"for p in [{str(outside)!r}, {str(in_tmp)!r}, '../escaped.txt']:\n"
        "    try:\n"
        "        open(p, 'w').write('pwned')\n"
        "        print('wrote', p)\n"
        "    except OSError as e:\n"
        "        print('refused', p, type(e).__name__)\n"
    )
    r = execute(where, src, tmp_path)
    assert r.termination == "ok"
    assert not outside.exists() and not (tmp_path / "escaped.txt").exists()
    assert not in_tmp.exists()


def test_cannot_read_the_evaluators_hidden_tests(where, tmp_path, mode):
    """The evaluator's data on disk (here: hidden tests in a run directory) is out of reach. Under
    bwrap the job's filesystem holds only the Python install and its own directory; in the fallbacks
    the dropped uid cannot enter the run directory (mode 0700, as pytest makes tmp dirs)."""
    secret = f"assert f(2) == {uuid.uuid4().int % 10**9}"
    run_dir = tmp_path / "runs" / "r1"
    run_dir.mkdir(parents=True)
    hidden = run_dir / "hidden_tests.py"
    hidden.write_text(secret)
    if not (mode["mountns"] or mode["uid_drop"]):
        lacking("a mount namespace or a dropped uid", NO_FILE_ISOLATION)
    # The walk skips the Python install the sandbox binds in (read-only, the interpreter's own files):
    # a clone under /tmp puts its whole virtualenv on the walk, too slow for a loaded machine.
    src = (
        f"import os, sys\nfound = []\n"
        f"try:\n    found.append(open({str(hidden)!r}).read())\n"
        "except OSError as e:\n    print('refused', type(e).__name__)\n"
        "skip = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}\n"
        "for top in ['/tmp', '/work', '/root', '/home', " + repr(str(tmp_path)) + "]:\n"
        "    for d, dirs, files in os.walk(top):\n"
        "        dirs[:] = [x for x in dirs if os.path.realpath(os.path.join(d, x)) not in skip]\n"
        "        for f in files:\n"
        "            if 'hidden' in f:\n"
        "                try:\n                    found.append(open(os.path.join(d, f)).read())\n"
        "                except OSError:\n                    pass\n"
        "print(found)\n"
    )
    r = execute(where, src, tmp_path, Limits(cpu_seconds=5, wall_seconds=10, memory_mb=256, output_bytes=10_000))
    assert r.termination == "ok" and "refused" in r.stdout
    assert secret not in r.stdout + r.stderr


def test_killing_its_parent(tmp_path, mode):
    kill = (
        "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nimport time\ntime.sleep(0.2)\nprint('still here')\n"
    )
    r = execute("run", kill, tmp_path)
    assert r.termination in ("ok", "error")  # the parent is the sandbox's init (not ours to kill) or prlimit
    with WorkerPool(1, FAST) as p:
        r = p.run_python(kill)
        # The job killed its worker: the pool reports it, replaces the worker and goes on.
        assert r.termination in ("error", "ok")
        assert p.run_python("print('next')").stdout == "next\n"
    assert os.getpid() > 0  # and we (the trainer) are alive to check


def test_printing_gigabytes_is_cut_at_the_output_cap(where, tmp_path):
    r = execute(
        where,
        "import sys\nwhile True:\n    sys.stdout.write('x' * 2**20)\n",
        tmp_path,
        Limits(cpu_seconds=5, wall_seconds=5, output_bytes=10_000),
    )
    # Cut by the output cap (a cut at the wall or CPU limit would read "timeout"), and no more kept than it allows.
    assert r.termination == "output" and r.returncode is None
    assert len(r.stdout) <= 10_000


def test_mechanisms_report_and_warn_once(monkeypatch, caplog):
    monkeypatch.setattr(isolation, "_mech", None)
    monkeypatch.setenv("EVOTRAINER_SANDBOX_DISABLE", "bwrap,unshare")
    with caplog.at_level("WARNING"):
        m = sandbox.mechanisms()
        sandbox.mechanisms()
    assert not m["bwrap"] and not m["netns"] and m["rlimits"]
    assert sum("not available" in rec.message for rec in caplog.records) == 1
    monkeypatch.setattr(isolation, "_mech", None)


def test_refuses_without_isolation_unless_accepted(monkeypatch, tmp_path):
    """With every layer off the sandbox fails closed: run, run_python and WorkerPool raise, naming the
    fix, and the job never starts; EVOTRAINER_SANDBOX_UNISOLATED=accept (that exact value) lets it run."""
    monkeypatch.setenv("EVOTRAINER_SANDBOX_DISABLE", "bwrap,unshare,setpriv")
    monkeypatch.delenv(isolation.UNISOLATED_ENV, raising=False)
    monkeypatch.setattr(isolation, "_mech", None)
    m = sandbox.mechanisms()
    assert not (m["bwrap"] or m["netns"] or m["uid_drop"]) and not isolation.isolated(m)
    marker = tmp_path / f"ran-{uuid.uuid4().hex}"
    src = f"open({str(marker)!r}, 'w').write('x')\nprint('ran')\n"
    for value in (None, "1", "yes"):  # unset, or anything but the exact opt-in
        if value is not None:
            monkeypatch.setenv(isolation.UNISOLATED_ENV, value)
        with pytest.raises(isolation.SandboxUnavailable) as refused:
            execute("run", src, tmp_path)
        with pytest.raises(isolation.SandboxUnavailable):
            WorkerPool(1, FAST)
        with pytest.raises(isolation.SandboxUnavailable):
            sandbox.run(["true"], tmp_path)
        assert not marker.exists()  # refused before anything ran
    msg = str(refused.value)
    for says in ("bubblewrap", "EVOTRAINER_SANDBOX_UNISOLATED=accept", "read and write", "network", "'yes'"):
        assert says in msg, (says, msg)

    monkeypatch.setenv(isolation.UNISOLATED_ENV, "accept")
    r = execute("run", src, tmp_path)
    assert r.termination == "ok" and r.stdout == "ran\n" and marker.exists()
    with WorkerPool(1, FAST) as p:
        assert p.run_python("print(6 * 7)").stdout == "42\n"
    monkeypatch.setattr(isolation, "_mech", None)
