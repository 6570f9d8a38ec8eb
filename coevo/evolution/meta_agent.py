"""What AEGIS asks of a meta-agent, and the token ledger every backend keeps.

A meta-agent is the Planner (digest → proposals) and the reviser (a rejected proposal plus the
Critic's reason → a revised proposal, or None to give up); LLM backends may also route tasks to
variants. The Evolver and the Critic are not meta-agents: they are deterministic code, so a
proposal is judged the same way whichever backend wrote it.

The interface lives here, beside the engine that calls it, so the backends (``coevo.meta``) import
``coevo.evolution`` and never the reverse; meta-agent authors import it from here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from coevo.config.schema import EvolutionConfig
from coevo.harness.events import Message
from coevo.harness.harness import Harness
from coevo.harness.library.context import pair_demo
from coevo.rundir.evolve_records import Digest, Proposal

Demo = list[Message]
"""A worked demonstration as chat turns: the task (user), then assistant turns and tool turns as
the runtime sends them, ending with the assistant's answer (``coevo.evolution.reference.reference_demo``);
the ``turns`` of a ``few_shot`` processor are a list of them, flattened."""


def as_demo(demo: Demo | tuple[str, str] | list[str]) -> Demo:
    """A demonstration as turns; a (question, reply) pair (how ``few_shot``'s ``demos`` parameter
    and hand-written contexts give one) becomes two turns."""
    if len(demo) == 2 and all(isinstance(x, str) for x in demo):
        return pair_demo(str(demo[0]), str(demo[1]))
    return [dict(turn) for turn in demo]  # type: ignore[arg-type]


def demo_question(demo: Demo) -> str:
    """The task text of a demonstration (its first user turn): the only task text a proposal may quote."""
    return next((str(t.get("content", "")) for t in demo if t.get("role") == "user"), "")


def shown_questions(proposal: Proposal) -> set[str]:
    """The task texts (user turns) of the demonstrations a proposal's ``few_shot`` edits insert or set."""
    shown: set[str] = set()
    for edit in proposal.edits:
        params = (edit.spec or {}).get("params", {}) if edit.op != "set_param" else {edit.param: edit.value}
        turns = params.get("turns") or []
        shown |= {str(t.get("content", "")) for t in turns if isinstance(t, dict) and t.get("role") == "user"}
    return shown


@dataclass
class PlanContext:
    """What the Planner may use besides the digest.

    ``priorities``: dimension → weight (the pathology monitors raise under-explored dimensions and
    lower ones that keep failing); ``rejected``: ``Proposal.key()`` of edits already rejected for
    this variant, not to be proposed again; ``demos``: worked demonstrations (``Demo``: turns in the
    runtime's structure; (question, reply) pairs are accepted and turned into two turns) from
    reference trajectories of tasks no remaining round trains on and outside the Critic's evaluation
    set, the only task text a proposal may quote; ``tools``: the tool names the environment offers;
    ``lessons``: short design lessons from earlier verdicts; ``max_proposals``: how many to return at most;
    ``inert``: processor kinds that change nothing on this agent (an agent that is a program runs its
    own tools and reads its own answers), so an edit touching only them is never proposed.
    """

    round: int = 0
    variant: str = "base"
    priorities: dict[str, float] = field(default_factory=dict)
    rejected: set[str] = field(default_factory=set)
    demos: list[Demo] = field(default_factory=list)
    tools: list[str] = field(default_factory=list)
    lessons: list[str] = field(default_factory=list)
    max_proposals: int = EvolutionConfig.max_proposals  # the schema's default, stated there only
    inert: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        self.demos = [as_demo(d) for d in self.demos]


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


class MetaAgentError(RuntimeError):
    """A meta-agent's model could not be used (unreachable, rate limited, misconfigured, an answer
    that is no answer). AEGIS records it as a warning of the round and goes on without the call's
    result; a meta-agent of one's own may raise it for the same treatment, without a traceback."""


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
