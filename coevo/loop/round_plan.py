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


def extra_pools(tasks: Sequence[Task], batches: Sequence[Sequence[Task]], per_round: int, seed: int
                ) -> list[list[Task]]:
    """Every round's reserve for dynamic sampling (``rollout.signal_groups``): the train tasks no
    round's batch holds, shuffled once (seeded) and cut into disjoint slices of ``per_round``, one
    per round in order (shorter or empty once the split runs out). Fixed in advance, so a round's
    extras do not depend on how many earlier rounds drew, a resumed run draws what the killed one
    did, and the rounds that will train on them are known when references are withheld."""
    used = {t.task_id for batch in batches for t in batch}
    rest = [t for t in tasks if t.task_id not in used]
    random.Random(f"{seed}-extra").shuffle(rest)
    return [rest[i * per_round : (i + 1) * per_round] for i in range(len(batches))]
