"""The agent runtime: policies, traces, and running harnessed episodes."""

from coevo.agent.episode import Job
from coevo.agent.policy import ChatRequest, Generation, Policy, ScriptedPolicy
from coevo.agent.runtime import run_attempts, run_episode, run_episodes
from coevo.agent.trace import ModelCall, ToolCallRecord, Trace

__all__ = [
    "ChatRequest",
    "Generation",
    "Job",
    "ModelCall",
    "Policy",
    "ScriptedPolicy",
    "ToolCallRecord",
    "Trace",
    "run_attempts",
    "run_episode",
    "run_episodes",
]
