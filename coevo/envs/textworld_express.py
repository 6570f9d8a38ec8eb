"""TextWorld-Express text games (cooking, coin collecting, map reading, sorting, arithmetic,
commonsense tidying) as a multi-turn environment played through an ``act`` tool.

The games run in a Java server reached through py4j, and one JVM holds one game at a time. The
runtime opens the session of every episode before the first model call, so a session cannot own
a JVM for its whole life: with more episodes than JVMs it would wait forever for a JVM that only
frees up after the model has answered. Instead a pool of at most ``max_workers`` JVMs is leased
for one game step at a time. A session prefers the JVM it used last; when that JVM served
another session in the meantime, the session's game is rebuilt by resetting the same seed and
replaying its commands. The games are deterministic (checked on every replay) and fast (about
10 ms for 25 steps), and while there are no more open sessions than JVMs no rebuild happens. With
many more sessions than JVMs each step replays the session's history, which multiplies the game
work by a few times; raise ``max_workers`` when that matters more than memory.

Splits use the package's own game folds (train/dev/test), which hold different seed ranges and,
for cooking and tidying, different held-out items. A task is the ``i``-th seed of its fold for
``i < n_per_game``, so the task list, gold paths included (see ``_check_gold``), is the same on
every machine.
"""

from __future__ import annotations

import itertools
import re
import subprocess
import threading
import weakref
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any, Self

from py4j.protocol import Py4JError
from textworld_express import TextWorldExpressEnv

from coevo.envs.base import Score, Task, check_split
from coevo.harness.events import ToolCall, ToolResult, ToolSpec

GAMES = ("cookingworld", "coin", "mapreader", "sorting", "arithmetic", "twc")

DEFAULT_GAME_PARAMS: dict[str, str] = {
    # one room, a two-ingredient recipe, two distractor ingredients: gold paths of 10-16 steps
    "cookingworld": "numLocations=1,numIngredients=2,numDistractorItems=2,includeDoors=0,limitInventorySize=0",
    # four rooms without doors: the coin is at most three moves away (gold paths of 2-4 steps)
    "coin": "numLocations=4,numDistractorItems=0,includeDoors=0,limitInventorySize=0",
    # four rooms, coin at most two rooms from the box, no distractors: gold paths of 7-9 steps
    "mapreader": (
        "numLocations=4,maxDistanceApart=2,maxDistractorItemsPerLocation=0,includeDoors=0,limitInventorySize=0"
    ),
    # sorting and arithmetic take no parameters (3-5 objects to sort; one problem, 5 gold steps)
    "sorting": "",
    "arithmetic": "",
    # one room, two items to put away: gold paths of 5-7 steps
    "twc": "numLocations=1,numItemsToPutAway=2,includeDoors=0,limitInventorySize=0",
}
"""Small worlds so that episodes stay short for a small model (parameter names are the package's)."""

FOLDS = {"train": "train", "val": "dev", "test": "test"}
"""Our split -> the package's game fold."""

MAX_COMMAND_CHARS = 200
_PACKAGE_STEP_LIMIT = 10**6  # the session enforces the step limit; the package's own must never trigger
_ROOM_RE = re.compile(r"You are in the ([^.]+)\.")
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


class _Worker:
    """One TextWorld-Express JVM. The pool hands it to one thread at a time."""

    def __init__(self) -> None:
        self.game = TextWorldExpressEnv(envStepLimit=_PACKAGE_STEP_LIMIT)
        # The package keeps the java child process only on its py4j gateway; we need it to make
        # sure the JVM has exited (the package's close() only asks it to).
        self.process: subprocess.Popen = self.game._gateway.java_process
        self.loaded: tuple[str, str] | None = None
        self.owner: int | None = None  # token of the session whose game the JVM currently holds
        self._stopped = False

    def start(self, game: str, params: str, fold: str, seed: int, gold: bool = False) -> dict[str, Any]:
        """Generate game ``seed`` of ``fold``; returns the package's infos for the first observation."""
        if self.loaded != (game, params):
            self.loaded = None
            self.game.load(game, params)
            self.loaded = (game, params)
        self.owner = None
        _, infos = self.game.reset(seed=seed, gameFold=fold, generateGoldPath=gold)
        return infos

    def fold_seeds(self, fold: str, n: int) -> list[int]:
        """The first ``n`` seeds the package reserves for ``fold`` (indexed, to avoid copying 1000)."""
        seeds = {
            "train": self.game.server.getSeedsTrain,
            "dev": self.game.server.getSeedsDev,
            "test": self.game.server.getSeedsTest,
        }[fold]()
        if n > len(seeds):
            raise ValueError(f"fold {fold!r} has only {len(seeds)} seeds, asked for {n}")
        return [int(seeds[i]) for i in range(n)]

    def stop(self, kill: bool = False) -> None:
        """Shut the JVM down and wait until the java process is gone; ``kill`` skips the polite
        part for a JVM that may be broken. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        if kill:
            self.process.kill()
        # A dead or dying JVM makes both of these fail on its pipe or socket; the wait below decides.
        with suppress(Py4JError, OSError, ValueError):
            self.game.close()  # py4j shutdown, then a newline that makes the server exit
        with suppress(OSError, ValueError):
            if self.process.stdin is not None:
                self.process.stdin.close()  # EOF: the server runs with --die-on-broken-pipe
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=5)


class _Pool:
    """At most ``size`` JVMs, started on demand and leased one step (or one task build) at a time."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.closed = False
        self._cond = threading.Condition()
        self._idle: list[_Worker] = []
        self._all: set[_Worker] = set()
        self._starting = 0

    @contextmanager
    def lease(self, prefer: _Worker | None = None, game: tuple[str, str] | None = None) -> Iterator[_Worker]:
        """A JVM for the duration of the block: ``prefer`` if it is idle, else one that has ``game``
        (name, params) loaded (switching games costs up to 0.1 s), else any. One that raised inside
        the block is killed, not reused."""
        worker = self._acquire(prefer, game)
        try:
            yield worker
        except BaseException:
            self._drop(worker, kill=True)
            raise
        with self._cond:
            if self.closed or worker not in self._all:
                stop = True
            else:
                stop = False
                self._idle.append(worker)
                self._cond.notify()
        if stop:
            self._drop(worker)

    def _acquire(self, prefer: _Worker | None, game: tuple[str, str] | None) -> _Worker:
        with self._cond:
            while True:
                if self.closed:
                    raise RuntimeError("the TextWorld-Express env is closed")
                if prefer is not None and prefer in self._idle:
                    self._idle.remove(prefer)
                    return prefer
                if self._idle:
                    same = [w for w in self._idle if w.loaded == game]
                    worker = same[-1] if same else self._idle[-1]
                    self._idle.remove(worker)
                    return worker
                if len(self._all) + self._starting < self.size:
                    self._starting += 1
                    break
                self._cond.wait()
        try:
            worker = _Worker()  # about half a second: outside the lock
        except BaseException:
            with self._cond:
                self._starting -= 1
                self._cond.notify()
            raise
        with self._cond:
            self._starting -= 1
            closed = self.closed
            if not closed:
                self._all.add(worker)
        if closed:
            worker.stop()
            raise RuntimeError("the TextWorld-Express env is closed")
        return worker

    def _drop(self, worker: _Worker, kill: bool = False) -> None:
        with self._cond:
            self._all.discard(worker)
            if worker in self._idle:
                self._idle.remove(worker)
            self._cond.notify()
        worker.stop(kill=kill)

    def close(self) -> None:
        """Stop every JVM, leased ones too (their current step fails, which discards them)."""
        with self._cond:
            self.closed = True
            workers = list(self._all)
            self._all.clear()
            self._idle.clear()
            self._cond.notify_all()
        for worker in workers:
            worker.stop()


@dataclass(frozen=True)
class _Game:
    """What identifies one generated game: enough to rebuild it on any JVM."""

    name: str
    params: str
    fold: str
    seed: int


class TWXSession:
    """One episode of one game. Holds the command history so that any JVM can rebuild the game."""

    _tokens = itertools.count()

    def __init__(self, pool: _Pool, task: Task, game: _Game, step_limit: int) -> None:
        self.task = task
        self.observation = f"{task.instruction}\n\n{_PLAY_HINT}"
        self.tools = {"act": ACT, "valid_actions": VALID_ACTIONS}
        self.done = False
        self.step_limit = step_limit
        self._pool, self._game = pool, game
        self._token = next(self._tokens)
        self._worker: _Worker | None = None  # the JVM used last, preferred for the next step
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
        kills that JVM."""
        text = ""
        try:
            g = self._game
            with self._pool.lease(prefer=self._worker, game=(g.name, g.params)) as worker:
                if worker.owner != self._token:
                    self._rebuild(worker)
                if command is not None:
                    text, _, _, infos = worker.game.step(command)
                    self._record(command, infos)
                self._worker = worker
        except BaseException:
            self._worker = None
            self.done = True
            self.close()
            raise
        return text

    def _rebuild(self, worker: _Worker) -> None:
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


def _room(infos: dict[str, Any]) -> str:
    match = _ROOM_RE.match(infos["look"])
    return match.group(1) if match else infos["look"]


def _check_gold(worker: _Worker, game: _Game, gold: tuple[str, ...]) -> tuple[str, ...]:
    """Replay the gold path, make sure it wins, and return it in a machine-independent form.

    The package's coin-collector gold path is a random walk that differs from one JVM run to the
    next (the other games' paths are the same on every run). When the walk is only moves (no
    doors to open), cutting each detour back to the first visit of its room leaves the direct
    route, which in these tree-shaped maps is the same on every machine and a better demonstration.
    """
    infos = worker.start(game.name, game.params, game.fold, game.seed)
    rooms, moves = [_room(infos)], []
    for command in gold:
        _, _, _, infos = worker.game.step(command)
        if command.startswith("move "):
            room = _room(infos)
            if room in rooms:  # back on the route: forget the detour
                cut = rooms.index(room)
                del rooms[cut + 1 :], moves[cut:]
            else:
                rooms.append(room)
                moves.append(command)
    if not infos["tasksuccess"]:
        raise RuntimeError(f"the gold path of {game} does not win: {list(gold)}")
    direct = ("look around", *moves, "take coin")
    other = {c for c in gold if not c.startswith("move ")} - {"look around", "take coin"}
    if game.name != "coin" or direct == gold or other:
        return gold
    return _check_gold(worker, game, direct)


class TWXEnv:
    """TextWorld-Express games with ``n_per_game`` tasks per game and split.

    ``game_params`` overrides ``DEFAULT_GAME_PARAMS`` per game (the package's comma-separated
    ``name=value`` strings). A session ends on task success or failure, or after ``step_limit``
    commands, raised to the task's gold length when that is longer, so the reference path always
    fits. ``max_workers`` bounds the JVMs (up to about 300 MB each), which start on first use and
    stop on ``close()``, at exit, or when the env is garbage collected.

    Each task's capabilities are ``game:<name>`` plus ``tool:<name>`` for each tool its gold
    path uses (always ``tool:act``).
    """

    name = "textworld_express"

    def __init__(
        self,
        games: Sequence[str] | None = None,
        n_per_game: int = 20,
        game_params: Mapping[str, str] | None = None,
        step_limit: int = 30,
        max_workers: int = 4,
    ) -> None:
        self.games = tuple(GAMES if games is None else games)
        unknown = [g for g in (*self.games, *(game_params or {})) if g not in GAMES]
        if unknown:
            raise ValueError(f"unknown TextWorld-Express game(s) {unknown}; choose from {list(GAMES)}")
        if not self.games or len(set(self.games)) != len(self.games):
            raise ValueError(f"games must be a non-empty list without repeats, got {list(self.games)}")
        if n_per_game < 1 or step_limit < 1 or max_workers < 1:
            raise ValueError("n_per_game, step_limit and max_workers must be >= 1")
        self.params = {**DEFAULT_GAME_PARAMS, **(game_params or {})}
        if not all(isinstance(p, str) for p in self.params.values()):
            raise ValueError("game_params values must be strings like 'numLocations=3,includeDoors=0'")
        self.n_per_game, self.step_limit = n_per_game, step_limit
        self._pool = _Pool(max_workers)
        # Runs at interpreter exit too (weakref.finalize registers with atexit), and only once.
        self._finalizer = weakref.finalize(self, self._pool.close)
        self._tasks: dict[tuple[str, str], list[Task]] = {}
        self._build_lock = threading.Lock()

    def tasks(self, split: str) -> list[Task]:
        check_split(split)
        return [t for game in self.games for t in self._game_tasks(game, split)]

    def _game_tasks(self, game: str, split: str) -> list[Task]:
        with self._build_lock:
            if (game, split) not in self._tasks:
                self._tasks[game, split] = self._build(game, split)
            return list(self._tasks[game, split])

    def _build(self, game: str, split: str) -> list[Task]:
        """Generate each seed once with its gold path (needs a JVM, about 10 ms per task)."""
        fold, params = FOLDS[split], self.params[game]
        tasks = []
        with self._pool.lease() as worker:
            for seed in worker.fold_seeds(fold, self.n_per_game):
                infos = worker.start(game, params, fold, seed, gold=True)
                gold = tuple(str(a) for a in worker.game.getGoldActionSequence())
                if not gold or gold[0].startswith("ERROR"):
                    raise RuntimeError(f"TextWorld-Express gave no gold path for {game} {fold} seed {seed}: {gold}")
                gold = _check_gold(worker, _Game(game, params, fold, seed), gold)
                tasks.append(
                    Task(
                        task_id=f"twx/{game}/{fold}/{seed}",
                        env=self.name,
                        instruction=f"{infos['taskDescription'].strip()}\n\n{infos['observation'].strip()}",
                        split=split,
                        answer=gold,
                        capabilities=(f"game:{game}", "tool:act"),
                        gold_actions=tuple(ToolCall("act", {"command": a}) for a in gold),
                        metadata={"game": game, "fold": fold, "seed": seed, "params": params, "gold_length": len(gold)},
                    )
                )
        return tasks

    def reset(self, task: Task) -> TWXSession:
        """A new session; no JVM is touched until its first command."""
        if self._pool.closed:
            raise RuntimeError("the TextWorld-Express env is closed")
        if task.env != self.name:
            raise ValueError(f"task {task.task_id!r} belongs to env {task.env!r}, not {self.name!r}")
        m = task.metadata
        game = _Game(m["game"], m["params"], m["fold"], int(m["seed"]))
        return TWXSession(self._pool, task, game, max(self.step_limit, int(m["gold_length"])))

    def close(self) -> None:
        """Stop every JVM and wait for the java processes to exit. Idempotent."""
        self._finalizer()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
