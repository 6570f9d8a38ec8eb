"""The agent's ``python`` tool: run a code cell in a fresh, isolated, resource-limited interpreter.

Unlike ``coevo.safety.sandbox.source_policy`` there is no static policy here: the agent may use the whole
standard library. What keeps the host safe is confinement and limits. Every cell runs in a
separate ``python -I -S`` process (no site-packages, no PYTHON* variables, no user directories)
with a minimal environment, closed stdin, and address-space, CPU, file-size, process-count and
core-dump limits, in one of two modes (``isolation()``):

* ``bwrap`` (the default): the bubblewrap jail of ``coevo.safety.sandbox.jail`` (unprivileged uid, no
  capabilities, own user/mount/PID/network namespaces, ``pivot_root`` into a read-only view of
  ``/usr`` and the interpreter, a 16 MiB tmpfs work directory, a seccomp filter). When it cannot
  run on this machine the tool refuses to run code (``SandboxUnavailable`` names the fix).
* ``unconfined``, only when ``COEVO_PYTHON_ISOLATION=unconfined`` asks for it, with a loud
  warning: the same interpreter, limits and minimal environment in its own process group, killed
  as a group; it shares the host's filesystem view, network and process table.
"""

from __future__ import annotations

import codecs
import functools
import logging
import math
import os
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from coevo.safety.sandbox import jail
from coevo.safety.sandbox.jail import SandboxUnavailable

FILE_SIZE_LIMIT_BYTES = 1 << 20
"""Largest file the code may write (RLIMIT_FSIZE): enough for scratch files, too small to fill a disk."""
WORK_DIR_LIMIT_BYTES = 16 << 20
"""Size of the cell's tmpfs working directory (``bwrap`` mode): many small files cannot fill a disk."""
PROCESS_LIMIT = 64
"""RLIMIT_NPROC of the cell: bounds fork bombs (the jail runs as ``nobody`` under a root trainer, so it binds)."""
ISOLATION_MODES = ("bwrap", "unconfined")
_CELL_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}

log = logging.getLogger(__name__)

_STDERR_TAIL_BYTES = 1 << 14
_DRAIN_AFTER_EXIT_S = 0.5

# Runs inside the child. Limits are set here rather than in a preexec_fn, which is unsafe when
# the parent has threads (PyTorch). The cell runs in the real __main__ namespace so that classes
# it defines are picklable; the last statement, if an expression, is echoed like a notebook.
_WRAPPER = """\
def _coevo_cell():
    import ast, resource, sys
    cell_path, memory, cpu, fsize, nproc = sys.argv[1], *map(int, sys.argv[2:6])
    for kind, soft, hard in ((resource.RLIMIT_AS, memory, memory), (resource.RLIMIT_CPU, cpu, cpu + 1),
                             (resource.RLIMIT_FSIZE, fsize, fsize), (resource.RLIMIT_CORE, 0, 0),
                             (resource.RLIMIT_NPROC, nproc, nproc)):
        old_hard = resource.getrlimit(kind)[1]
        if old_hard != resource.RLIM_INFINITY:
            soft, hard = min(soft, old_hard), min(hard, old_hard)
        resource.setrlimit(kind, (soft, hard))
    sys.stdout.reconfigure(encoding="utf-8", errors="backslashreplace")
    sys.stderr.reconfigure(encoding="utf-8", errors="backslashreplace")
    with open(cell_path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), "<cell>")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    namespace = sys.modules["__main__"].__dict__
    del namespace["_coevo_cell"]
    sys.argv = ["<cell>"]
    exec(compile(tree, "<cell>", "exec"), namespace)
    if last is not None:
        value = eval(compile(last, "<cell>", "eval"), namespace)
        if value is not None:
            sys.stdout.write(repr(value) + "\\n")
_coevo_cell()
"""

@functools.cache
def isolation() -> str:
    """The isolation mode of this process (``ISOLATION_MODES``), decided once.

    ``bwrap`` unless ``COEVO_PYTHON_ISOLATION=unconfined`` opts out. The jail is probed by running
    a trivial cell; when it cannot run, this raises ``SandboxUnavailable`` saying why and how to
    fix it: model-written code never runs unconfined without the user asking for it.
    """
    wanted = os.environ.get("COEVO_PYTHON_ISOLATION", "") or "bwrap"
    if wanted not in ISOLATION_MODES:
        raise ValueError(f"COEVO_PYTHON_ISOLATION={wanted!r} is not allowed; choose one of {list(ISOLATION_MODES)}")
    if wanted == "unconfined":
        log.warning("THE PYTHON TOOL IS NOT ISOLATED (COEVO_PYTHON_ISOLATION=unconfined): model-written code runs "
                    "as this user with the host's filesystem, network and processes, bounded only by resource "
                    "limits. Unset it to run cells in the bubblewrap jail.")
        return "unconfined"
    problem = _probe_jail()
    if problem is not None:
        raise SandboxUnavailable(f"the python tool's jail cannot run here: {problem}. Fix that, or set "
                                 "COEVO_PYTHON_ISOLATION=unconfined to run model-written code without confinement "
                                 "(only for code you trust).")
    return "bwrap"


def _probe_jail() -> str | None:
    """None when a trivial cell runs in the jail, else why not."""
    try:
        cell_fd, seccomp_fd = jail.data_fd("print('jailed')"), jail.seccomp_filter_fd()
    except jail.SandboxUnavailable as err:
        return str(err)
    try:
        interpreter = jail.cell_interpreter()[0]
        argv = jail.bwrap_argv([interpreter, "-I", "-S", "/box/cell.py"], cell_fd=cell_fd, seccomp_fd=seccomp_fd,
                               work_bytes=WORK_DIR_LIMIT_BYTES)
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=30, env=_CELL_ENV,
                              pass_fds=(cell_fd, seccomp_fd), **jail.runs_as())  # type: ignore[call-overload]
    except jail.SandboxUnavailable as err:
        return str(err)
    except (OSError, subprocess.SubprocessError) as err:
        return f"{type(err).__name__}: {err}"
    finally:
        os.close(cell_fd)
        os.close(seccomp_fd)
    if done.returncode != 0 or done.stdout != b"jailed\n":
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or [f"status {done.returncode}"]
        return f"bwrap failed: {tail[0]}"
    return None


@dataclass(frozen=True)
class PythonResult:
    """What the agent sees from one cell."""

    stdout: str
    """Truncated to ``max_output_chars``, with a marker saying how much was cut."""
    error: str | None
    """Last traceback line, ``"timed out after 2.0 s"`` or ``"memory limit of 256 MB exceeded"``."""
    timed_out: bool
    seconds: float


def run_python(
    code: str, *, timeout_s: float = 5.0, memory_mb: int = 256, max_output_chars: int = 4000
) -> PythonResult:
    """Run ``code`` as a cell in a fresh interpreter and report its output and error.

    The temporary directory (cell file plus working directory) is removed afterwards, and no
    process the cell started survives the call, whether it finished, failed or timed out.
    """
    if timeout_s <= 0 or memory_mb <= 0 or max_output_chars < 0:
        raise ValueError("timeout_s and memory_mb must be positive, max_output_chars non-negative")
    cpu_s = math.ceil(timeout_s) + 1
    limits = [str(memory_mb * 2**20), str(cpu_s), str(FILE_SIZE_LIMIT_BYTES), str(PROCESS_LIMIT)]
    jailed = isolation() == "bwrap"
    fds: tuple[int, ...] = ()
    root = None
    try:
        if jailed:  # the cell arrives through a memfd: nothing is written to the host's disk
            fds = (jail.data_fd(code), jail.seccomp_filter_fd())
            command = [jail.cell_interpreter()[0], "-I", "-S", "-u", "-c", _WRAPPER, "/box/cell.py", *limits]
            argv = jail.bwrap_argv(command, cell_fd=fds[0], seccomp_fd=fds[1], work_bytes=WORK_DIR_LIMIT_BYTES)
            work, extra = "/box/work", jail.runs_as()
        else:
            root = tempfile.mkdtemp(prefix="coevo-python-")
            cell, work = os.path.join(root, "cell.py"), os.path.join(root, "work")
            os.mkdir(work)
            with open(cell, "w", encoding="utf-8") as f:
                f.write(code)
            argv, extra = [sys.executable, "-I", "-S", "-u", "-c", _WRAPPER, cell, *limits], {"cwd": work}
        start = time.monotonic()
        with subprocess.Popen(
            argv, env={**_CELL_ENV, "HOME": work, "TMPDIR": work}, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, pass_fds=fds,
            start_new_session=True,  # its own session and process group, so killpg reaches its children
            **extra,  # type: ignore[arg-type]
        ) as proc:  # fmt: skip
            out, err = _HeadCapture(max_output_chars), _TailCapture(_STDERR_TAIL_BYTES)
            sinks = {proc.stdout.fileno(): out, proc.stderr.fileno(): err}  # type: ignore[union-attr]
            try:
                timed_out = not _pump(proc, sinks, start + timeout_s)
            finally:
                _kill_group(proc)
            _pump(None, sinks, time.monotonic() + _DRAIN_AFTER_EXIT_S)  # what was still in the pipes
        seconds = time.monotonic() - start
    finally:
        for fd in fds:
            os.close(fd)
        if root is not None:
            _remove_tree(root)
    returncode = proc.returncode
    if jailed and returncode > 128:  # bwrap reports its child's signal death as 128 + signal
        returncode = 128 - returncode
    error, timed_out = _error(returncode, err.text(), timed_out, timeout_s, cpu_s, memory_mb)
    return PythonResult(stdout=out.text(), error=error, timed_out=timed_out, seconds=seconds)


class _HeadCapture:
    """Keeps the first ``limit`` characters and counts the rest, without storing them."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.kept: list[str] = []
        self.kept_chars = 0
        self.cut_chars = 0
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, data: bytes, final: bool = False) -> None:
        text = self.decoder.decode(data, final)
        room = self.limit - self.kept_chars
        if room > 0:
            self.kept.append(text[:room])
            self.kept_chars += min(room, len(text))
        self.cut_chars += max(0, len(text) - max(room, 0))

    def text(self) -> str:
        self.feed(b"", final=True)
        head = "".join(self.kept)
        if self.cut_chars:
            head += f"\n[output truncated: {self.cut_chars} more characters not shown]"
        return head


class _TailCapture:
    """Keeps the last ``limit`` bytes: the traceback's last line is at the end of stderr."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.data = bytearray()

    def feed(self, data: bytes, final: bool = False) -> None:
        self.data += data
        del self.data[: -self.limit]

    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")


def _pump(proc: subprocess.Popen[bytes] | None, sinks: dict[int, _HeadCapture | _TailCapture], deadline: float) -> bool:
    """Feed pipe data to ``sinks`` until both pipes close, ``proc`` has exited, or the deadline.

    Returns False only when the deadline passed first. A finished ``proc`` ends the wait even if
    a straggling grandchild still holds the pipes; the caller kills the group and drains them.
    """
    with selectors.DefaultSelector() as selector:
        for fd in sinks:
            selector.register(fd, selectors.EVENT_READ)
        while selector.get_map():
            if proc is not None and _has_exited(proc):
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            for key, _ in selector.select(min(remaining, 0.1)):
                data = os.read(key.fd, 1 << 16)
                if data:
                    sinks[key.fd].feed(data)
                else:
                    selector.unregister(key.fd)
    return True


def _has_exited(proc: subprocess.Popen[bytes]) -> bool:
    """True once ``proc`` has exited, without reaping it: while it is a zombie its pid cannot be
    reused, so killing its process group afterwards cannot hit an unrelated process."""
    if proc.returncode is not None:
        return True
    return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL every process in the cell's group (the leader included), then reap the leader."""
    if proc.returncode is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    proc.wait()


def _error(
    returncode: int, stderr: str, timed_out: bool, timeout_s: float, cpu_s: int, memory_mb: int
) -> tuple[str | None, bool]:
    """The one-line error the agent sees, and whether the cell counts as timed out."""
    if timed_out:
        return f"timed out after {float(timeout_s)} s", True
    if returncode == 0:
        return None, False
    if returncode == -signal.SIGXCPU:
        return f"CPU time limit of {cpu_s} s exceeded", True
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    if last.split(":", 1)[0] == "MemoryError":
        return f"memory limit of {memory_mb} MB exceeded", False
    if last:
        return last, False
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = str(-returncode)
        return f"killed by signal {name}", False
    return f"exited with status {returncode}", False


def _remove_tree(root: str) -> None:
    """Remove the temporary directory even if the cell took away its own permissions."""

    def make_writable_and_retry(func, path, _exc_info):  # type: ignore[no-untyped-def]
        for target in {os.path.dirname(path), path}:
            try:
                os.chmod(target, stat.S_IRWXU)
            except OSError:
                pass
        try:
            func(path)
        except OSError:
            pass

    shutil.rmtree(root, onerror=make_writable_and_retry)
