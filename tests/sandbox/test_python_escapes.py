"""The python tool's escape battery (issue 13): model-written code tries to read and write host
files, open sockets, read the trainer's environment through /proc, outlive its cell, and exhaust
resources. It runs against the isolation mode this machine supports (``isolation()``): the
``namespaces`` jail must refuse every attack; the ``process`` fallback is tested for what it
promises (environment, limits, no survivors) and the rest is skipped with the reason."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import uuid

import pytest

from coevo.sandbox.python_tool import _shown_dirs, isolation, run_python
from tests.sandbox.test_python_tool import _gone, run_watched

JAILED = isolation() == "namespaces"
needs_jail = pytest.mark.skipif(not JAILED, reason="process isolation shares the host's filesystem, network and "
                                                   "process table (the tool logs a warning)")


@needs_jail
def test_host_files_are_not_visible(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("hunter2")
    for path in (secret, "/etc/passwd", os.path.expanduser("~/.bashrc"), os.getcwd()):
        res = run_python(f"print(open({str(path)!r}).read())")
        assert res.error is not None and "hunter2" not in res.stdout and "root:" not in res.stdout, path
    listing = run_python("import os\nprint(sorted(os.listdir('/')))")
    shown = {d.split("/")[1] for d in _shown_dirs()} | {"box", "dev", "proc"}  # /usr, /lib, the interpreter's prefix
    assert listing.stdout.strip() == str(sorted(shown))
    assert not {"etc", "home", "tmp", "work"} & shown


@needs_jail
def test_writes_outside_the_work_directory_fail_and_nothing_reaches_the_host(tmp_path):
    target = tmp_path / "pwned"
    for path in (target, "/usr/pwned", "/pwned", "/box/cell.py"):
        res = run_python(f"open({str(path)!r}, 'w').write('x')")
        assert res.error is not None and ("Read-only file system" in res.error or "No such file" in res.error), path
    assert not target.exists()
    res = run_python("open('scratch', 'w').write('ok')\nprint(open('scratch').read())")
    assert res.error is None and res.stdout == "ok\n"  # its own work directory is writable


@needs_jail
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


def test_the_trainers_environment_is_not_readable():
    # The "trainer" is a fresh process started with the key in its environment (as /proc shows
    # the environment a process was started with), and it runs the cell.
    cell = ("import os\nfound = []\nfor pid in [str(os.getppid()), 'self'] + os.listdir('/proc'):\n    try:\n"
            "        found.append(open(f'/proc/{pid}/environ', 'rb').read())\n    except OSError:\n        pass\n"
            "print(b'sk-coevo-escape' in b''.join(found), os.environ.get('OPENAI_API_KEY'))")
    trainer = f"from coevo.sandbox.python_tool import run_python\nres = run_python({cell!r})\nprint(res.stdout, res.error)"
    env = {**os.environ, "OPENAI_API_KEY": "sk-coevo-escape-test-0123456789"}
    out = subprocess.run([sys.executable, "-c", trainer], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    if JAILED:
        assert out.stdout == "False None\n None\n"
    else:  # the fallback hides the variable from the cell's own environment only
        assert out.stdout.endswith(" None\n None\n")


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
    if os.geteuid() != 0:  # the kernel exempts the host's root from RLIMIT_NPROC
        assert "refused" in res.stdout


@needs_jail
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


def test_isolation_override_is_checked(monkeypatch):
    monkeypatch.setenv("COEVO_PYTHON_ISOLATION", "bogus")
    isolation.cache_clear()
    try:
        with pytest.raises(ValueError, match="COEVO_PYTHON_ISOLATION='bogus'"):
            isolation()
        monkeypatch.setenv("COEVO_PYTHON_ISOLATION", "process")
        isolation.cache_clear()
        assert isolation() == "process"
        assert run_python("print(1)").stdout == "1\n"
    finally:
        monkeypatch.delenv("COEVO_PYTHON_ISOLATION")
        isolation.cache_clear()


def test_the_fallback_warns_loudly(monkeypatch, caplog):
    import coevo.sandbox.python_tool as tool

    monkeypatch.delenv("COEVO_PYTHON_ISOLATION", raising=False)
    monkeypatch.setattr(tool, "_probe_namespaces", lambda: "util-linux unshare or chroot is not installed")
    isolation.cache_clear()
    try:
        with caplog.at_level("WARNING", logger=tool.__name__):
            assert isolation() == "process"
        assert "THE PYTHON TOOL IS NOT ISOLATED" in caplog.text and "unshare" in caplog.text
        monkeypatch.setenv("COEVO_PYTHON_ISOLATION", "namespaces")
        isolation.cache_clear()
        with pytest.raises(RuntimeError, match="namespace jail does not work here"):
            isolation()
    finally:
        isolation.cache_clear()


@pytest.mark.parametrize("param,value", [("timeout_s", 100000.0), ("timeout_s", 0.0), ("memory_mb", 10**6),
                                         ("max_output_chars", 10**9)])
def test_a_proposal_cannot_raise_the_python_tools_limits(param, value):
    from coevo.harness import ParamError
    from coevo.harness.library import PythonExecutor

    with pytest.raises(ParamError, match=f"parameter '{param}' must be in"):
        PythonExecutor(**{param: value})
