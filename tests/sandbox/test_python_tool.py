"""The agent's python tool: output, errors, limits, and isolation from the host process."""

from __future__ import annotations

import os
import tempfile
import time

from coevo.sandbox.python_tool import PythonResult, run_python


def _alive(pid: int) -> bool:
    """Running (not a zombie waiting for its new parent to reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def _wait_dead(pid: int, within_s: float = 2.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.02)
    return False


SPAWN_SPINNER = """
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
print(child.pid, flush=True)
"""


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
    res = run_python(SPAWN_SPINNER + "while True:\n    pass\n", timeout_s=1.0)
    assert time.monotonic() - start < 3.0
    assert res.timed_out and res.error == "timed out after 1.0 s"
    assert _wait_dead(int(res.stdout.split()[0]))  # output before the timeout survives, and the spinner died


def test_background_process_does_not_outlive_a_finished_cell():
    res = run_python(SPAWN_SPINNER, timeout_s=3.0)
    assert res.error is None and not res.timed_out
    assert _wait_dead(int(res.stdout.split()[0]))


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
    res = run_python("import os\nos.makedirs('a/b')\nopen('a/b/f', 'w').write('x')\nprint(os.getcwd())")
    workdir = res.stdout.strip()
    assert res.error is None and workdir.startswith(tempfile.gettempdir())
    assert not os.path.exists(workdir) and not os.path.exists(os.path.dirname(workdir))


def test_parent_environment_is_not_visible(monkeypatch):
    monkeypatch.setenv("COEVO_TEST_SECRET", "hunter2")
    res = run_python("import os\nprint(dict(os.environ))\nprint(os.environ.get('COEVO_TEST_SECRET'))")
    assert res.error is None
    assert "hunter2" not in res.stdout and res.stdout.endswith("None\n")


def test_site_packages_are_not_importable():
    # -I -S: only the standard library, whatever the host's virtual environment holds
    assert run_python("import pytest").error == "ModuleNotFoundError: No module named 'pytest'"
