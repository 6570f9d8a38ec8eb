"""What AEGIS asks of a meta-agent, re-exported for meta-agent authors.

The interface is defined beside the engine that calls it, in ``coevo.evolution.meta_agent``
(the meta-agents sit above ``coevo.evolution`` and import it, never the other way round);
this module keeps ``from coevo.meta.base import PlanContext`` and friends working.
"""

from coevo.evolution.meta_agent import (
    Demo,
    MetaAgent,
    MetaAgentError,
    PlanContext,
    StageUsage,
    TokenLedger,
    as_demo,
    demo_question,
)

__all__ = ["Demo", "MetaAgent", "MetaAgentError", "PlanContext", "StageUsage", "TokenLedger", "as_demo",
           "demo_question"]
