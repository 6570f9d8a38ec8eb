"""Round checkpoints in a run directory: written whole, then committed by one atomic rename.

``checkpoint/round-N/`` holds everything that changes during a round except the replay buffer
(which commits its own appends): the trainer (model in ``save_pretrained`` format, optimizer,
scheduler), the AEGIS state, the run's records and lineage so far, RNG states and counters.
``state.json`` is written with secret values redacted (``coevo.safety.secrets.redact``).
``checkpoint/latest`` names the newest complete one; it is replaced with ``os.replace`` only after
the directory is fully written and fsynced, so a process killed at any moment leaves either the
previous round or this one, never a mix. Older round directories are deleted after the switch.

Commits are atomic, but bytes can still change afterwards (a disk, a copy, a hand). So ``state.json``
records the size and SHA-256 of every other file of the round (``files``), and ``verify_files``
checks them before a resume loads anything: garbled weights stop the resume naming the file instead
of training on NaN.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import torch

from coevo.errors import RunDirError
from coevo.safety.secrets import redact

LATEST = "latest"
FILES = "files"
"""The key of ``state.json`` that records each other file of the round: {relative path: {bytes, sha256}}."""


def rng_state() -> dict[str, Any]:
    """Python and torch RNG states (JSON-able; torch's as a list of ints)."""
    return {"python": _jsonable(random.getstate()), "torch": torch.get_rng_state().tolist()}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(_tupled(state["python"]))
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))


def commit(root: Path, round: int, state: dict[str, Any], write_extra: Callable[[Path], None] | None = None) -> Path:
    """Write ``state`` (JSON) and whatever ``write_extra(dir)`` writes into ``root/round-N``, fsync
    it, point ``root/latest`` at it atomically, then delete older rounds. Returns the directory."""
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"round-{round:04d}"
    tmp = root / f"round-{round:04d}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    if write_extra is not None:
        write_extra(tmp)
    state = {**state, FILES: file_digests(tmp)}
    (tmp / "state.json").write_text(json.dumps(redact(state), default=str))
    _fsync_tree(tmp)
    shutil.rmtree(final, ignore_errors=True)  # a leftover from a crash after the rename below
    tmp.rename(final)
    pointer = root / (LATEST + ".tmp")
    pointer.write_text(final.name)
    with open(pointer) as f:
        os.fsync(f.fileno())
    os.replace(pointer, root / LATEST)
    _fsync_dir(root)
    for old in root.glob("round-*"):
        if old != final:
            shutil.rmtree(old, ignore_errors=True)
    return final


def latest(root: Path) -> Path | None:
    """The newest committed round directory, or None when the run has not completed a round."""
    pointer = root / LATEST
    if not pointer.is_file():
        return None
    directory = root / pointer.read_text().strip()
    if not (directory / "state.json").is_file():
        raise RuntimeError(f"{pointer} names {directory.name}, which is incomplete; the run directory is damaged")
    return directory


class CheckpointError(RunDirError):
    """A committed checkpoint cannot be read back; the message names the file and how to recover."""


RECOVER = ("restore the file from a backup, or start the run over in another run_dir= (the buffer and "
           "references can stay where they are)")


def load_state(directory: Path, resumable: bool = False) -> dict[str, Any]:
    """The round's ``state.json``; a damaged one raises ``CheckpointError`` naming it. (Commits are
    atomic, so this means the file changed after it was written: a disk or a copy lost bytes.) The
    round counter is checked against the directory's name, so a changed digit cannot resume a run at
    another round than the one its weights and records belong to. ``resumable``: refuse a state
    whose harnesses were redacted (the run it would resume is not the one that ran)."""
    path = directory / "state.json"
    try:
        state = json.loads(path.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{path} is damaged ({err}); the run cannot resume from it: {RECOVER}") from None
    if not isinstance(state, dict) or "next_round" not in state:
        raise CheckpointError(f"{path} is not a coevo checkpoint state (no 'next_round'): {RECOVER}")
    next_round = state["next_round"]
    named = directory.name.removeprefix("round-")
    expected = int(named) + 1 if named.isdigit() else None
    if type(next_round) is not int or next_round < 1 or (expected is not None and next_round != expected):
        raise CheckpointError(f"{path} is damaged: 'next_round' is {next_round!r}, but {directory.name} holds round "
                              f"{named.lstrip('0') or 0} (next_round {expected}); the run cannot resume from it: "
                              f"{RECOVER}")
    if resumable and state.get("harnesses_redacted"):
        raise CheckpointError(
            f"{path}: a harness of the run held the value of a secret environment variable, which the checkpoint "
            "records as <redacted>; resuming would run other harnesses (under other ids) than those that ran. Start "
            "the run over in another run_dir=, with no key in its harnesses")
    return state


class Loadable(Protocol):
    """What ``load_trainer`` loads: a trainer (``coevo.trainers.grpo.GRPOTrainer``) that reads its files back."""

    def load(self, directory: Path) -> None: ...


def load_trainer(trainer: Loadable, directory: Path) -> None:
    """``trainer.load(directory)``, any failure (a file the hashes did not cover, NaN weights) raised
    as ``CheckpointError`` naming the directory and how to recover."""
    try:
        trainer.load(directory)
    except Exception as err:  # whatever the loader raises
        raise CheckpointError(f"{directory} cannot be loaded ({type(err).__name__}: {str(err) or 'no weights file'}); "
                              f"the run cannot resume from it: {RECOVER}") from err


def file_digests(directory: Path) -> dict[str, dict[str, int | str]]:
    """{path relative to ``directory``: {"bytes", "sha256"}} of every file under it (read back from
    disk, so the record is of what was written)."""
    return {str(p.relative_to(directory)): {"bytes": p.stat().st_size, "sha256": _sha256(p)}
            for p in sorted(directory.rglob("*")) if p.is_file()}


def verify_files(directory: Path, state: dict[str, Any]) -> None:
    """Check every file ``state`` records (``FILES``) against its size and SHA-256, before anything
    loads it: a changed byte of the weights would otherwise resume silently into NaN losses.
    Checkpoints written before the record existed have none to check."""
    recorded = state.get(FILES) or {}
    if not isinstance(recorded, dict):
        raise CheckpointError(f"{directory / 'state.json'} is damaged ('{FILES}' is not a mapping): {RECOVER}")
    for name, want in recorded.items():
        path = directory / name
        if not path.is_file():
            raise CheckpointError(f"{path} is missing from the checkpoint; the run cannot resume from it: {RECOVER}")
        size = path.stat().st_size
        if not isinstance(want, dict) or size != want.get("bytes") or _sha256(path) != want.get("sha256"):
            raise CheckpointError(
                f"{path} is damaged: {size} bytes whose SHA-256 differs from the one recorded when "
                f"{directory.name} was committed; the run cannot resume from it: {RECOVER}")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _fsync_tree(directory: Path) -> None:
    for path in directory.rglob("*"):
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
    for path in [directory, *[p for p in directory.rglob("*") if p.is_dir()]]:
        _fsync_dir(path)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _jsonable(value: object) -> object:
    return [_jsonable(v) for v in value] if isinstance(value, tuple | list) else value


def _tupled(value: object) -> Any:
    return tuple(_tupled(v) for v in value) if isinstance(value, list) else value
