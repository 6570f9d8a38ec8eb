"""Running checked processor source in a forked, limited child: ``call_in_sandbox``.

The second of the sandbox's two layers (the first, the static policy every source must pass
before it runs, is ``coevo.safety.sandbox.source_policy``; neither is enough alone): the code runs in a
forked child with restricted builtins, read-only module proxies, an address-space limit and a CPU
limit, and the parent kills it when the wall-clock limit passes. Whatever the child does to its
copy of memory never reaches the parent; only the pickled return value of ``entry`` comes back.
What can go wrong at run time is one of ``SandboxTimeout``, ``SandboxMemoryError`` and
``SandboxError``.

This is a guard against mistakes and casual escapes by generated code, not an OS-level jail: the
child has the parent's user id, file descriptors and network. See the module caveats in
``coevo.safety.sandbox``.
"""

from __future__ import annotations

import builtins
import gc
import importlib
import math
import os
import pickle
import resource
import selectors
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from types import CodeType, MappingProxyType, ModuleType
from typing import Any, TypeVar

from coevo.safety.sandbox.source_policy import ALLOWED_MODULES, check_source

T = TypeVar("T")

_DENIED_MODULE_ATTRIBUTES: Mapping[str, frozenset[str]] = MappingProxyType(
    {
        # update_wrapper(f, g, updated=("__globals__",)) merges a trusted module's globals into
        # the sandbox; singledispatch evaluates string annotations with eval().
        "functools": frozenset({"update_wrapper", "wraps", "singledispatch", "singledispatchmethod"}),
        # Formatter().vformat("{0.__class__}", ...) is str.format's attribute walk under another name.
        "string": frozenset({"Formatter"}),
    }
)

_SAFE_BUILTIN_NAMES = (
    "abs", "all", "any", "bool", "bytes", "callable", "chr", "classmethod", "dict", "divmod",
    "enumerate", "filter", "float", "frozenset", "hash", "int", "isinstance", "issubclass", "iter",
    "len", "list", "map", "max", "min", "next", "object", "ord", "pow", "property", "range", "repr",
    "reversed", "round", "set", "slice", "sorted", "staticmethod", "str", "sum", "super", "tuple",
    "zip", "True", "False", "None", "NotImplemented", "Ellipsis",
    "Exception", "ArithmeticError", "AssertionError", "AttributeError", "ImportError", "IndexError",
    "KeyError", "LookupError", "NotImplementedError", "OverflowError", "RuntimeError",
    "StopIteration", "TypeError", "ValueError", "ZeroDivisionError",
)  # fmt: skip

SANDBOX_MODULE_NAME = "coevo_sandboxed"
"""``__name__`` of the sandbox namespace; class statements copy it into ``__module__``. No such
module exists, so instances of sandbox-defined classes cannot be pickled back to the parent."""


class SandboxTimeout(Exception):
    """The call ran past its time limit and the child was killed."""


class SandboxMemoryError(Exception):
    """The code ran out of the memory it was allowed."""


class SandboxError(Exception):
    """The code (or ``entry``) raised, or the child died without reporting a result."""


# --------------------------------------------------------------------------- runtime


class _ModuleProxy:
    """Read-only view of an allowed module's public, non-module attributes.

    Submodules are left out so that ``json.codecs.open`` does not exist, and there is no
    ``__name__``: ``from json import decoder`` would otherwise fall back to ``sys.modules``.
    """

    __slots__ = ("_label", "_attrs")

    def __init__(self, label: str, attrs: Mapping[str, object]) -> None:
        object.__setattr__(self, "_label", label)
        object.__setattr__(self, "_attrs", MappingProxyType(dict(attrs)))

    def __getattr__(self, name: str) -> Any:
        try:
            return self._attrs[name]
        except KeyError:
            raise AttributeError(f"module {self._label!r} has no attribute {name!r} in the sandbox") from None

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"module {self._label!r} is read-only in the sandbox")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"module {self._label!r} is read-only in the sandbox")

    def __repr__(self) -> str:
        return f"<sandboxed module {self._label!r}>"


_PROXIES: dict[str, _ModuleProxy] = {}


def _module_proxy(name: str) -> _ModuleProxy:
    """Build (once per process) the proxy for an allowed module; ``__all__`` defines 'public'."""
    if name not in _PROXIES:
        module = importlib.import_module(name)
        # a module need not define __all__, nor every name its __all__ lists
        public = getattr(module, "__all__", None) or [n for n in dir(module) if not n.startswith("_")]
        denied = _DENIED_MODULE_ATTRIBUTES.get(name, frozenset())
        attrs = {}
        for attr in public:
            value = getattr(module, attr, None)
            if attr.startswith("_") or attr in denied or value is None or isinstance(value, ModuleType):
                continue
            attrs[attr] = value
        _PROXIES[name] = _ModuleProxy(name, attrs)
    return _PROXIES[name]


def _no_print(*args: object, **kwargs: object) -> None:
    """``print`` in the sandbox does nothing: the child shares the parent's stdout, and a
    processor has no business writing to it (nor can it flood the logs this way)."""


def _restricted_builtins(allowed_modules: frozenset[str]) -> dict[str, object]:
    proxies = {name: _module_proxy(name) for name in sorted(allowed_modules)}

    def restricted_import(
        name: str, globals: Mapping[str, object] | None = None, locals: Mapping[str, object] | None = None,
        fromlist: Sequence[str] = (), level: int = 0,
    ) -> _ModuleProxy:
        if level != 0 or name not in proxies:
            raise ImportError(f"import of {name!r} is not allowed in the sandbox")
        return proxies[name]

    table = {name: getattr(builtins, name) for name in _SAFE_BUILTIN_NAMES}
    table.update(print=_no_print, __build_class__=builtins.__build_class__, __import__=restricted_import)
    return table


# Built before any child exists, so reporting an out-of-memory error never needs to allocate.
_MEMORY_PAYLOAD = pickle.dumps(("memory", None))
_CHILD_FAILED_EXIT = 70
_TOO_LARGE = b"<too large>"  # a sentinel compared by identity
_REPORT_OVERHEAD = 64  # the ("ok", ...) tuple around the result


def _find_prctl() -> Callable[[int, int, int, int, int], int] | None:
    """libc's prctl, looked up in the parent: a forked child of a threaded process must not
    dlopen (the loader's lock may be held by a thread that no longer exists there)."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux
        return None


_PRCTL = _find_prctl()
_PR_SET_PDEATHSIG = 1


def call_in_sandbox(
    source: str,
    entry: Callable[[dict[str, Any]], T],
    *,
    exposed: Mapping[str, object] | None = None,
    time_limit_s: float = 2.0,
    memory_limit_mb: int = 256,
    allowed_modules: frozenset[str] = ALLOWED_MODULES,
    max_result_bytes: int = 1 << 20,
) -> T:
    """Check ``source``, run it in a forked child, and return ``entry(namespace)`` from there.

    The namespace holds the restricted builtins, ``exposed`` (e.g. base classes the source may
    subclass) and whatever the source defines. ``entry`` is trusted parent code; since the child
    is forked it is never pickled, only its return value is, and a pickled result larger than
    ``max_result_bytes`` is refused (``SandboxError``) without being read into memory. The child
    dies with the parent (``PR_SET_PDEATHSIG``), so killing the trainer leaves no orphan.
    """
    if time_limit_s <= 0 or memory_limit_mb <= 0:
        raise ValueError("time_limit_s and memory_limit_mb must be positive")
    check_source(source, allowed_modules=allowed_modules)
    code = compile(source, "<sandboxed>", "exec", dont_inherit=True)
    namespace: dict[str, Any] = dict(exposed or {})
    namespace.update(__builtins__=_restricted_builtins(allowed_modules), __name__=SANDBOX_MODULE_NAME)

    read_fd, write_fd = os.pipe()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # child: never return into the caller's stack
        status = _CHILD_FAILED_EXIT
        try:
            os.close(read_fd)
            _die_with(parent)
            _child_main(write_fd, code, entry, namespace, time_limit_s, memory_limit_mb)
            status = 0
        finally:
            os._exit(status)
    os.close(write_fd)
    payload: bytes | None = None
    try:
        payload, wait_status = _collect(pid, read_fd, time.monotonic() + time_limit_s, max_result_bytes)
    finally:
        os.close(read_fd)
        if payload is None or payload is _TOO_LARGE:  # timeout, too large, or interrupted: no orphan, no zombie
            _kill_and_reap(pid)
    if payload is None:
        raise SandboxTimeout(f"the call exceeded its time limit of {time_limit_s} s")
    if payload is _TOO_LARGE:
        raise SandboxError(f"the call's result is larger than the {max_result_bytes} bytes "
                           "allowed to cross the sandbox")
    return _interpret(payload, wait_status, time_limit_s, memory_limit_mb)


def _die_with(parent: int) -> None:
    """Ask the kernel to SIGKILL this child when the thread that forked it exits (Linux), so a
    kill -9 of the trainer does not leave sandboxed code running; exit at once if it already has."""
    if _PRCTL is not None:  # elsewhere the CPU limit still ends it
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(_CHILD_FAILED_EXIT)


def _child_main(
    write_fd: int, code: CodeType, entry: Callable[[dict[str, Any]], object], namespace: dict[str, Any],
    time_limit_s: float, memory_limit_mb: int,
) -> None:  # fmt: skip
    """Everything the child does. Kept small: the parent may have had threads holding locks."""
    gc.freeze()  # the parent's objects are not ours to collect (or finalise) here
    _apply_limits(time_limit_s, memory_limit_mb)
    try:
        exec(code, namespace)
        result = entry(namespace)
        payload = pickle.dumps(("ok", result), protocol=pickle.HIGHEST_PROTOCOL)
    except MemoryError:
        payload = _MEMORY_PAYLOAD
    except BaseException as err:  # noqa: BLE001 - everything the untrusted code raises is reported
        try:
            payload = pickle.dumps(("error", _describe_exception(err)))
        except MemoryError:
            payload = _MEMORY_PAYLOAD
    view = memoryview(payload)
    while view:
        view = view[os.write(write_fd, view) :]


def _describe_exception(err: BaseException) -> str:
    try:
        message = str(err)
    except Exception:  # noqa: BLE001 - a broken __str__ must not hide the error type
        message = "<unprintable exception>"
    return f"{type(err).__name__}: {message}" if message else type(err).__name__


def _apply_limits(time_limit_s: float, memory_limit_mb: int) -> None:
    """Address space = what the forked image already maps + the allowance; CPU a bit above the
    wall limit (the parent's timer normally fires first); no core files."""
    fd = os.open("/proc/self/statm", os.O_RDONLY)
    try:
        pages = int(os.read(fd, 128).split()[0])
    finally:
        os.close(fd)
    current = pages * os.sysconf("SC_PAGE_SIZE")
    _lower_limit(resource.RLIMIT_AS, current + memory_limit_mb * 2**20)
    cpu = math.ceil(time_limit_s) + 1
    _lower_limit(resource.RLIMIT_CPU, cpu, hard=cpu + 1)
    _lower_limit(resource.RLIMIT_CORE, 0)


def _lower_limit(kind: int, soft: int, hard: int | None = None) -> None:
    _, old_hard = resource.getrlimit(kind)
    hard = soft if hard is None else hard
    if old_hard != resource.RLIM_INFINITY:
        soft, hard = min(soft, old_hard), min(hard, old_hard)
    resource.setrlimit(kind, (soft, hard))


def _collect(pid: int, read_fd: int, deadline: float, max_bytes: int) -> tuple[bytes | None, int]:
    """Read the child's report until EOF, then reap it; ``(None, 0)`` if the deadline passes
    first, ``(_TOO_LARGE, 0)`` once the report passes ``max_bytes`` (the caller kills the child
    in both cases). Reading as we go keeps a large result from blocking the child."""
    chunks: list[bytes] = []
    size = 0
    with selectors.DefaultSelector() as selector:  # epoll: no FD_SETSIZE limit, unlike select()
        selector.register(read_fd, selectors.EVENT_READ)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None, 0
            if selector.select(remaining):
                chunk = os.read(read_fd, 1 << 16)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
                if size > max_bytes + _REPORT_OVERHEAD:
                    return _TOO_LARGE, 0
    # EOF: the child closed its end by exiting; give it until the deadline to finish doing so.
    delay = 0.0005
    while True:
        done, wait_status = os.waitpid(pid, os.WNOHANG)
        if done:
            return b"".join(chunks), wait_status
        if time.monotonic() >= deadline:
            return None, 0
        time.sleep(delay)
        delay = min(delay * 2, 0.02)


def _kill_and_reap(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


def _interpret(payload: bytes, wait_status: int, time_limit_s: float, memory_limit_mb: int) -> Any:
    """Turn the child's report (or its manner of death) into a value or one of our exceptions."""
    memory_message = f"the code exceeded its memory limit of {memory_limit_mb} MB"
    if payload:
        try:
            kind, value = pickle.loads(payload)
        except Exception as err:  # noqa: BLE001 - a truncated or unloadable report
            raise SandboxError(f"could not read the sandbox result ({type(err).__name__}: {err})") from None
        if kind == "ok":
            return value
        if kind == "memory":
            raise SandboxMemoryError(memory_message)
        raise SandboxError(value)
    if os.WIFSIGNALED(wait_status):
        sig = os.WTERMSIG(wait_status)
        name = signal.Signals(sig).name if sig in signal.valid_signals() else str(sig)
        if sig == signal.SIGXCPU:
            raise SandboxTimeout(f"the call exceeded its CPU time limit (about {time_limit_s} s)")
        if sig == signal.SIGKILL:  # not ours (we only kill on timeout): the kernel's OOM killer
            raise SandboxMemoryError(f"{memory_message} (child killed by {name})")
        raise SandboxError(f"the sandbox child died from signal {name} without reporting a result")
    code = os.WEXITSTATUS(wait_status) if os.WIFEXITED(wait_status) else wait_status
    raise SandboxError(f"the sandbox child exited with status {code} without reporting a result")
