"""What a report is drawn from: a run directory's records (``load_run``) and the numbers the
figures and the summary share (the per-task matrix, the lineage layout, the time totals), pure
functions of a ``Run`` so they can be checked against slow twins.

``load_run`` reads ``rounds.jsonl`` and ``lineage.jsonl`` into ``coevo.rundir.records`` dataclasses, which
validate every line: a truncated or foreign file fails with its path, line and field instead of an
AttributeError deep inside a plot.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from coevo.buffers import ReplayBuffer
from coevo.errors import UsageError
from coevo.rundir.check import committed, verify_run
from coevo.rundir.checkpoint import CheckpointError
from coevo.rundir.records import LineageRow, RoundRecord, StartRecord
from coevo.rundir.run_files import read_lineage, read_rounds

TIME_KEYS = ("rollout", "logprobs", "digest", "plan", "critic", "grpo", "eval", "checkpoint", "other")
"""The time breakdown of a round, in the order the figure stacks it."""

INSIDE_KEYS = ("rollout", "logprobs", "critic", "grpo", "eval")
"""Phases spent in model forward/backward/generation (the Critic re-runs candidates, eval generates)."""


@dataclass
class Run:
    """A run directory's records (sorted by round) and harness lineage (file order)."""

    run_dir: Path
    records: list[RoundRecord]
    lineage: list[LineageRow]
    start: StartRecord | None = None  # start.json: the starting agent evaluated before round 0 (absent in older runs)

    @property
    def rounds(self) -> list[int]:
        return [r.round for r in self.records]

    @property
    def modes(self) -> list[str]:
        """Distinct modes in round order (one, unless the directory was resumed under another mode)."""
        return list(dict.fromkeys(r.mode for r in self.records))


def load_run(run_dir: str | Path) -> Run:
    """Read ``rounds.jsonl`` and ``lineage.jsonl`` of ``run_dir`` (``coevo.rundir.records.read_rounds`` /
    ``read_lineage``).

    Raises ValueError naming the file and line for malformed JSON, a missing required field, a
    value of the wrong type or a repeated round, and a ValueError saying the run has no completed
    round yet when ``rounds.jsonl`` is missing or empty (a run killed in its first round).
    A missing ``lineage.jsonl`` reads as an empty lineage. When the run has a checkpoint, its
    ``rounds.jsonl`` and ``lineage/*.yaml`` are checked against it (``coevo.rundir.check.verify_run``): a
    lost round or a damaged harness file is a ``CheckpointError`` naming the file and how to recover.
    """
    root = Path(run_dir)
    if not root.is_dir():
        raise UsageError(f"run directory {str(root)!r} does not exist")
    rounds_path = root / "rounds.jsonl"
    records = read_rounds(rounds_path)
    if not records:
        raise UsageError(f"run {str(root)!r} has no completed round yet ({rounds_path} is missing or empty)")
    records.sort(key=lambda r: r.round)
    found = committed(root)
    if found is not None:  # what the report draws must be what the checkpoint committed
        verify_run(root, *found, lineage=True, rounds=[r.round for r in records])
    start_path = root / "start.json"
    start = (StartRecord.from_dict(json.loads(start_path.read_text()), str(start_path))
             if start_path.is_file() else None)
    return Run(run_dir=root, records=records, lineage=read_lineage(root / "lineage.jsonl"), start=start)


def damage(run_dir: Path) -> list[str]:
    """What is damaged in ``run_dir`` beyond its records, one line each: its newest checkpoint's files
    against their recorded SHA-256, and its replay buffer's traces and payloads against the
    checkpoint (skipped while a live run holds the buffer). Empty for an intact run, or one that
    has committed no round."""
    found = committed(run_dir)
    if found is None:
        return []
    directory, state = found
    problems = []
    try:
        verify_run(run_dir, directory, state, files=True)
    except CheckpointError as err:
        problems.append(str(err))
    buffer_dir = Path(run_dir) / "buffer"
    if buffer_dir.is_dir():
        try:
            with ReplayBuffer(buffer_dir, capacity=sys.maxsize, read_only=True) as buffer:
                verify_run(run_dir, directory, state, buffer=buffer)
        except CheckpointError as err:
            problems.append(str(err))
        except RuntimeError:  # held by the run writing it: it checks its own buffer when it resumes
            pass
    return problems


def matrix_source(run: Run) -> str:
    """``val`` when any round evaluated validation (tasks held fixed across rounds), else ``train``."""
    return "val" if any(r.val is not None for r in run.records) else "train"


def _natural(task_id: str) -> tuple[list[Any], str]:
    """Sort key ordering digit runs by value (t2 before t10); the id itself breaks ties (t01 vs t1)."""
    return [int(p) if i % 2 else p for i, p in enumerate(re.split(r"(\d+)", task_id))], task_id


def task_matrix(run: Run) -> tuple[list[str], list[int], np.ndarray]:
    """(task ids, rounds, values): values[i, j] is the pass rate of task i's attempts in round j.

    Outcomes come from ``matrix_source(run)``; the columns are the rounds that have them (every
    round for train, the evaluated rounds for val). Tasks are in natural id order. A task absent
    from a round (or with no attempts) is NaN.
    """
    source = matrix_source(run)
    columns = [(r.round, getattr(r, source).outcomes) for r in run.records if getattr(r, source) is not None]
    task_ids = sorted({t for _, outcomes in columns for t in outcomes}, key=_natural)
    row = {t: i for i, t in enumerate(task_ids)}
    values = np.full((len(task_ids), len(columns)), np.nan)
    for j, (_, outcomes) in enumerate(columns):
        for task_id, attempts in outcomes.items():
            if attempts:
                values[row[task_id], j] = sum(attempts) / len(attempts)
    return task_ids, [r for r, _ in columns], values


def lineage_layout(lineage: Sequence[LineageRow]) -> dict[str, tuple[int, int]]:
    """harness id → (x, depth): depth = number of ancestors found in the lineage, x = order of
    appearance (by round, then file order) among the harnesses at that depth. A repeated id keeps
    its first entry; a parent missing from the lineage makes its child a root."""
    first: dict[str, LineageRow] = {}
    for entry in lineage:
        first.setdefault(entry.id, entry)
    depth: dict[str, int] = {}
    for hid in first:
        seen, parent = {hid}, first[hid].parent_id
        while parent in first and parent not in seen:
            seen.add(parent)
            parent = first[parent].parent_id
        depth[hid] = len(seen) - 1
    ids = list(first)
    order = sorted(range(len(ids)), key=lambda i: (first[ids[i]].round, i))
    next_x: dict[int, int] = {}
    layout: dict[str, tuple[int, int]] = {}
    for i in order:
        d = depth[ids[i]]
        layout[ids[i]] = (next_x.get(d, 0), d)
        next_x[d] = next_x.get(d, 0) + 1
    return layout


def time_totals(run: Run) -> dict[str, float]:
    """Seconds per phase (``TIME_KEYS``) summed over the rounds; a phase a round lacks counts 0."""
    return {k: float(sum(r.seconds.get(k, 0.0) for r in run.records)) for k in TIME_KEYS}


def outside_share(totals: Mapping[str, float]) -> float:
    """Share of the summed breakdown spent outside model forward/backward/generation (``INSIDE_KEYS``)."""
    total = sum(totals[k] for k in TIME_KEYS)
    return 1.0 - sum(totals[k] for k in INSIDE_KEYS) / total if total > 0 else 0.0


def short(text: str, n: int) -> str:
    """``text`` on one line, cut to ``n`` characters with an ellipsis."""
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"
