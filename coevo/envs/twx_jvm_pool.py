"""The JVMs that run TextWorld-Express games, and the pool that leases them one step at a time.

The games run in a Java server reached through py4j, and one JVM holds one game at a time. The
runtime opens the session of every episode before the first model call, so a session cannot own
a JVM for its whole life: with more episodes than JVMs it would wait forever for a JVM that only
frees up after the model has answered. Instead a ``WorkerPool`` of at most ``size`` JVMs
(``Worker``) is leased for one game step (or one task build) at a time; how a session rebuilds
its game on whichever JVM it gets is ``coevo.envs.twx_session``'s business. A lease taken under
the runtime's deadline (``coevo.envs.deadline``) kills its JVM when the deadline passes
(``killed_at_deadline``): a py4j call cannot be interrupted, but it fails once the JVM is gone.
"""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

from py4j.protocol import Py4JError
from textworld_express import TextWorldExpressEnv

from coevo.envs.deadline import DeadlineExceeded, remaining

_PACKAGE_STEP_LIMIT = 10**6  # the session enforces the step limit; the package's own must never trigger


class Worker:
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


@contextmanager
def killed_at_deadline(worker: Worker) -> Iterator[None]:
    """Kill ``worker``'s JVM if the block outlives the runtime's deadline, and raise
    ``DeadlineExceeded`` then (whatever the dead JVM made the block raise, or even if it finished
    at that moment), so that the lease around it drops the JVM instead of pooling it."""
    left = remaining()
    if left is None:
        yield
        return
    fired: list[bool] = []

    def kill() -> None:
        fired.append(True)
        worker.stop(kill=True)

    timer = threading.Timer(max(left, 0.0), kill)
    timer.daemon = True
    timer.start()
    try:
        yield
    except BaseException as err:
        if fired:
            raise DeadlineExceeded("the TextWorld-Express step passed its deadline; its JVM was killed") from err
        raise
    finally:
        timer.cancel()
    if fired:
        raise DeadlineExceeded("the TextWorld-Express step passed its deadline; its JVM was killed")


class WorkerPool:
    """At most ``size`` JVMs, started on demand and leased one step (or one task build) at a time."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.closed = False
        self._cond = threading.Condition()
        self._idle: list[Worker] = []
        self._all: set[Worker] = set()
        self._starting = 0

    @contextmanager
    def lease(self, prefer: Worker | None = None, game: tuple[str, str] | None = None) -> Iterator[Worker]:
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

    def _acquire(self, prefer: Worker | None, game: tuple[str, str] | None) -> Worker:
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
            worker = Worker()  # about half a second: outside the lock
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

    def _drop(self, worker: Worker, kill: bool = False) -> None:
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
