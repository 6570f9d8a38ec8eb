"""The in-memory index record of one stored trace, and the log-prob callback the buffer consumes.

The buffer keeps only these small records in memory so that grouping, filtering and lag queries
never touch the (large) trace payloads on disk.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple


class LogprobQuery(NamedTuple):
    """One model call to score: its exact ids and the temperature its tokens were drawn at
    (``ModelCall.logprob_temperature()``; None for a call recorded without its sampling
    parameters, which the LogprobFn scores at the run's rollout temperature)."""

    prompt_ids: list[int]
    completion_ids: list[int]
    temperature: float | None


LogprobFn = Callable[[Sequence[LogprobQuery]], list[list[float]]]
"""Given ``LogprobQuery`` items, one log-prob per completion token of each, at its temperature.

The caller implements it as one batched forward pass of the current model (chunked as needed);
the buffer calls it once per ``add`` with every model call of every trace of the batch. Scoring a
call at another temperature than the one that sampled it would make every importance ratio wrong
from the first step on.
"""


@dataclass(frozen=True)
class BufferEntry:
    """Light index record of a stored trace; the payload stays on disk.

    ``seq`` is the insertion counter: unique and monotone, and the only tie-breaker the buffer
    ever sorts by (rewards tie constantly with binary verifiers).
    """

    seq: int
    trace_id: str
    task_id: str
    harness_id: str
    variant: str
    model_version: int  # the trainer's update counter at insertion (not Trace.model_version)
    round: int
    reward: float
    passed: bool
    trainable: bool
    n_tokens: int  # completion tokens over trainable model calls

    def to_json(self) -> dict[str, Any]:
        """The record as stored in a segment header (without ``seq``, which the position gives)."""
        return {
            "trace_id": self.trace_id,
            "task_id": self.task_id,
            "harness_id": self.harness_id,
            "variant": self.variant,
            "model_version": self.model_version,
            "round": self.round,
            "reward": self.reward,
            "passed": self.passed,
            "trainable": self.trainable,
            "n_tokens": self.n_tokens,
        }

    @classmethod
    def from_json(cls, seq: int, data: dict[str, Any]) -> BufferEntry:
        return cls(
            seq=seq,
            trace_id=str(data["trace_id"]),
            task_id=str(data["task_id"]),
            harness_id=str(data["harness_id"]),
            variant=str(data["variant"]),
            model_version=int(data["model_version"]),
            round=int(data["round"]),
            reward=float(data["reward"]),
            passed=bool(data["passed"]),
            trainable=bool(data["trainable"]),
            n_tokens=int(data["n_tokens"]),
        )
