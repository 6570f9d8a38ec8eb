"""One process per run directory: an exclusive lock taken before anything is written into it.

Two runs on one directory would interleave their rounds, overwrite each other's checkpoints and
append to one replay buffer. The lock is an ``flock`` on ``RUN_DIR/.run.lock``, so the kernel drops
it when the holder dies (a kill -9 never leaves a stale lock), and the file records the holder's pid
for the error message. ``train.py`` takes it in a Hydra callback (``LockRunDir``), before Hydra
writes ``.hydra/`` or ``train.log``; ``coevo.run`` takes it again (a no-op in the same process) for
callers that bypass Hydra. Only rank 0 of a multi-process run writes, so only rank 0 locks.
"""

from __future__ import annotations

import fcntl
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydra.experimental.callback import Callback

from coevo.errors import RUN_DIR_EXIT, RunDirError, one_line

if TYPE_CHECKING:
    from omegaconf import DictConfig

LOCK_NAME = ".run.lock"
_HELD: dict[Path, int] = {}  # resolved run directory -> the open, locked file descriptor


class RunDirInUseError(RunDirError):
    """Another live process holds the run directory."""


def lock_run_dir(run_dir: str | Path) -> Path:
    """Create ``run_dir`` if needed and lock it for this process's lifetime; returns the lock file.
    Raises ``RunDirInUseError`` naming the directory and the holder's pid when another process has it,
    ``RunDirError`` when the directory cannot be created or written."""
    path = Path(run_dir).resolve()
    lock = path / LOCK_NAME
    if path in _HELD:
        return lock
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as err:  # a file in the way, no permission, a read-only file system
        raise RunDirError(f"run directory {path} cannot be used: {err.strerror or err} ({err.filename or path}); "
                          "choose another name= / run_dir=, or fix its permissions") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise RunDirInUseError(f"run directory {path} is in use by another run (pid {holder}); wait for it to end, or "
                               "choose another name= / run_dir=") from None
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    _HELD[path] = fd
    return lock


def unlock_run_dir(run_dir: str | Path) -> None:
    """Release this process's lock on ``run_dir`` (the run is over); a no-op when it holds none."""
    fd = _HELD.pop(Path(run_dir).resolve(), None)
    if fd is not None:
        os.close(fd)  # closing the only descriptor of the open file drops the flock


class LockRunDir(Callback):
    """Hydra callback: lock the run directory in ``on_run_start``, before Hydra creates ``.hydra/``.
    Hydra turns an exception in a callback into a warning, so a held (or unusable) directory exits the process
    (status 1) instead. Sweeps lock each job's directory in ``coevo.run``."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        from omegaconf import OmegaConf

        if int(os.environ.get("RANK", "0")) > 0:
            return
        run_dir = OmegaConf.select(config, "hydra.run.dir", default=None)
        if run_dir:
            try:
                lock_run_dir(run_dir)
            except RunDirError as err:  # in use, or cannot be created
                print(one_line(err), file=sys.stderr, flush=True)
                raise SystemExit(RUN_DIR_EXIT) from None
