"""The python tool's jail: bubblewrap (``bwrap``) with a seccomp filter, as an unprivileged user.

Why bubblewrap: confinement has to hold against code that is actively trying to leave, which a
hand-written ``unshare`` + ``chroot`` script did not (a nested ``chroot`` or ``/proc/1/root``
reached the host's root file system, and the cell kept the user namespace's full capability set).
bwrap is the sandbox Flatpak is built on; it does what such a jail needs and nothing else:

* **an unprivileged identity**: when the trainer runs as root, bwrap itself is started as
  ``nobody`` (uid/gid 65534), so the cell's uid maps to an unprivileged host uid; inside, its
  capability set is empty and further user namespaces are disabled (``--disable-userns``);
* **its own namespaces**: user, mount, PID (a fresh ``/proc``: ``/proc/1`` is the jail's own init,
  the host's processes and the trainer's command line are not visible), network (no interface
  reaches anything), IPC, UTS and cgroup;
* **``pivot_root`` into a read-only tmpfs** that shows only ``/usr`` (plus the ``/bin``, ``/lib*``
  links), the interpreter's install prefix, four ``/dev`` nodes, the cell file and a size-capped
  tmpfs work directory. Binds are read-only and, without ``CAP_SYS_ADMIN`` and with ``mount``
  refused by seccomp, cannot be remounted;
* **a seccomp filter** (built with libseccomp, ``SECCOMP_DENIED``) that refuses the calls an
  escape or a kernel attack starts with (``mount``, ``chroot``, ``pivot_root``, ``unshare``,
  ``setns``, ``ptrace``, ``bpf``, ``io_uring``, namespace flags to ``clone``, ...); system calls of
  another ABI (32-bit calls on x86-64) kill the process.

The resource limits (address space, CPU, file size, process count) are set by the cell's wrapper
in ``coevo.safety.sandbox.python_tool``; run as ``nobody``, the process limit binds even for a root trainer.
"""

from __future__ import annotations

import errno
import functools
import os
import shutil
import stat
import sys

UNPRIVILEGED_ID = 65534
"""uid and gid bwrap runs as when the trainer is root (``nobody``/``nogroup``)."""

SECCOMP_DENIED = (
    # file-system and namespace escapes
    "mount", "umount2", "pivot_root", "chroot", "unshare", "setns", "fsopen", "fsconfig", "fsmount", "fspick",
    "open_tree", "move_mount", "mount_setattr", "open_by_handle_at", "name_to_handle_at",
    # reaching other processes or the kernel
    "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "kexec_load", "kexec_file_load",
    "init_module", "finit_module", "delete_module", "bpf", "perf_event_open", "userfaultfd", "keyctl", "add_key",
    "request_key", "io_uring_setup", "io_uring_enter", "io_uring_register", "iopl", "ioperm", "syslog", "acct",
    "quotactl", "swapon", "swapoff", "reboot", "settimeofday", "clock_settime", "adjtimex", "sethostname",
    "setdomainname",
)  # fmt: skip
"""System calls the cell's seccomp filter refuses with EPERM."""

_NAMESPACE_FLAGS = {"CLONE_NEWUSER": 0x10000000, "CLONE_NEWPID": 0x20000000, "CLONE_NEWNET": 0x40000000,
                    "CLONE_NEWNS": 0x00020000, "CLONE_NEWIPC": 0x08000000, "CLONE_NEWUTS": 0x04000000,
                    "CLONE_NEWCGROUP": 0x02000000, "CLONE_NEWTIME": 0x00000080}  # fmt: skip
_DEVICES = ("/dev/null", "/dev/zero", "/dev/random", "/dev/urandom")


class SandboxUnavailable(RuntimeError):
    """The jail cannot run on this machine; the message says why and how to fix it."""


def seccomp_filter_fd() -> int:
    """A memfd holding the compiled seccomp program (``bwrap --seccomp FD`` reads it)."""
    return _memfd("coevo-seccomp", _seccomp_program())


@functools.cache
def _seccomp_program() -> bytes:
    """The filter compiled to BPF once per process: every cell loads the same program."""
    try:
        import pyseccomp as seccomp
    except ImportError as err:  # pragma: no cover - a dependency of coevo on Linux
        raise SandboxUnavailable(f"the pyseccomp package is missing ({err}); pip install pyseccomp") from err
    try:
        rules = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
        for name in SECCOMP_DENIED:
            rules.add_rule(seccomp.ERRNO(errno.EPERM), name)
        for flag in _NAMESPACE_FLAGS.values():  # clone's first argument carries the namespace flags
            rules.add_rule(seccomp.ERRNO(errno.EPERM), "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
        # clone3 passes its flags in memory, where a filter cannot read them: say "not implemented"
        # so that libc falls back to clone, whose flags the rules above check
        rules.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
        fd = os.memfd_create("coevo-seccomp-build")
        try:
            with open(fd, "wb", closefd=False) as f:
                rules.export_bpf(f)
            os.lseek(fd, 0, os.SEEK_SET)
            with open(fd, "rb", closefd=False) as f:
                return f.read()
        finally:
            os.close(fd)
    except (AttributeError, OSError, RuntimeError) as err:
        raise SandboxUnavailable(f"libseccomp could not build the filter ({type(err).__name__}: {err}); "
                                 "install libseccomp2 (Debian/Ubuntu: apt-get install libseccomp2)") from err


def _memfd(name: str, data: bytes) -> int:
    """A memfd holding ``data``, positioned at its start, for a child to read through ``pass_fds``."""
    fd = os.memfd_create(name)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def data_fd(text: str) -> int:
    """A memfd holding ``text``: the cell reaches the jail without a file on the host's disk."""
    return _memfd("coevo-cell", text.encode("utf-8"))


def runs_as() -> dict[str, object]:
    """``subprocess.Popen`` arguments that start bwrap unprivileged: ``nobody`` when we are root,
    else ourselves (already unprivileged)."""
    if os.geteuid() != 0:
        return {}
    return {"user": UNPRIVILEGED_ID, "group": UNPRIVILEGED_ID, "extra_groups": []}


@functools.cache
def cell_interpreter() -> tuple[str, tuple[str, ...]]:
    """The interpreter that runs cells and the directories it needs, as a path the jail's user can
    reach. The trainer's own interpreter when it can (the cell then sees the same Python);
    otherwise a system ``python3`` under ``/usr`` (a root trainer's pyenv under ``/root`` is not
    reachable by ``nobody``). Cells use the standard library only, so any Python 3 serves."""
    real = os.path.realpath(sys.executable)
    own = (real, _prefix_dirs(real, os.path.realpath(sys.base_prefix)))
    if not runs_as() or all(_reachable_by_others(p) for p in (real, *own[1])):
        return own
    system = shutil.which("python3", path="/usr/bin:/bin")
    if system is not None:
        system = os.path.realpath(system)
        return system, _prefix_dirs(system, "/usr")
    raise SandboxUnavailable(f"the interpreter {real} is not readable by uid {UNPRIVILEGED_ID} (a parent directory "
                             "is closed to other users) and there is no system python3 under /usr/bin")


def _prefix_dirs(executable: str, prefix: str) -> tuple[str, ...]:
    """Directories outside ``/usr`` that the interpreter needs (its install prefix)."""
    dirs = []
    for extra in (prefix, os.path.dirname(executable)):
        if extra != "/usr" and not extra.startswith("/usr/") and not any(extra.startswith(d + "/") for d in dirs):
            dirs.append(extra)
    return tuple(dirs)


def _reachable_by_others(path: str) -> bool:
    """True when every directory above ``path`` may be searched by other users and ``path`` read."""
    try:
        if not os.stat(path).st_mode & stat.S_IROTH:
            return False
        parent = os.path.dirname(path)
        while parent != "/":
            if not os.stat(parent).st_mode & stat.S_IXOTH:
                return False
            parent = os.path.dirname(parent)
    except OSError:
        return False
    return True


def bwrap_argv(command: list[str], *, cell_fd: int, seccomp_fd: int, work_bytes: int) -> list[str]:
    """The bwrap command line running ``command`` in the jail, with the cell (from ``cell_fd``) at
    ``/box/cell.py`` and a ``work_bytes`` tmpfs at ``/box/work`` as its working directory."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxUnavailable("bubblewrap is not installed (Debian/Ubuntu: apt-get install bubblewrap; "
                                 "scripts/bootstrap.sh installs it when run as root)")
    argv = [bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session",
            "--cap-drop", "ALL", "--ro-bind", "/usr", "/usr"]  # fmt: skip
    for top in ("/bin", "/sbin", "/lib", "/lib64", "/lib32"):
        if os.path.islink(top):
            argv += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            argv += ["--ro-bind", top, top]
    for extra in cell_interpreter()[1]:
        argv += ["--ro-bind", extra, extra]
    for node in _DEVICES:
        argv += ["--dev-bind", node, node]
    argv += ["--proc", "/proc", "--size", str(work_bytes), "--perms", "0777", "--tmpfs", "/box/work",
             "--ro-bind-data", str(cell_fd), "/box/cell.py", "--remount-ro", "/", "--chdir", "/box/work",
             "--seccomp", str(seccomp_fd), "--", *command]  # fmt: skip
    return argv
