"""What AEGIS asks of a meta-agent, and the token ledger every backend keeps.

A meta-agent is the Planner (digest → proposals) and the reviser (a rejected proposal plus the
Critic's reason → a revised proposal, or None to give up); LLM backends may also route tasks to
variants. The Evolver and the Critic are not meta-agents: they are deterministic code, so a
proposal is judged the same way whichever backend wrote it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from coevo.evolution.types import Digest, Proposal
from coevo.harness.harness import Harness


@dataclass
class PlanContext:
    """What the Planner may use besides the digest.

    ``priorities``: dimension → weight (the pathology monitors raise under-explored dimensions and
    lower ones that keep failing); ``rejected``: ``Proposal.key()`` of edits already rejected for
    this variant, not to be proposed again; ``demos``: worked (user, assistant) pairs from
    reference trajectories of tasks outside the Critic's evaluation set, the only task text a
    proposal may quote; ``tools``: the tool names the environment offers; ``lessons``: short
    design lessons from earlier verdicts; ``max_proposals``: how many to return at most.
    """

    round: int = 0
    variant: str = "base"
    priorities: dict[str, float] = field(default_factory=dict)
    rejected: set[str] = field(default_factory=set)
    demos: list[tuple[str, str]] = field(default_factory=list)
    tools: list[str] = field(default_factory=list)
    lessons: list[str] = field(default_factory=list)
    max_proposals: int = 2


@dataclass
class StageUsage:
    calls: int = 0
    cached: int = 0  # answered from the disk cache (no tokens spent)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0


@dataclass
class TokenLedger:
    """Tokens per stage (plan, revise, route, judge). The rule backend records calls only."""

    stages: dict[str, StageUsage] = field(default_factory=dict)

    def record(self, stage: str, *, prompt_tokens: int = 0, completion_tokens: int = 0, seconds: float = 0.0,
               cached: bool = False) -> None:
        u = self.stages.setdefault(stage, StageUsage())
        u.calls += 1
        u.cached += int(cached)
        u.prompt_tokens += prompt_tokens
        u.completion_tokens += completion_tokens
        u.seconds += seconds

    def total(self) -> int:
        return sum(u.prompt_tokens + u.completion_tokens for u in self.stages.values())

    def as_dict(self) -> dict[str, Any]:
        return {name: vars(u).copy() for name, u in self.stages.items()} | {"total_tokens": self.total()}

    def load(self, data: dict[str, Any]) -> None:
        """Restore from ``as_dict()`` (a resumed run keeps counting where it stopped)."""
        self.stages = {name: StageUsage(**u) for name, u in data.items() if name != "total_tokens"}


class MetaAgent(Protocol):
    """A backend that plans and revises harness edits (see ``coevo.meta``)."""

    name: str
    ledger: TokenLedger

    def propose(self, digest: Digest, harness: Harness, context: PlanContext) -> list[Proposal]:
        """Hypotheses with typed edits for ``harness`` (at most ``context.max_proposals``),
        most promising first. May return [] when it has nothing left to try."""
        ...

    def revise(self, proposal: Proposal, reason: str, digest: Digest, harness: Harness,
               context: PlanContext) -> Proposal | None:
        """A revision of ``proposal`` that answers the Critic's ``reason``, or None to drop it."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs to plan exactly as the interrupted one would have (JSON-able)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...
