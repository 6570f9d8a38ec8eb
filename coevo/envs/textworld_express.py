"""TextWorld-Express text games (cooking, coin collecting, map reading, sorting, arithmetic,
commonsense tidying) as a multi-turn environment played through an ``act`` tool: the env
(``TWXEnv``), its games and their parameters, and the generation of its tasks.

The games run in a Java server reached through py4j; a pool of at most ``max_workers`` JVMs
(``coevo.envs.twx_jvm_pool``) is leased for one game step at a time, and a session
(``coevo.envs.twx_session``) rebuilds its game by replaying its commands when it lands on a JVM
that another session used, so many more episodes than JVMs can be open at once.

Splits use the package's own game folds (train/dev/test), which hold different seed ranges and,
for cooking and tidying, different held-out items. A task is the ``i``-th seed of its fold for
``i < n_per_game``, so the task list, gold paths included (see ``_check_gold``), is the same on
every machine.
"""

from __future__ import annotations

import re
import threading
import weakref
from collections.abc import Mapping, Sequence
from typing import Any, Self

from coevo.envs.base import Env, Task, check_split
from coevo.envs.twx_jvm_pool import Worker, WorkerPool
from coevo.envs.twx_session import Game, TWXSession
from coevo.harness.events import ToolCall

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

_ROOM_RE = re.compile(r"You are in the ([^.]+)\.")


def _room(infos: dict[str, Any]) -> str:
    match = _ROOM_RE.match(infos["look"])
    return match.group(1) if match else infos["look"]


def _check_gold(worker: Worker, game: Game, gold: tuple[str, ...]) -> tuple[str, ...]:
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


class TWXEnv(Env):
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
        self._pool = WorkerPool(max_workers)
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
                gold = _check_gold(worker, Game(game, params, fold, seed), gold)
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
        game = Game(m["game"], m["params"], m["fold"], int(m["seed"]))
        return TWXSession(self._pool, task, game, max(self.step_limit, int(m["gold_length"])))

    def close(self) -> None:
        """Stop every JVM and wait for the java processes to exit. Idempotent."""
        self._finalizer()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
