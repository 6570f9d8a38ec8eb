"""Whether a run directory still holds what its last checkpoint committed, checked the same way by
the three readers of a run: a resume (``coevo.loop.coevolution``), ``coevo report`` (``coevo.report.data``) and
``coevo export`` (``coevo.report.export``).

Commits are atomic (``coevo.rundir.checkpoint``, ``coevo.buffers``), so a difference here means bytes changed
after they were written: a disk, a copy or a hand. Each check reads what the checkpoint counts and
raises ``CheckpointError`` naming the file and how to recover, instead of a resume that trains on
NaN weights or a shrunken buffer, or a report that silently shows fewer rounds:

- the checkpoint's own files against the sizes and SHA-256 recorded at commit (``checkpoint.verify_files``);
- the replay buffer: every trace the checkpoint counts is present, and every payload passes its CRC;
- ``lineage/<id>.yaml``: each harness of the lineage parses and hashes to its id;
- ``rounds.jsonl``: it holds the rounds the checkpoint holds (a resume rewrites it from the
  checkpoint, so only the report and the export check it).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from coevo.harness.harness import Harness
from coevo.rundir import checkpoint
from coevo.rundir.checkpoint import CheckpointError

REWRITE = ("start the run again on this run directory with the same config (train.py, or coevo evolve for its "
           "runs): the resume rewrites rounds.jsonl from the checkpoint")
"""How a ``rounds.jsonl`` that disagrees with the checkpoint is recovered."""


def committed(run_dir: Path) -> tuple[Path, dict[str, Any]] | None:
    """The newest committed round directory of ``run_dir`` and its state, or None when the run has
    committed no round (or keeps no checkpoint: records written by hand, tests)."""
    directory = checkpoint.latest(Path(run_dir) / "checkpoint")
    return None if directory is None else (directory, checkpoint.load_state(directory))


def verify_run(run_dir: Path, directory: Path, state: dict[str, Any], *, files: bool = False,
               buffer: Any | None = None, lineage: bool = False, rounds: Sequence[int] | None = None,
               partial: bool = False) -> None:
    """Check ``run_dir`` against its checkpoint ``directory`` / ``state``: the checkpoint's own files
    (``files``, before a resume loads them), every trace and payload of an open ``buffer``, the
    ``lineage/*.yaml`` files (``lineage``) and the rounds read from ``rounds.jsonl`` (``rounds``).
    ``partial``: missing traces or rounds only warn (an export that asked for what is intact)."""
    if files:
        checkpoint.verify_files(directory, state)
    if buffer is not None:
        check_buffer(buffer, state, directory, partial=partial)
    if lineage:
        check_lineage(Path(run_dir), state, directory)
    if rounds is not None:
        check_rounds(Path(run_dir), rounds, state, directory, partial=partial)


def buffer_next_seq(buffer: Any) -> int:
    """One past the newest trace's sequence number (sequence numbers only grow; eviction removes
    the oldest), 0 when the buffer is empty: what a checkpoint records as ``buffer_next_seq``."""
    return max((e.seq for e in buffer.entries()), default=-1) + 1


def check_buffer(buffer: Any, state: dict[str, Any], directory: Path, *, partial: bool = False) -> None:
    """The traces the checkpoint counts must be in the buffer (a lost newest segment, deleted or set
    aside as ``.corrupt``, would silently shrink every group the remaining rounds train on), and
    every stored payload must pass its CRC (the headers were checked when the buffer opened; a
    garbled payload would otherwise surface rounds later, or in an export, as a raw traceback)."""
    committed_seq = state.get("buffer_next_seq")
    have = buffer_next_seq(buffer)
    if committed_seq is not None and have < committed_seq:
        found = buffer.damaged_segments  # what this opening found damaged (and left out) names the cause
        aside = sorted(p.name for p in buffer.path.glob("*.corrupt"))  # or an earlier opening set it aside
        where = (f"damaged: {'; '.join(found)}" if found else
                 f"set aside as damaged: {', '.join(aside)}" if aside else "the newest segment files are missing")
        message = (f"replay buffer {buffer.path} holds {have} traces (by sequence number), but the checkpoint of "
                   f"round {state['next_round'] - 1} counts {committed_seq} ({where})")
        if partial:
            warnings.warn(message, stacklevel=3)
        else:
            restore = ("restore the segment files (rename a .corrupt file back only if it is intact)" if aside
                       else "restore the missing segment files")
            raise CheckpointError(f"{message}; {restore}, or start the run over in another run_dir=")
    damaged = buffer.verify()
    if damaged:
        shown = "; ".join(damaged[:3]) + (f"; and {len(damaged) - 3} more" if len(damaged) > 3 else "")
        raise CheckpointError(f"replay buffer {buffer.path}: {len(damaged)} stored trace(s) fail their CRC ({shown}); "
                              "they cannot be read back: restore the segment file from a backup, or start the run "
                              "over in another run_dir=")


def check_lineage(run_dir: Path, state: dict[str, Any], directory: Path) -> None:
    """Every harness of the checkpoint's lineage has its ``lineage/<id>.yaml``, which parses and (unless
    the run recorded its harnesses redacted) hashes to that id: these files are the run's product,
    what ``coevo eval`` and ``coevo harness diff`` read, and nothing rewrites them on resume."""
    redacted = bool(state.get("harnesses_redacted"))
    for row in state.get("lineage") or []:
        hid = row.get("id") if isinstance(row, dict) else None
        if not isinstance(hid, str):
            raise CheckpointError(f"{directory / 'state.json'} is damaged (a lineage row without an id): "
                                  f"{checkpoint.RECOVER}")
        path = run_dir / "lineage" / f"{hid}.yaml"
        if not path.is_file():
            raise CheckpointError(f"{path} is missing: the checkpoint's lineage holds harness {hid}; restore the "
                                  "file from a backup, or start the run over in another run_dir=")
        try:
            loaded = Harness.load(path)
        except (ValueError, TypeError, KeyError) as err:
            raise CheckpointError(f"{path} is damaged ({err}); restore the file from a backup, or start the run "
                                  "over in another run_dir=") from None
        if not redacted and loaded.id != hid:
            raise CheckpointError(f"{path} holds harness {loaded.id}, not {hid} (its contents changed); restore the "
                                  "file from a backup, or start the run over in another run_dir=")


def check_rounds(run_dir: Path, rounds: Sequence[int], state: dict[str, Any], directory: Path, *,
                 partial: bool = False) -> None:
    """``rounds.jsonl`` (its rounds: ``rounds``) holds exactly the rounds the checkpoint holds: a lost
    last line would otherwise make the report show a shorter run without a word."""
    counted = [r.get("round") for r in state.get("records") or [] if isinstance(r, dict)]
    missing, extra = sorted(set(counted) - set(rounds)), sorted(set(rounds) - set(counted))
    if not missing and not extra:
        return
    message = (f"{run_dir / 'rounds.jsonl'} holds {len(rounds)} rounds but the checkpoint {directory.name} holds "
               f"{len(counted)}" + (f" (missing: rounds {missing})" if missing else "")
               + (f" (not in the checkpoint: rounds {extra})" if extra else ""))
    if partial:
        warnings.warn(message, stacklevel=3)
    else:
        raise CheckpointError(f"{message}; {REWRITE}")
