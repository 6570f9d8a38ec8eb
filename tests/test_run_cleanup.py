"""A run that fails after its env is built closes the env: a TextWorld env's JVMs, or any
process an env holds, must not outlive a failing start. The env here holds a child process, as a
TextWorld env holds its JVMs, and the test counts this process's children before and after."""

from __future__ import annotations

import subprocess

import psutil
import pytest

from coevo.envs.arithmetic import ArithmeticEnv
from coevo.loop.build import run
from tests.test_config import compose_cfg


class ChildEnv(ArithmeticEnv):
    """The arithmetic env holding a child process until ``close``; counts the closes."""

    closes = 0

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.child = subprocess.Popen(["sleep", "120"])

    def close(self) -> None:
        type(self).closes += 1
        self.child.kill()
        self.child.wait()


def interrupted(*args, **kwargs):
    raise KeyboardInterrupt  # what Ctrl-C (SIGINT) raises wherever the run is


FAILURES = {  # failure -> the override that causes it, each after make_env in coevo.loop.build.run
    "bad model": ["model.name=/no/such/model"],  # fails at model loading, after the run directory is locked
    "bad harness": ["harness.start=/no/such/harness.yaml"],  # fails right after the env's first checks
    "interrupt": [],  # check_train_split raises KeyboardInterrupt (below)
}


@pytest.mark.parametrize("failure", list(FAILURES))
def test_a_start_that_fails_after_the_env_is_built_closes_it_and_leaves_no_child_process(tmp_path, monkeypatch,
                                                                                        failure):
    overrides = ["experiment=smoke", "mode=static", "rounds=1", 'env.name="tests.test_run_cleanup:ChildEnv"',
                 f"run_dir={tmp_path / 'run'}", *FAILURES[failure]]
    if failure == "interrupt":
        monkeypatch.setattr("coevo.loop.build.check_train_split", interrupted)
    monkeypatch.setattr(ChildEnv, "closes", 0)
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises((ValueError, KeyboardInterrupt)):
        run(compose_cfg(overrides))
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before and p.is_running()
            and p.status() != psutil.STATUS_ZOMBIE]
    assert left == [] and ChildEnv.closes == 1
