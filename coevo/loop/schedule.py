"""What a ``Coevolution`` is given besides its collaborators: the tasks, the schedule of its rounds,
the weights' half of a round, and how several processes share one. Plain values a builder
(``coevo.loop.build``, a stream's stage) fills once; the loop reads them and never changes them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from coevo.envs.base import Task

if TYPE_CHECKING:
    from coevo.buffers import ReplayBuffer
    from coevo.trainers.grpo import GRPOTrainer


T = TypeVar("T")


def every_round(r: int) -> bool:
    return True


@dataclass(frozen=True)
class Splits:
    """The run's tasks: train batches come from ``train``; ``val`` is evaluated every ``val_every``
    rounds and at the end (and picks epoch-end snapshots); ``test`` only once, at the end."""

    train: Sequence[Task]
    val: Sequence[Task] = ()
    test: Sequence[Task] = ()


@dataclass(frozen=True)
class Schedule:
    """What each round does. The fields that mirror config fields (the first seven) have no default,
    so the config (``coevo.config.schema``) is their only source.

    ``first_round``: the number of the first round, for a loop that continues an engine's history (a
    stream's next stage: AEGIS's monitors need round numbers that only grow). ``evolve_rounds(r)``:
    whether round ``r`` evolves the harness (a schedule that leaves rounds to the weights).
    ``signal_groups``/``max_extra_tasks``: dynamic sampling (``rollout.*``). ``unscaffolded_attempts``:
    episodes of each task without its harness's outermost scaffold layer. ``critic_episodes``: the
    Critic's episodes a round may spend, for the time estimate only."""

    rounds: int
    batch_tasks: int
    attempts: int
    seed: int
    steps_per_round: int
    val_every: int
    eval_attempts: int
    step_traces: int | None = None
    first_round: int = 0
    evolve_rounds: Callable[[int], bool] = every_round
    signal_groups: int | None = None
    max_extra_tasks: int = 0
    unscaffolded_attempts: int = 0
    critic_episodes: int = 0


@dataclass(frozen=True)
class Training:
    """The weights' half of a round: ``trainer`` on every process; ``buffer`` and ``logprob_fn`` (the
    behaviour log-probs of what enters the buffer) on rank 0 only. ``sampler_logprobs``: store the
    policy's own sampling log-probs as behaviour log-probs (``buffers.logprobs.sampler_first``)
    instead of recomputing them. ``critic_traces``: the Critic's paired re-runs join their tasks'
    GRPO groups (the gate's evidence trains too)."""

    trainer: GRPOTrainer
    buffer: ReplayBuffer | None = None
    logprob_fn: Callable | None = None
    sampler_logprobs: bool = False
    critic_traces: bool = False


def _identity(obj: T) -> T:
    return obj


def _nothing() -> None:
    return None


@dataclass(frozen=True)
class Processes:
    """Several processes running one loop: rank 0 (``is_main``) rolls out, evolves, evaluates and
    writes; every rank takes part in each GRPO step. ``share(obj)``: rank 0's object on every rank;
    ``sync_weights()``: the trained weights to the rollout engine; ``release_rollout()``: the rollout
    engine's memory to the trainer (vLLM's sleep mode). One process: the defaults."""

    is_main: bool = True
    share: Callable[[Any], Any] = _identity
    sync_weights: Callable[[], None] = _nothing
    release_rollout: Callable[[], None] = _nothing
