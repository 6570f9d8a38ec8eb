"""What a protocol run produces: one outcome per (stage, cohort, task), plus per-stage costs."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from coevo.harness.harness import Harness


@dataclass(frozen=True)
class Outcome:
    """The attempts of one evaluation task under the harness of one stage.

    For the task-specific reference ``stage`` is the task's own cohort (the reference does not
    depend on the stage: the task sees only its own capabilities)."""

    stage: int  # the stage whose harness ran
    cohort: int  # the stage the task was introduced at (<= stage)
    task_id: str
    passed: tuple[bool, ...]  # one per attempt
    tokens: int  # prompt + completion tokens over the attempts
    harness_id: str

    @property
    def rate(self) -> float:
        """pass@1 of this task: the share of attempts that passed."""
        return sum(self.passed) / len(self.passed) if self.passed else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "passed": list(self.passed)}


@dataclass
class ProtocolResult:
    """One protocol over a whole stream. Per-stage lists are indexed by stage."""

    protocol: str
    n_stages: int
    outcomes: list[Outcome] = field(default_factory=list)
    adapt_tokens: list[int] = field(default_factory=list)  # tokens of adaptation rollouts (self-evolving)
    critic_episodes: list[int] = field(default_factory=list)  # episodes the Critic re-ran while adapting
    harness_ids: list[list[str]] = field(default_factory=list)  # distinct harnesses evaluated at each stage
    evolve_reports: list[dict[str, Any]] = field(default_factory=list)  # AEGIS reports, with their stage
    harnesses: list[dict[str, Harness]] = field(default_factory=list)  # [stage] → variant → harness evaluated

    def __post_init__(self) -> None:
        for name in ("adapt_tokens", "critic_episodes"):
            if not getattr(self, name):
                setattr(self, name, [0] * self.n_stages)
        if not self.harness_ids:
            self.harness_ids = [[] for _ in range(self.n_stages)]
