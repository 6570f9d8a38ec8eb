"""Any agent program that speaks the OpenAI API, on the tasks of a coevo env.

``env.name=program env.args.command='python examples/programs/calculator_agent.py'
env.args.tasks_from=arithmetic``: each episode runs the command with ``OPENAI_BASE_URL`` pointing
at coevo's endpoint (``coevo.programs.endpoint``, one session per episode; ``OPENAI_API_KEY`` is
the session id too), the task's instruction in ``COEVO_TASK`` and on its standard input. The
program runs its own loop and its own tools; the last line it prints is its final answer, which
the ``tasks_from`` env's verifier scores, as it would a native episode's. A program that exits
with an error fails its episode with the end of its standard error.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import subprocess
import sys
from typing import Any

from coevo.envs.base import Env, Score, Task, check_split
from coevo.envs.program_env import PROGRAM_TIMEOUT_S, ProgramEnv, ProgramError, ProgramRun, run_in_thread
from coevo.programs.channel import ModelChannel
from coevo.programs.endpoint import shared_endpoint

STDERR_TAIL = 600
"""Characters of a failed program's standard error kept in its episode's error."""


class CommandEnv(ProgramEnv):
    """A program (``command``, a shell-style string or an argument list) on ``tasks_from``'s tasks."""

    def __init__(self, command: str | list[str], tasks_from: str = "arithmetic",
                 tasks_args: dict[str, Any] | None = None, program_timeout_s: float = PROGRAM_TIMEOUT_S,
                 name: str | None = None) -> None:
        from coevo.envs.load import make_env  # the env registry lists this class: imported when used

        self.command = shlex.split(command) if isinstance(command, str) else [str(c) for c in command]
        if not self.command:
            raise ValueError("command is empty: give the program to run, e.g. 'python my_agent.py'")
        if self.command[0] in ("python", "python3"):
            self.command[0] = sys.executable  # the run's own interpreter, with coevo's packages
        self.inner: Env = make_env(tasks_from, tasks_args)
        self.name = name or self.inner.name
        self.program_timeout_s = float(program_timeout_s)

    def tasks(self, split: str) -> list[Task]:
        """``tasks_from``'s tasks, without their gold actions: those are calls of that env's tools,
        and the program runs tools of its own."""
        return [dataclasses.replace(t, gold_actions=()) for t in self.inner.tasks(check_split(split))]

    def launch(self, task: Task, channel: ModelChannel) -> ProgramRun:
        endpoint = shared_endpoint()
        base_url = endpoint.register(channel)
        env = {**os.environ, "OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": channel.session_id,
               "COEVO_TASK": task.instruction}
        process = subprocess.Popen(self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, env=env)

        def work() -> Score:
            try:
                out, err = process.communicate(task.instruction)
            finally:
                endpoint.unregister(channel.session_id)
            if process.returncode != 0:
                raise ProgramError(f"{shlex.join(self.command)} exited with {process.returncode}: "
                                   f"{err.strip()[-STDERR_TAIL:]}")
            lines = [line for line in out.splitlines() if line.strip()]
            return self._verify(task, lines[-1] if lines else None)

        return run_in_thread(work, channel, channel.session_id, stop=process.kill)

    def _verify(self, task: Task, answer: str | None) -> Score:
        session = self.inner.reset(task)
        try:
            return session.verify(answer)
        finally:
            session.close()

    def close(self) -> None:
        self.inner.close()
