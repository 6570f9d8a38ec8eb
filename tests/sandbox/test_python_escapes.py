"""The python tool's escape battery: model-written code tries to leave the jail
(nested chroot, ``/proc/1/root``, remounting its read-only binds, mounting its own tmpfs, new
namespaces, ptrace), reach the host (files, writes, TCP and unix sockets, the trainer's command
line, environment and process list), outlive its cell, and exhaust resources. Run as root, as CI
runs, every attack must be refused or contained by the bubblewrap jail; the unconfined mode runs
only when asked for. The battery runs in the jail whatever ``COEVO_PYTHON_ISOLATION`` says."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import uuid

import pytest

from coevo.safety.sandbox import jail, python_tool
from coevo.safety.sandbox.python_tool import SandboxUnavailable, isolation, run_python
from tests.sandbox.test_python_tool import _gone, _with_marker, run_watched


@pytest.fixture(autouse=True)
def _jailed(monkeypatch):
    """Every test here runs against the jail (it fails, rather than skips, where bwrap cannot run)."""
    monkeypatch.delenv("COEVO_PYTHON_ISOLATION", raising=False)
    isolation.cache_clear()
    assert isolation() == "bwrap"
    yield
    isolation.cache_clear()


def _libc_call(expr: str) -> str:
    """Cell code that evaluates a libc call through ctypes and prints ``ok`` or the errno's name."""
    return ("import ctypes, errno\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            f"r = {expr}\nprint('ok' if r == 0 else errno.errorcode[ctypes.get_errno()])")


def test_nested_chroot_does_not_reach_the_host_root():
    code = ("import os\nos.makedirs('x', exist_ok=True)\nos.chroot('x')\nfor _ in range(64):\n    os.chdir('..')\n"
            "os.chroot('.')\nprint(open('/etc/shadow').read())")
    res = run_python(code)
    assert res.error == "PermissionError: [Errno 1] Operation not permitted: 'x'" and "root:" not in res.stdout


def test_proc_1_root_is_the_jail():
    res = run_python("import os\nprint(sorted(os.listdir('/proc/1/root')))\nopen('/proc/1/root/etc/shadow')")
    assert res.error is not None and "No such file or directory" in res.error
    assert res.stdout.strip() == str(_jail_root_listing())


def _jail_root_listing() -> list[str]:
    return sorted(run_python("import os\nprint(sorted(os.listdir('/')))").stdout.strip()[2:-2].split("', '"))


def test_read_only_binds_cannot_be_remounted_or_written():
    ms_rdonly, ms_remount, ms_bind = 1, 32, 4096
    for target in ("/usr", "/"):
        res = run_python(_libc_call(f"libc.mount(None, b'{target}', None, {ms_remount | ms_bind}, None)"))
        assert res.stdout == "EPERM\n", target
        res = run_python(_libc_call(f"libc.mount(None, b'{target}', None, {ms_remount | ms_bind | ms_rdonly}, None)"))
        assert res.stdout == "EPERM\n", target
    for path in ("/usr/pwned", "/pwned", "/box/cell.py", "/proc/1/root/usr/pwned"):
        res = run_python(f"open({path!r}, 'w').write('x')")
        assert res.error is not None and ("Read-only file system" in res.error or "Permission denied" in res.error
                                          or "No such file" in res.error), path
    assert not os.path.exists("/usr/pwned") and not os.path.exists("/pwned")


def test_a_self_mounted_tmpfs_is_refused():
    code = "import os\nos.makedirs('t', exist_ok=True)\n" + _libc_call(
        "libc.mount(b'none', b't', b'tmpfs', 0, b'size=200m')").split("\n", 1)[1]
    res = run_python("import ctypes, errno\nlibc = ctypes.CDLL(None, use_errno=True)\n" + code)
    assert res.stdout == "EPERM\n"


@pytest.mark.parametrize("flag", ["CLONE_NEWUSER", "CLONE_NEWNS", "CLONE_NEWNET", "CLONE_NEWPID"])
def test_new_namespaces_are_refused(flag):
    value = jail._NAMESPACE_FLAGS[flag]
    assert run_python(_libc_call(f"libc.unshare({value})")).stdout == "EPERM\n"
    if os.uname().machine == "x86_64":  # a raw clone(flag | SIGCHLD); a child that got through exits at once
        code = _libc_call(f"libc.syscall(56, {value | 17}, 0, 0, 0, 0)").replace("\nprint(", "\nif r == 0:\n"
                                                                                  "    os._exit(0)\nprint(")
        assert run_python("import os\n" + code).stdout == "EPERM\n"


def test_the_seccomp_filter_refuses_calls_an_unprivileged_user_could_make():
    """Calls that, without the filter, fail with another errno for an unprivileged user (bad
    arguments): EPERM can only come from the filter."""
    import pyseccomp

    arch = pyseccomp.system_arch()
    for name in ("io_uring_setup", "perf_event_open", "name_to_handle_at", "pidfd_getfd", "keyctl", "ptrace"):
        number = pyseccomp.resolve_syscall(arch, name)
        assert run_python(_libc_call(f"libc.syscall({number}, -1, 0, -1, -1, 0)")).stdout == "EPERM\n", name


def test_the_cell_has_no_capabilities_and_is_not_root_on_the_host():
    marker = f"coevo-caps-{uuid.uuid4().hex}"
    code = ("status = open('/proc/self/status').read()\n"
            "print([line.split()[1] for line in status.splitlines() if line.startswith(('CapEff', 'CapPrm', 'CapBnd'))])\n"
            f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', 'import time; time.sleep(1.0)  # {marker}'])\n")
    host_uids: list[str] = []

    def watch() -> None:
        for _ in range(100):
            for pid in _with_marker(marker):
                with open(f"/proc/{pid}/status") as f:
                    host_uids.extend(line.split()[1] for line in f if line.startswith("Uid:"))
                return
            threading.Event().wait(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    res = run_python(code)
    watcher.join()
    assert res.stdout.startswith("['0000000000000000', '0000000000000000', '0000000000000000']")
    assert host_uids and all(uid != "0" for uid in host_uids)  # nobody on the host, even under a root trainer


def test_host_files_are_not_visible(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("hunter2")
    for path in (secret, "/etc/passwd", "/etc/shadow", os.path.expanduser("~/.bashrc"), os.getcwd()):
        res = run_python(f"print(open({str(path)!r}).read())")
        assert res.error is not None and "hunter2" not in res.stdout and "root:" not in res.stdout, path
    shown = set(_jail_root_listing())
    assert {"usr", "box", "dev", "proc"} <= shown and not {"etc", "home", "tmp", "work", "root"} & shown


def test_writes_outside_the_work_directory_fail_and_nothing_reaches_the_host(tmp_path):
    target = tmp_path / "pwned"
    for path in (target, "/usr/pwned", "/pwned", "/box/cell.py"):
        res = run_python(f"open({str(path)!r}, 'w').write('x')")
        assert res.error is not None and ("Read-only file system" in res.error or "No such file" in res.error), path
    assert not target.exists()
    res = run_python("open('scratch', 'w').write('ok')\nprint(open('scratch').read())")
    assert res.error is None and res.stdout == "ok\n"  # its own work directory is writable


def test_no_unix_socket_of_the_host_is_reachable(tmp_path):
    path = str(tmp_path / "host.sock")
    servers = []
    for address in (path, "\0coevo-abstract-" + uuid.uuid4().hex):
        server = socket.socket(socket.AF_UNIX)
        server.bind(address)
        server.listen(1)
        servers.append((server, address))
    try:
        for _, address in servers:
            for target in (address, "/proc/1/root" + address if address.startswith("/") else address):
                res = run_python(f"import socket\nsocket.socket(socket.AF_UNIX).connect({target!r})\nprint('connected')")
                assert "connected" not in res.stdout and res.error is not None, target
    finally:
        for server, _ in servers:
            server.close()


def test_no_socket_reaches_the_host():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(3.0)
    accepted: list[object] = []

    def accept() -> None:
        try:
            accepted.append(server.accept())
        except OSError:
            pass

    thread = threading.Thread(target=accept)
    thread.start()
    port = server.getsockname()[1]
    res = run_python(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint('connected')")
    public = run_python("import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=2)\nprint('connected')")
    thread.join()
    server.close()
    assert not accepted and "connected" not in res.stdout and res.error is not None
    assert "connected" not in public.stdout and public.error is not None


def test_the_trainers_environment_command_line_and_host_processes_are_not_visible():
    # The "trainer" is a fresh process started with the key in its environment and a marker in its
    # command line (as /proc shows them), and it runs the cell.
    marker = f"coevo-trainer-{uuid.uuid4().hex}"
    cell = ("import os\nfound, pids = [], [p for p in os.listdir('/proc') if p.isdigit()]\n"
            "for pid in [str(os.getppid()), 'self'] + pids:\n    for part in ('environ', 'cmdline'):\n        try:\n"
            "            found.append(open(f'/proc/{pid}/{part}', 'rb').read())\n        except OSError:\n            pass\n"
            f"print(b'sk-coevo-escape' in b''.join(found), {marker.encode()!r} in b''.join(found), len(pids) <= 3, "
            "os.environ.get('OPENAI_API_KEY'))")
    trainer = f"from coevo.safety.sandbox.python_tool import run_python\nres = run_python({cell!r})\nprint(res.stdout, res.error)"
    env = {**os.environ, "OPENAI_API_KEY": "sk-coevo-escape-test-0123456789"}
    env.pop("COEVO_PYTHON_ISOLATION", None)
    out = subprocess.run([sys.executable, "-c", trainer, marker], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "False False True None\n None\n"


def test_a_detached_process_dies_with_its_cell():
    marker = f"coevo-detached-{uuid.uuid4().hex}"
    code = (f"import subprocess, sys, time\nsubprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)  "
            f"# {marker}'], start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
            "time.sleep(0.5)\n")
    res, seen = run_watched(code, marker, timeout_s=5.0)
    assert res.error is None and seen and _gone(marker)


def test_a_fork_bomb_ends_with_its_cell():
    marker = f"coevo-bomb-{uuid.uuid4().hex}"
    code = (f"import subprocess, sys, time\nprocs = []\ntry:\n    for _ in range(200):\n"
            f"        procs.append(subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)  # {marker}']))\n"
            "except OSError as err:\n    print('refused', type(err).__name__)\nprint(len(procs))\n")
    res, seen = run_watched(code, marker, timeout_s=10.0)
    assert seen and _gone(marker, within_s=5.0)
    assert "refused" in res.stdout  # RLIMIT_NPROC binds: the jail runs as nobody, even under a root trainer


def test_filling_the_disk_stops_at_the_work_directory_limit():
    code = ("n = 0\ntry:\n    while n < 100:\n        open(f'f{n}', 'wb').write(b'x' * (1 << 20))\n        n += 1\n"
            "except OSError as err:\n    print(n, err.errno)\n")
    res = run_python(code, timeout_s=10.0)
    written, errno = map(int, res.stdout.split())
    assert errno == 28 and written <= 16  # ENOSPC at the 16 MiB tmpfs


def test_cpu_memory_and_output_bombs_are_bounded():
    assert run_python("while True:\n    pass", timeout_s=1.0).timed_out
    assert run_python("x = bytearray(10**9)", memory_mb=128).error == "memory limit of 128 MB exceeded"
    assert len(run_python("print('x' * 10**7)", max_output_chars=1000).stdout) < 1100


def test_isolation_override_is_checked(monkeypatch, caplog):
    for old in ("bogus", "process", "namespaces"):
        monkeypatch.setenv("COEVO_PYTHON_ISOLATION", old)
        isolation.cache_clear()
        with pytest.raises(ValueError, match=f"COEVO_PYTHON_ISOLATION='{old}' is not allowed"):
            isolation()
    monkeypatch.setenv("COEVO_PYTHON_ISOLATION", "unconfined")
    isolation.cache_clear()
    with caplog.at_level("WARNING", logger=python_tool.__name__):
        assert isolation() == "unconfined"
    assert "THE PYTHON TOOL IS NOT ISOLATED" in caplog.text
    res = run_python("import os\nprint(os.getcwd() != '/box/work')")
    assert res.stdout == "True\n"  # it really ran outside the jail, as asked


@pytest.mark.parametrize("problem", ["bubblewrap is not installed", "bwrap failed: No permissions to create new namespace"])
def test_code_never_runs_unconfined_without_the_opt_in(monkeypatch, problem):
    monkeypatch.setattr(python_tool, "_probe_jail", lambda: problem)
    isolation.cache_clear()
    with pytest.raises(SandboxUnavailable, match="COEVO_PYTHON_ISOLATION=unconfined") as err:
        run_python("print('escaped')")
    assert problem in str(err.value)


def test_a_missing_bwrap_or_libseccomp_is_named(monkeypatch):
    monkeypatch.setattr(jail.shutil, "which", lambda name, path=None: None)
    with pytest.raises(SandboxUnavailable, match="apt-get install bubblewrap"):
        jail.bwrap_argv(["true"], cell_fd=0, seccomp_fd=0, work_bytes=1)
    monkeypatch.undo()
    import pyseccomp

    def no_libseccomp(**_):  # what pyseccomp does when libseccomp.so.2 is missing: ctypes finds no symbol
        raise AttributeError("seccomp_init")

    monkeypatch.setattr(pyseccomp, "SyscallFilter", no_libseccomp)
    jail._seccomp_program.cache_clear()  # compiled once per process: build it again without the library
    try:
        with pytest.raises(SandboxUnavailable, match="libseccomp2"):
            jail.seccomp_filter_fd()
    finally:
        monkeypatch.undo()
        jail._seccomp_program.cache_clear()


@pytest.mark.parametrize("param,value", [("timeout_s", 100000.0), ("timeout_s", 0.0), ("memory_mb", 10**6),
                                         ("max_output_chars", 10**9)])
def test_a_proposal_cannot_raise_the_python_tools_limits(param, value):
    from coevo.harness import ParamError
    from coevo.harness.library import PythonExecutor

    with pytest.raises(ParamError, match=f"parameter '{param}' must be in"):
        PythonExecutor(**{param: value})


def test_a_run_whose_agent_can_run_code_stops_before_any_work_when_the_jail_cannot_run(monkeypatch, tmp_path):
    """The main job's env offers a python tool: without a working jail (and without the opt-in)
    train.py stops before the run directory and the model, naming the fix."""
    from coevo.loop.build import run
    from tests.test_config import compose_cfg

    monkeypatch.setattr(python_tool, "_probe_jail", lambda: "bubblewrap is not installed")
    isolation.cache_clear()
    cfg = compose_cfg(["env=reasoning_easy", "model.name=/no/such/model", f"run_dir={tmp_path / 'run'}"])
    with pytest.raises(SandboxUnavailable, match="bubblewrap is not installed"):
        run(cfg)
    assert not (tmp_path / "run").exists()
