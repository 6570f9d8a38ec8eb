"""The Trace: everything one episode did, in a form both AEGIS and the trainer consume."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from coevo.harness.events import Message


@dataclass
class ModelCall:
    """One policy call with the exact token ids the policy saw and produced."""

    step: int
    messages: list[Message]  # the request view actually sent (after memory processors)
    prompt_ids: list[int]
    completion_ids: list[int]
    sampler_logprobs: list[float] | None
    text: str
    finish_reason: str
    trainable: bool = True
    loss_weight: float = 1.0


@dataclass
class ToolCallRecord:
    step: int
    name: str
    arguments: dict[str, Any]
    output: str
    error: str | None
    seconds: float
    call_id: str = ""
    blocked: bool = False  # a before_tool processor answered instead of the tool


@dataclass
class Trace:
    trace_id: str
    task_id: str
    env: str
    split: str
    harness_id: str
    variant: str
    model_version: str
    events: list[dict[str, Any]] = field(default_factory=list)  # one record per hook firing
    model_calls: list[ModelCall] = field(default_factory=list)
    tool_calls: list[ToolCallRecord] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)  # full history at the end
    final_answer: str | None = None
    reward: float = 0.0
    passed: bool = False
    stop_reason: str | None = None
    error: str | None = None
    trainable: bool = True
    cost: dict[str, float] = field(default_factory=dict)  # prompt/completion tokens, seconds
    journal: list[dict[str, Any]] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    verifier_info: dict[str, Any] = field(default_factory=dict)
    behaviour_logprobs: list[list[float]] | None = None  # per model call; set by the replay buffer

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Trace":
        known = {f.name for f in fields(cls)}
        data = {k: v for k, v in data.items() if k in known}
        data["model_calls"] = [ModelCall(**m) for m in data.get("model_calls", [])]
        data["tool_calls"] = [ToolCallRecord(**t) for t in data.get("tool_calls", [])]
        return cls(**data)
