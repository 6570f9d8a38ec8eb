"""Environments whose agent is a program: the program calls the model, coevo answers and scores.

A ``ProgramEnv`` lists tasks like any env, but an episode is not a session coevo drives turn by
turn: ``launch`` starts the task's program, which reaches the model through a ``ModelChannel``
(in process, as a verifiers v1 client does, or over the OpenAI-compatible endpoint,
``coevo.programs.endpoint``), and ends with the task's score. ``run_in_thread`` is the usual way
to launch: the program's work in a daemon thread that reports its end on the channel.
"""

from __future__ import annotations

import threading
from abc import abstractmethod
from collections.abc import Callable

from coevo.envs.base import Env, EnvSession, Score, Task
from coevo.programs.channel import ModelChannel

PROGRAM_TIMEOUT_S = 300.0
"""Seconds a program may go without a model request or its end before its episode fails as hung
(the env's ``program_timeout_s`` overrides it)."""


PROGRAM_INERT = frozenset({"answer_extraction", "parse_retry", "self_verification", "python_executor", "tool_timeout",
                           "tool_whitelist", "argument_guard", "specialist"})
"""Processor kinds that change nothing on an agent that is a program: the program reads its own
answers (an extracted answer, a retry note, a verification request are not passed to it) and runs
its own tools (no tool hook fires here, and a tool of the harness would never be called). AEGIS
proposes no edit that touches only these (``Env.inert_processors``, ``PlanContext.inert``): the
Critic could only measure noise."""


class ProgramError(RuntimeError):
    """The program failed: it exited with an error, or its runtime did (the message says which)."""


class ProgramRun:
    """A launched program; ``stop`` ends what is still running (a subprocess is killed; a thread
    cannot be, so it is left to find its channel closed)."""

    def __init__(self, stop: Callable[[], None] | None = None) -> None:
        self._stop = stop

    def stop(self) -> None:
        if self._stop is not None:
            self._stop()


def run_in_thread(work: Callable[[], Score], channel: ModelChannel, name: str,
                  stop: Callable[[], None] | None = None) -> ProgramRun:
    """Run ``work`` (the program, returning its score) in a daemon thread; its end, or the
    exception it raised, goes to ``channel``."""

    def main() -> None:
        try:
            score = work()
        except BaseException as err:  # noqa: BLE001 - reported to the episode, which fails with it
            channel.end(None, err)
            return
        channel.end(score)

    threading.Thread(target=main, name=f"coevo-program-{name}", daemon=True).start()
    return ProgramRun(stop)


class ProgramEnv(Env):
    """An env whose episodes are programs (``coevo.agent.program_episode.ProgramEpisodeRun`` runs them)."""

    program_timeout_s: float = PROGRAM_TIMEOUT_S
    program_tools: tuple[str, ...] = ()  # the tools its programs offer, where known before they run
    inert_processors = PROGRAM_INERT

    def tool_names(self, task: Task) -> list[str]:
        return sorted(self.program_tools)

    @abstractmethod
    def launch(self, task: Task, channel: ModelChannel) -> ProgramRun:
        """Start ``task``'s program with its model requests going to ``channel``; its end (score or
        error) must reach ``channel.end`` exactly once."""

    def reset(self, task: Task) -> EnvSession:
        raise TypeError(f"env {self.name!r} runs programs: its episodes have no session for coevo to drive "
                        "(the runtime runs them with coevo.agent.program_episode.ProgramEpisodeRun)")
