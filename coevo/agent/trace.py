"""The Trace: everything one episode did, in a form both AEGIS and the trainer consume."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from coevo.harness.events import Message

INFRA_SOURCES = ("policy", "env", "tool", "program")
"""``Trace.error_source`` values that make a trace an infrastructure failure: the policy call raised
(out-of-memory included), the environment raised (reset, an env tool, verify, close), a tool's
implementation raised, or an agent program failed (it crashed, hung or sent a request coevo cannot
read: ``coevo.agent.program_episode``). ``"processor"`` (a harness processor raised) is the harness's own defect."""


@dataclass
class ModelCall:
    """One policy call with the exact token ids the policy saw and produced, and the sampling
    parameters that produced them (the harness may change them per call, e.g. a temperature
    schedule), so the trainer scores each token under the distribution it was drawn from.

    ``reply_prefix`` is the text the harness prefilled the assistant turn with (``tool_choice``):
    its ``prefix_tokens`` tokens end ``prompt_ids``, and ``text`` / ``completion_ids`` are only
    what the model generated after it, so only generated tokens are sampled actions. The reply the
    harness parsed and the history holds is ``reply`` (prefix + text).
    """

    step: int
    messages: list[Message]  # the request view actually sent (after memory processors)
    prompt_ids: list[int]
    completion_ids: list[int]
    sampler_logprobs: list[float] | None
    text: str
    finish_reason: str
    trainable: bool = True
    loss_weight: float = 1.0
    temperature: float | None = None  # as requested; 0 is greedy; None: recorded before calls kept it
    top_p: float | None = None
    max_new_tokens: int | None = None
    reply_prefix: str = ""  # "": nothing prefilled (and every call recorded before prefixes existed)
    prefix_tokens: int = 0  # the last prefix_tokens of prompt_ids are reply_prefix's (0: unknown or none)
    agent: str = ""  # "": the lead agent; else the specialist whose delegated sub-episode made the call
    # [start, end) of prompt_ids that are the harness's demonstration turns, when removing them leaves exactly the
    # prompt the policy renders without them (None: no demonstrations, or not a contiguous cut)
    demo_span: list[int] | None = None
    nearest_demo_span: list[int] | None = None  # the same for the demonstration nearest the task alone

    @property
    def reply(self) -> str:
        """The whole assistant reply: the prefilled prefix and the generated text."""
        return self.reply_prefix + self.text

    def logprob_temperature(self) -> float | None:
        """The temperature this call's log-probs refer to: the sampling temperature, 1.0 for greedy
        decoding (policies report greedy log-probs at T = 1), None for a record made before model
        calls kept their sampling parameters (readable, e.g. by ``coevo export``, but not trained:
        ``coevo.trainers.batch.training_sequences`` refuses it)."""
        if self.temperature is None:
            return None
        return self.temperature if self.temperature > 0 else 1.0


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
    agent: str = ""  # "": the lead agent; else the specialist that called it in a sub-episode


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
    replies: list[str] = field(default_factory=list)  # answers to earlier user turns (an env with several)
    reward: float = 0.0
    passed: bool = False
    stop_reason: str | None = None
    error: str | None = None
    error_source: str | None = None  # who raised ``error``: "policy" | "env" | "tool" | "processor"
    trainable: bool = True
    cost: dict[str, float] = field(default_factory=dict)  # prompt/completion tokens, seconds
    journal: list[dict[str, Any]] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    verifier_info: dict[str, Any] = field(default_factory=dict)
    behaviour_logprobs: list[list[float]] | None = None  # per model call; set by the replay buffer

    @property
    def infra_failure(self) -> bool:
        """The episode crashed outside the model and its harness (``INFRA_SOURCES``): its reward 0
        says nothing about the policy or the harness, so GRPO groups and the Digester's failure
        clusters leave it out, and each round counts it."""
        return self.error_source in INFRA_SOURCES

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Trace:
        known = {f.name for f in fields(cls)}
        data = {k: v for k, v in data.items() if k in known}
        data["model_calls"] = [ModelCall(**m) for m in data.get("model_calls", [])]
        data["tool_calls"] = [ToolCallRecord(**t) for t in data.get("tool_calls", [])]
        return cls(**data)
