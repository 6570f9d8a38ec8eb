"""What ``coevo stream`` runs, as one typed config: the stream's own fields, then the main job's
``rollout`` and ``evolution`` groups (``coevo.config.schema``), so episodes, the Critic and AEGIS
are built from the same fields, by the same builders (``coevo.loop.builders``), as in
``python train.py``. Checked when built: a bad value is a ``ValueError`` naming the field."""

from __future__ import annotations

from dataclasses import dataclass, field

from coevo.config.schema import EvolutionConfig, RolloutConfig, opt, violations
from coevo.streams.axes import get_axis
from coevo.streams.protocols import PROTOCOLS


def _rollout() -> RolloutConfig:
    return RolloutConfig(attempts=1)  # one episode per task: pass@1 is the stream's measure


def _evolution() -> EvolutionConfig:
    return EvolutionConfig(gate="seesaw", critic_attempts=1)  # a scripted or greedy policy needs no paired test


@dataclass(frozen=True)
class StreamConfig:
    axis: str = opt("tools", "tools | skills | agents: what each stage releases (agents: specialists of a lead "
                    "agent, by the env's tool_owners map)")
    stages: int = opt(3, "stages S (clipped to the number of capabilities on the axis)", ge=1)
    protocols: tuple[str, ...] = opt(PROTOCOLS, "deployment | self_evolving, each at most once")
    rounds_per_stage: int = opt(1, "self-evolving: AEGIS rounds on each stage's adaptation split", ge=0)
    adapt_limit: int | None = opt(8, "adaptation tasks per cohort", ge=1, none="all")
    eval_limit: int | None = opt(16, "evaluation tasks per cohort", ge=1, none="all")
    eval_splits: tuple[str, ...] = opt(("val",), "the env splits evaluated")
    distractors_per_stage: int = opt(2, "tools axis: fake tools added per stage", ge=0)
    references_per_stage: int = opt(4, "train tasks per cohort beyond its adaptation split whose gold trajectories "
                                    "may serve as demonstrations", ge=0)
    seed: int = opt(0, "sampling seed and which tasks the limits keep")
    rollout: RolloutConfig = field(default_factory=_rollout)  # attempts: episodes per task (pass@1 is their mean)
    evolution: EvolutionConfig = field(default_factory=_evolution)  # self-evolving's Critic and AEGIS

    def __post_init__(self) -> None:
        if isinstance(self.protocols, str):
            raise ValueError(  # noqa: TRY004 - a string is a list of names mistyped, as elsewhere in coevo
                f"protocols must be a list of names from {list(PROTOCOLS)}, not the string {self.protocols!r}")
        protocols = list(self.protocols)
        if not protocols or any(p not in PROTOCOLS for p in protocols) or len(set(protocols)) != len(protocols):
            raise ValueError(f"protocols must be distinct names from {list(PROTOCOLS)}, got {protocols}")
        get_axis(self.axis)
        problem = next(violations(self), None)
        if problem is not None:
            raise ValueError(problem)
