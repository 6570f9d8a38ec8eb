"""A SIGTERM during a run closes the env: Python's default SIGTERM action skips every ``finally``,
so ``coevo.loop.build.run`` closing its env would never run and an env's child process (a
TextWorld JVM, a simulator) would outlive the killed trainer. ``coevo.loop.termination.sigterm_raises``
turns SIGTERM into ``SystemExit`` for the length of the run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from coevo.envs.arithmetic import ArithmeticEnv
from coevo.loop.termination import sigterm_raises

ROOT = Path(__file__).resolve().parents[1]
MARK = "4321.5"  # the env's child is `sleep 4321.5`: told apart from any other process


class SleepChildEnv(ArithmeticEnv):
    """The arithmetic env holding a `sleep` child until ``close``, as a TextWorld env holds its JVMs."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.child = subprocess.Popen(["sleep", MARK])

    def close(self) -> None:
        self.child.kill()
        self.child.wait()


def _marked_children(pid: int) -> list[psutil.Process]:
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    out = []
    for p in children:
        try:
            if p.cmdline() == ["sleep", MARK]:
                out.append(p)
        except psutil.Error:
            pass
    return out


def _wait_for(what, timeout_s: float):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        value = what()
        if value:
            return value
        time.sleep(0.2)
    return what()


def test_sigterm_during_a_run_closes_the_env_and_exits_non_zero(tmp_path):
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(ROOT / "train.py"), "experiment=smoke", "mode=static", "rounds=200",
           'env.name="tests.test_sigterm:SleepChildEnv"', f"hydra.run.dir={run_dir}"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    child = None
    try:
        children = _wait_for(lambda: _marked_children(proc.pid), 120)
        assert children, "the env's child never started"
        child = children[0]
        # the model is loaded and the run directory written: the run has started
        assert _wait_for(lambda: (run_dir / "config.yaml").is_file() or proc.poll() is not None, 300)
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
        assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE  # env.close() ran
        assert proc.returncode not in (0, -signal.SIGTERM)  # exited through Python, not by the signal
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if child is not None and child.is_running():
            child.kill()


def _sigterm_then(cleanup) -> pytest.ExceptionInfo:
    """SIGTERM this process inside ``sigterm_raises`` and run ``cleanup`` in the ``finally`` the
    handler unwinds through; returns the ``SystemExit`` it raised."""
    with pytest.raises(SystemExit) as exit_info:
        with sigterm_raises():
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)  # the handler interrupts this
            finally:
                cleanup()
    return exit_info


def test_the_handler_raises_runs_finally_and_is_restored():
    before = signal.getsignal(signal.SIGTERM)
    cleaned = []
    exit_info = _sigterm_then(lambda: cleaned.append(True))
    assert exit_info.value.code == 128 + signal.SIGTERM and cleaned == [True]
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_second_sigterm_during_the_cleanup_is_ignored(caplog):
    """The cleanup the first SIGTERM unwinds through (a checkpoint write, an env's close) finishes
    even when a second SIGTERM arrives in the middle of it."""
    before = signal.getsignal(signal.SIGTERM)
    cleaned = []

    def cleanup():
        os.kill(os.getpid(), signal.SIGTERM)  # mid-cleanup: must not raise again
        time.sleep(0.05)
        cleaned.append("all of it")

    exit_info = _sigterm_then(cleanup)
    assert exit_info.value.code == 128 + signal.SIGTERM and cleaned == ["all of it"]
    assert "SIGTERM again" in caplog.text
    assert signal.getsignal(signal.SIGTERM) is before


def test_outside_the_main_thread_nothing_changes():
    seen = []

    def body():
        with sigterm_raises():
            seen.append(signal.getsignal(signal.SIGTERM))

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    assert seen == [signal.getsignal(signal.SIGTERM)]
