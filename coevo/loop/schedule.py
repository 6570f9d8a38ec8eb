"""What a ``Coevolution`` is given besides its collaborators: the tasks, the schedule of its rounds,
the weights' half of a round, and how several processes share one. Plain values a builder
(``coevo.loop.build``, a stream's stage) fills once; the loop reads them and never changes them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from coevo.agent.trace import Trace
from coevo.buffers.logprobs import sampler_first
from coevo.envs.base import Task
from coevo.loop.round_grpo import buffered_rollouts, critic_task_ids, critic_traces_to_store

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
    GRPO groups (the gate's evidence trains too). The methods below run on rank 0."""

    trainer: GRPOTrainer
    buffer: ReplayBuffer | None = None
    logprob_fn: Callable | None = None
    sampler_logprobs: bool = False
    critic_traces: bool = False

    @property
    def replay(self) -> ReplayBuffer:
        """The replay buffer (rank 0 holds it)."""
        assert self.buffer is not None, "the replay buffer lives on rank 0"
        return self.buffer

    def store(self, traces: Sequence[Trace], r: int, version: int) -> None:
        """``traces`` into the buffer as round ``r``'s, sampled by ``version``, with their behaviour
        log-probs: the sampler's own where the run trusts them, else a forward pass of the model."""
        assert self.logprob_fn is not None
        fn = sampler_first(traces, self.logprob_fn) if self.sampler_logprobs else self.logprob_fn
        self.replay.add(traces, round=r, model_version=version, logprob_fn=fn)

    def buffered(self, r: int) -> tuple[list[Trace], list[Trace]] | None:
        """Round ``r``'s episodes and those without the scaffolding, when a killed run stored them."""
        return buffered_rollouts(self.replay, r)

    def store_critic(self, reruns: Sequence[Trace], r: int, version: int, withheld: set[str]) -> set[str]:
        """Store the round's Critic re-runs (the model has not changed since they ran: exact;
        ``round_grpo.critic_traces_to_store`` says which) and return the tasks whose groups they joined."""
        kept = critic_traces_to_store(reruns, self.replay, r, withheld)
        if kept:
            self.store(kept, r, version)
        return critic_task_ids(self.replay, r)


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
