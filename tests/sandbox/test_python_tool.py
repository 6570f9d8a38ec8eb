"""The agent's python tool: output, errors, limits, and isolation from the host process."""

from __future__ import annotations

import os
import tempfile
import threading
import time
import uuid

from coevo.safety.sandbox.python_tool import PythonResult, isolation, run_python


def _with_marker(marker: str) -> list[int]:
    """Host pids whose command line holds ``marker`` (seen from the host in either isolation
    mode: a child PID namespace's processes are visible from its parent namespace)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmdline = f.read()
                with open(f"/proc/{entry}/stat") as f:
                    state = f.read().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if marker.encode() in cmdline and state not in ("Z", "X") and int(entry) != os.getpid():
                found.append(int(entry))
    return found


def _gone(marker: str, within_s: float = 2.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not _with_marker(marker):
            return True
        time.sleep(0.02)
    return False


def run_watched(code: str, marker: str, **kwargs) -> tuple[PythonResult, bool]:
    """``run_python(code)`` while the host watches for a process carrying ``marker``: the result,
    and whether one was seen alive during the call (so the test cannot pass without a spinner)."""
    seen = threading.Event()
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            if _with_marker(marker):
                seen.set()
                return
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        res = run_python(code, **kwargs)
    finally:
        done.set()
        watcher.join()
    return res, seen.is_set()


def spinner(marker: str) -> str:
    """Cell code starting a busy child process whose command line carries ``marker``."""
    return (f"import subprocess, sys, time\nsubprocess.Popen([sys.executable, '-c', 'while True: pass  # {marker}'])\n"
            "time.sleep(0.5)\n")


def test_prints_are_captured():
    res = run_python("print('hello')\nprint(1 + 2)")
    assert res == PythonResult(stdout="hello\n3\n", error=None, timed_out=False, seconds=res.seconds)
    assert 0 < res.seconds < 5


def test_last_expression_is_echoed_like_a_notebook():
    assert run_python("x = 21\nx * 2").stdout == "42\n"
    assert run_python("'a'\n'b'").stdout == "'b'\n"  # only the last statement
    assert run_python("x = 1\nNone").stdout == ""  # None is not echoed
    assert run_python("print('p')").stdout == "p\n"  # print() returns None: no extra line


def test_exception_gives_the_last_traceback_line():
    res = run_python("print('before')\n1 / 0")
    assert res.error == "ZeroDivisionError: division by zero"
    assert res.stdout == "before\n" and not res.timed_out


def test_syntax_error_is_reported():
    assert run_python("def f(:\n").error.startswith("SyntaxError")


def test_exit_status_without_traceback_is_reported():
    res = run_python("import sys\nsys.exit(3)")
    assert res.error == "exited with status 3"
    assert run_python("import sys\nsys.exit(0)").error is None


def test_timeout_kills_the_whole_process_group():
    start = time.monotonic()
    marker = f"coevo-spin-{uuid.uuid4().hex}"
    res, seen = run_watched(spinner(marker) + "print('spinning', flush=True)\nwhile True:\n    pass\n", marker,
                            timeout_s=2.0)
    assert time.monotonic() - start < 4.0
    assert res.timed_out and res.error == "timed out after 2.0 s"
    assert res.stdout == "spinning\n"  # output before the timeout survives
    assert seen and _gone(marker)  # the spinner ran, and died with the cell


def test_background_process_does_not_outlive_a_finished_cell():
    marker = f"coevo-spin-{uuid.uuid4().hex}"
    res, seen = run_watched(spinner(marker), marker, timeout_s=5.0)
    assert res.error is None and not res.timed_out
    assert seen and _gone(marker)


def test_memory_limit():
    res = run_python("x = bytearray(10**9)\nprint('allocated')", memory_mb=128)
    assert res.error == "memory limit of 128 MB exceeded"
    assert "allocated" not in res.stdout


def test_file_size_limit():
    res = run_python("with open('big', 'wb') as f:\n    f.write(b'x' * (4 << 20))")
    assert res.error is not None and "File too large" in res.error


def test_output_is_truncated_with_a_marker():
    res = run_python("print('x' * 1000)", max_output_chars=100)
    body, marker = res.stdout[:100], res.stdout[100:]
    assert body == "x" * 100
    assert "901 more characters" in marker  # 1000 x's and a newline, 100 kept


def test_stdin_is_closed():
    assert run_python("input()").error.startswith("EOFError")


def test_temp_dir_is_removed():
    before = {n for n in os.listdir(tempfile.gettempdir()) if n.startswith("coevo-python-")}
    res = run_python("import os\nos.makedirs('a/b')\nopen('a/b/f', 'w').write('x')\nprint(os.getcwd())")
    assert res.error is None
    if isolation() == "unconfined":  # the cell's working directory is a host directory
        workdir = res.stdout.strip()
        assert workdir.startswith(tempfile.gettempdir())
        assert not os.path.exists(workdir) and not os.path.exists(os.path.dirname(workdir))
    else:
        assert res.stdout == "/box/work\n"
    assert {n for n in os.listdir(tempfile.gettempdir()) if n.startswith("coevo-python-")} <= before


def test_parent_environment_is_not_visible(monkeypatch):
    monkeypatch.setenv("COEVO_TEST_SECRET", "hunter2")
    res = run_python("import os\nprint(dict(os.environ))\nprint(os.environ.get('COEVO_TEST_SECRET'))")
    assert res.error is None
    assert "hunter2" not in res.stdout and res.stdout.endswith("None\n")


def test_site_packages_are_not_importable():
    # -I -S: only the standard library, whatever the host's virtual environment holds
    assert run_python("import pytest").error == "ModuleNotFoundError: No module named 'pytest'"
