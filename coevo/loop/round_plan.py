"""Which train tasks each round of a run works on: the train split shuffled once per epoch (seeded,
the same on every machine) and cut into batches, epoch after epoch. The loop, ``coevo evolve``
(the same loop) and the stream protocols' adaptation rounds all draw their batches here, and the
TRL comparison script (scripts/peer_trl.py) reads the same order.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from coevo.envs.base import Task


def batches_per_epoch(n_tasks: int, batch_tasks: int) -> int:
    return max(1, n_tasks // batch_tasks)


def round_batches(tasks: Sequence[Task], batch_tasks: int, seed: int, rounds: int) -> list[list[Task]]:
    """The train batch of every round: the train split shuffled once per epoch (seeded), cut into
    batches of ``batch_tasks``; epochs follow each other until ``rounds`` batches exist."""
    if not tasks:
        raise ValueError("the env has no train tasks")
    if batch_tasks < 1:
        raise ValueError(f"batch_tasks must be >= 1, got {batch_tasks}")
    per_epoch = batches_per_epoch(len(tasks), batch_tasks)
    out: list[list[Task]] = []
    epoch = 0
    while len(out) < rounds:
        order = list(tasks)
        random.Random(f"{seed}-{epoch}").shuffle(order)
        out += [order[i * batch_tasks : (i + 1) * batch_tasks] for i in range(per_epoch)]
        epoch += 1
    return out[:rounds]
