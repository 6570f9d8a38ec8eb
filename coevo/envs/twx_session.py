"""One episode of a TextWorld-Express game (``TWXSession``), played through the ``act`` and
``valid_actions`` tools.

A session borrows a JVM from the pool (``coevo.envs.twx_jvm_pool``) for each game step. It
prefers the JVM it used last; when that JVM served another session in the meantime, the session's
game (``Game``: enough to regenerate it) is rebuilt by resetting the same seed and replaying its
commands. The games are deterministic (checked on every replay) and fast (about 10 ms for 25
steps), and while there are no more open sessions than JVMs no rebuild happens. With many more
sessions than JVMs each step replays the session's history, which multiplies the game work by a
few times; raise ``max_workers`` when that matters more than memory.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from coevo.envs.base import EnvSession, Score, Task
from coevo.envs.deadline import DeadlineExceeded
from coevo.envs.twx_jvm_pool import Worker, WorkerPool, killed_at_deadline
from coevo.harness.events import ToolResult, ToolSpec

MAX_COMMAND_CHARS = 200
_PLAY_HINT = "Play by calling the act tool with one command at a time; the game ends when the task is done."

ACT = ToolSpec(
    "act",
    "Perform one text command in the game (e.g. 'look around', 'move east', 'take coin') and see what happens.",
    {
        "type": "object",
        "properties": {"command": {"type": "string", "description": "the command, as you would type it"}},
        "required": ["command"],
    },
)
VALID_ACTIONS = ToolSpec(
    "valid_actions",
    "List the commands the game accepts right now (does not use a turn).",
    {"type": "object", "properties": {}},
)


@dataclass(frozen=True)
class Game:
    """What identifies one generated game: enough to rebuild it on any JVM."""

    name: str
    params: str
    fold: str
    seed: int


class TWXSession(EnvSession):
    """One episode of one game. Holds the command history so that any JVM can rebuild the game."""

    _tokens = itertools.count()

    def __init__(self, pool: WorkerPool, task: Task, game: Game, step_limit: int) -> None:
        self.task = task
        self.observation = f"{task.instruction}\n\n{_PLAY_HINT}"
        self.tools = {"act": ACT, "valid_actions": VALID_ACTIONS}
        self.done = False
        self.step_limit = step_limit
        self._pool, self._game = pool, game
        self._token = next(self._tokens)
        self._worker: Worker | None = None  # the JVM used last, preferred for the next step
        self._history: list[str] = []
        self._infos: dict[str, Any] | None = None  # the package's infos after the last step
        self._score = 0.0
        self._closed = False

    def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        if self._closed:
            return ToolResult("", error="the session is closed")
        if name == "valid_actions":
            if self._infos is None:
                self._play(None)
            return ToolResult("Valid commands: " + ", ".join(sorted(self._infos["validActions"])))
        if name != "act":
            return ToolResult("", error=f"unknown tool {name!r}; available: {sorted(self.tools)}")
        command = arguments.get("command") if isinstance(arguments, dict) else None
        if not isinstance(command, str) or not command.strip():
            return ToolResult("", error="act needs a non-empty string argument 'command'")
        if len(command) > MAX_COMMAND_CHARS:
            return ToolResult("", error=f"command longer than {MAX_COMMAND_CHARS} characters")
        if self.done:
            return ToolResult("", error="the game is over")
        before = self._score
        text = self._play(command.strip())
        return ToolResult(self._describe(text, self._score - before))

    def _play(self, command: str | None) -> str:
        """Step the game (or only bring it up to date when ``command`` is None) on a leased JVM.
        Returns the game's reply to ``command``. A game that raises ends the session; the pool
        kills that JVM. A step past the runtime's deadline has its JVM killed too, but the session
        goes on: the command was not recorded, and the next call rebuilds the game on a fresh JVM."""
        text = ""
        try:
            g = self._game
            with self._pool.lease(prefer=self._worker, game=(g.name, g.params)) as worker, killed_at_deadline(worker):
                if worker.owner != self._token:
                    self._rebuild(worker)
                if command is not None:
                    text, _, _, infos = worker.game.step(command)
                    self._record(command, infos)
                self._worker = worker
        except DeadlineExceeded:
            self._worker = None
            raise
        except BaseException:
            self._worker = None
            self.done = True
            self.close()
            raise
        return text

    def _rebuild(self, worker: Worker) -> None:
        g = self._game
        infos = worker.start(g.name, g.params, g.fold, g.seed)
        for command in self._history:
            _, _, _, infos = worker.game.step(command)
        if self._infos is not None and infos["observation"] != self._infos["observation"]:
            raise RuntimeError(f"replaying {len(self._history)} commands of {self.task.task_id} gave a different game")
        self._infos = infos
        worker.owner = self._token

    def _record(self, command: str, infos: dict[str, Any]) -> None:
        self._history.append(command)
        self._infos = infos
        self._score = float(infos["score"])
        if infos["tasksuccess"] or infos["taskfailure"] or len(self._history) >= self.step_limit:
            self.done = True

    def _describe(self, text: str, delta: float) -> str:
        infos = self._infos or {}
        lines = [text.strip()]
        if delta:
            lines.append(f"[score {self._score:.2f} ({delta:+.2f})]")
        if infos.get("tasksuccess"):
            lines.append("The task is complete.")
        elif infos.get("taskfailure"):
            lines.append("The task has failed; the game is over.")
        elif self.done:
            lines.append(f"The step limit ({self.step_limit}) is reached; the game is over.")
        return "\n".join(lines)

    def verify(self, answer: str | None) -> Score:
        """The game's own judgement; the answer text plays no part."""
        infos = self._infos or {}
        success = bool(infos.get("tasksuccess", False))
        return Score(
            reward=min(1.0, max(0.0, self._score)),
            passed=success,
            info={
                "score": self._score,
                "success": success,
                "failure": bool(infos.get("taskfailure", False)),
                "steps": len(self._history),
                "game": self._game.name,
            },
        )

    def close(self) -> None:
        """Forget the JVM; its game is simply overwritten by the next session that uses it."""
        self._closed = True
        self._worker = None
