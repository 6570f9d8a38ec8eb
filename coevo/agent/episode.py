"""One episode: the generator that runs a harness's hooks around model calls, tool calls and
delegated sub-episodes, and turns what happened into a ``Trace``.

``EpisodeRun.run()`` yields a ``ChatRequest`` whenever it needs the model and receives the
``Generation`` (or the policy's exception) back; ``coevo.agent.runtime`` drives many of them
together. Failures stay local. An exception raised by the environment, a tool or a processor ends
that episode as a failed trace whose ``error`` names where it happened and whose ``error_source``
says who raised it ("policy", "env", "tool" or "processor"; the first three are infrastructure
failures, ``Trace.infra_failure``). ``Env.reset`` and every tool call run under a deadline
(``RESET_TIMEOUT_S``; ``TOOL_TIMEOUT_S``, which caps what the harness's
``tool_timeout`` sets): a subprocess behind them (``coevo.envs.line_process``) is killed at it, and
in-process work is abandoned (``coevo.envs.deadline.run_bounded`` says why). A tool that times out is
reported to the model as a tool error; a reset that times out fails the episode. A call of a
specialist's ``ask_<agent>`` tool runs a sub-episode inline (``_delegate``), whose model requests
the driver batches with everyone else's.
"""

from __future__ import annotations

import copy
import time
import uuid
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from coevo.agent.firing import EpisodeError, fire
from coevo.agent.policy import ChatRequest, Generation
from coevo.agent.trace import ModelCall, ToolCallRecord, Trace
from coevo.envs.base import Env, EnvSession, Score, Task
from coevo.envs.deadline import DeadlineExceeded, run_bounded
from coevo.harness import events as ev
from coevo.harness.errors import ProcessorContractError
from coevo.harness.events import Message
from coevo.harness.harness import Harness
from coevo.harness.hooks import Hook

if TYPE_CHECKING:
    from coevo.harness.library.delegation import Specialist

Episode = Generator[ChatRequest, Generation, Trace]

RESET_TIMEOUT_S = 60.0
"""Seconds an env's reset may take; past it the episode fails as an env error (a simulator
subprocess is killed; in-process work is abandoned: docs/RELIABILITY.md). No config field."""
TOOL_TIMEOUT_S = 60.0
"""Seconds a tool call may take at most; the harness's ``tool_timeout`` processor sets shorter limits
per tool (the knob to tune), this caps them. Past it the model is shown a timeout error and a
simulator subprocess is killed and restarted on its next use. No config field."""
MAX_DELEGATION_DEPTH = 2
"""Sub-episodes within sub-episodes at most this deep (a specialist's harness drops the lead's
specialists, so the built-in ones nest one level; a harness of one's own may nest more)."""


def tool_message(name: str, result: ev.ToolResult) -> Message:
    """The turn that shows the model a tool's result: what every episode appends after a tool
    call, and what a worked demonstration must show in the same place."""
    content = result.output if result.error is None else f"Error: {result.error}\n{result.output}".rstrip()
    return {"role": "tool", "name": name, "content": content}


@dataclass(frozen=True)
class Job:
    """One episode to run: a task on a harness (``variant`` labels which harness variant)."""

    task: Task
    harness: Harness
    variant: str = "base"
    trace_id: str | None = None


def call_with_timeout(fn: Callable[[], ev.ToolResult], timeout_s: float) -> tuple[ev.ToolResult, bool]:
    """Run a tool under a deadline (``run_bounded``); returns (result, timed_out). A tool talking
    to a subprocess through ``LineProcess`` is killed at the deadline; in-process work that ignores
    it cannot be stopped (Python cannot kill a thread) and is abandoned, its late result dropped."""
    result, outcome = run_bounded(fn, timeout_s)
    if outcome != "done":
        return ev.ToolResult("", error=f"tool timed out after {timeout_s:g} s", seconds=timeout_s), True
    if not isinstance(result, ev.ToolResult):
        raise TypeError(f"tool returned {type(result).__name__}, expected ToolResult")
    return result, False


class EpisodeRun:
    """State and steps of one episode; ``run()`` is the generator the driver advances.

    A delegated sub-episode (``_delegate``) is an ``_EpisodeRun`` too, at ``depth`` > 0 with its
    ``agent`` name: it works on its lead's open ``session`` from the ``request`` it was given, and
    its lead runs its ``_steps`` inline (no reset, verification or close of its own)."""

    def __init__(self, job: Job, env: Env, model_version: str, max_steps: int, *, depth: int = 0, agent: str = "",
                 session: EnvSession | None = None, request: str | None = None,
                 tools: dict[str, ev.ToolSpec] | None = None,
                 reset_timeout_s: float = RESET_TIMEOUT_S, tool_timeout_s: float = TOOL_TIMEOUT_S) -> None:
        self.job, self.env, self.harness = job, env, job.harness
        self.reset_timeout_s, self.tool_timeout_s = reset_timeout_s, tool_timeout_s
        self.max_steps, self.depth, self.agent = max_steps, depth, agent
        self._given = (session, request, tools) if session is not None else None
        task = job.task
        self.trace = Trace(
            trace_id=job.trace_id or uuid.uuid4().hex,
            task_id=task.task_id,
            env=task.env,
            split=task.split,
            harness_id=job.harness.id,
            variant=job.variant,
            model_version=model_version,
        )
        self.state = ev.EpisodeState(task=ev.TaskView(task.task_id, task.env, task.instruction, task.split))
        self.session: EnvSession | None = None

    def _count(self, key: str, n: int = 1) -> None:
        self.state.usage[key] = self.state.usage.get(key, 0) + n

    def run(self) -> Episode:
        start = time.perf_counter()
        try:
            yield from self._steps()
            self._verify()
        except EpisodeError as err:
            self.trace.error, self.trace.error_source = str(err), err.source
            self.state.stop("error")
        except Exception as err:  # a policy failure thrown in by the driver (out-of-memory included)
            self.trace.error, self.trace.error_source = f"policy: {type(err).__name__}: {err}", "policy"
            self.state.stop("error")
        finally:
            if self.session is not None:
                try:
                    self.session.close()
                except Exception as err:
                    if self.trace.error is None:
                        self.trace.error, self.trace.error_source = f"env close: {type(err).__name__}: {err}", "env"
        return self._finish(time.perf_counter() - start)

    def _steps(self) -> Episode:
        state, harness, log = self.state, self.harness, self.trace.events
        if self._given is not None:  # a delegated sub-episode: the lead's session, the lead's request
            self.session, request, tools = self._given
            state.messages = [{"role": "user", "content": request}]
            state.available_tools = dict(tools or {})
        else:
            try:
                self.session = self._reset()
                state.messages = [{"role": "user", "content": self.session.observation}]
                state.available_tools = dict(self.session.tools)
            except Exception as err:
                raise EpisodeError("env reset", err, "env") from err
        state.max_steps = self.max_steps
        fire(harness, Hook.TASK_START, ev.TaskStartEvent(state), log)
        state.prefix_len = len(state.messages)
        while not state.done:
            fire(harness, Hook.STEP_START, ev.StepStartEvent(state), log)
            request = fire(
                harness,
                Hook.BEFORE_MODEL,
                ev.ModelRequestEvent(state, messages=copy.deepcopy(state.messages),
                                     sampling=copy.deepcopy(state.sampling)),
                log,
            )
            sampling = copy.deepcopy(request.sampling)  # what the policy is asked for, kept on the call
            prefix = request.reply_prefix
            if not isinstance(prefix, str):
                err = ProcessorContractError(f"reply_prefix must be a str, got {type(prefix).__name__}")
                raise EpisodeError(f"processors at {Hook.BEFORE_MODEL.value}", err, "processor")
            generation = yield ChatRequest(request.messages, request.sampling, prefix, self.job.task.task_id,
                                           self.agent,
                                           len(state.replies), self.trace.trace_id)
            self._count("model_calls")
            self._count("prompt_tokens", len(generation.prompt_ids))
            self._count("completion_tokens", len(generation.completion_ids))
            call = ModelCall(
                step=state.step,
                messages=request.messages,
                prompt_ids=list(generation.prompt_ids),
                completion_ids=list(generation.completion_ids),
                sampler_logprobs=None if generation.logprobs is None else list(generation.logprobs),
                text=generation.text,
                finish_reason=generation.finish_reason,
                temperature=float(sampling.temperature),
                top_p=float(sampling.top_p),
                max_new_tokens=int(sampling.max_new_tokens),
                reply_prefix=prefix,
                prefix_tokens=generation.prefix_tokens,
                agent=self.agent,
                demo_span=generation.demo_span,
                nearest_demo_span=generation.nearest_demo_span,
            )
            self.trace.model_calls.append(call)
            reply = call.reply  # a prefilled prefix is part of the reply the parser and the history see
            out: ev.ParsedOutputEvent = fire(
                harness,
                Hook.AFTER_MODEL,
                ev.ModelOutputEvent(state, reply, generation.finish_reason, len(self.trace.model_calls) - 1),
                log,
            )
            call.trainable, call.loss_weight = out.trainable, out.loss_weight
            state.messages.append({"role": "assistant", "content": reply})
            actions = yield from self._act(out)
            if self.session.done:  # before step_end: a game won on the last allowed step is won, not cut
                state.stop("env_done")
            fire(harness, Hook.STEP_END, ev.StepEndEvent(state, actions=actions), log)
            if not state.done:
                state.step += 1
                if state.step >= self.max_steps:
                    state.stop("step_cap")
        fire(harness, Hook.TASK_END, ev.TaskEndEvent(state), log)

    def _act(self, out: ev.ParsedOutputEvent) -> Generator[ChatRequest, Generation, list[str]]:
        """Carry out what the parsed completion asks for; return short action descriptions. A
        generator: a delegated tool call yields its sub-episode's model requests."""
        state = self.state
        actions: list[str] = []
        for call in out.tool_calls:
            actions.append((yield from self._tool(call)))
        if not out.tool_calls and out.answer is not None and not out.hold_answer:
            following = self._next_user_turn(out.answer)
            if following is None:
                state.final_answer = out.answer
                state.stop("answer")
                actions.append(f"answer {out.answer}")
            else:  # the user speaks again: the episode goes on
                state.replies.append(out.answer)
                state.messages.append({"role": "user", "content": following})
                self._count("user_turns")
                actions.append(f"reply {out.answer}")
        state.messages.extend(out.followup)
        if not out.tool_calls and not out.followup and not state.done and not actions:
            state.stop("no_action")
        return actions

    def _tool(self, call: ev.ToolCall) -> Generator[ChatRequest, Generation, str]:
        state, harness, log = self.state, self.harness, self.trace.events
        before = fire(harness, Hook.BEFORE_TOOL, ev.ToolCallEvent(state, call=call, timeout_s=self.tool_timeout_s), log)
        call, result = before.call, before.result
        blocked = result is not None
        if result is None:
            spec = state.tools.get(call.name)
            provider = harness.get(spec.provider) if spec is not None and spec.provider in harness else None
            if provider is not None and provider.delegates:
                result = yield from self._delegate(provider, call)
            else:
                result = self._execute(call, min(before.timeout_s, self.tool_timeout_s))
        after = fire(harness, Hook.AFTER_TOOL, ev.ToolResultEvent(state, call=call, result=result), log)
        result = after.result
        self._count("tool_calls")
        self._count("tool_errors", result.error is not None)
        self.trace.tool_calls.append(
            ToolCallRecord(state.step, call.name, call.arguments, result.output, result.error, result.seconds,
                           call.call_id, blocked, agent=self.agent)
        )
        state.messages.append(tool_message(call.name, result))
        return f"{call.name}({_short(call.arguments)})"

    def _reset(self) -> EnvSession:
        """``env.reset`` within ``reset_timeout_s``; a session an abandoned reset returns later is
        closed then, so what it opened does not outlive the episode."""
        task = self.job.task
        session, outcome = run_bounded(lambda: self.env.reset(task), self.reset_timeout_s, on_late=_close_quietly)
        if outcome != "done":
            why = " (abandoned: in-process work cannot be stopped)" if outcome == "abandoned" else ""
            raise DeadlineExceeded(f"reset timed out after {self.reset_timeout_s:g} s{why}")
        return session  # type: ignore[return-value]

    def _execute(self, call: ev.ToolCall, timeout_s: float) -> ev.ToolResult:
        spec = self.state.tools.get(call.name)
        if spec is None:
            return ev.ToolResult("", error=f"unknown tool {call.name!r}; available: {sorted(self.state.tools)}")
        session = self.session
        if spec.provider == "env":
            fn = lambda: session.call_tool(call.name, call.arguments)  # noqa: E731
            where, source = f"env tool {call.name!r}", "env"
        else:
            provider = self.harness.get(spec.provider)
            fn = lambda: provider.call_tool(call.name, call.arguments, timeout_s)  # noqa: E731
            where, source = f"tool {call.name!r} of processor {spec.provider!r}", "tool"
        start = time.perf_counter()
        try:
            result, timed_out = call_with_timeout(fn, timeout_s)
        except Exception as err:
            raise EpisodeError(where, err, source) from err
        self._count("tool_timeouts", timed_out)
        if not result.seconds:
            result = ev.ToolResult(result.output, result.error, time.perf_counter() - start)
        return result

    def _next_user_turn(self, reply: str) -> str | None:
        """The env's next user turn after the agent's ``reply`` (``EnvSession.respond``, optional):
        a string continues the conversation, None (or no ``respond``) ends the episode with ``reply``
        as the final answer. A delegated sub-episode never talks to the user."""
        if self.depth > 0:
            return None
        try:
            following = self.session.respond(reply)
        except Exception as err:
            raise EpisodeError("env respond", err, "env") from err
        if following is not None and not isinstance(following, str):
            raise EpisodeError("env respond", TypeError(f"respond returned {type(following).__name__}, "
                                                         "expected the next user message (str) or None"), "env")
        return following

    def _delegate(self, specialist: Specialist, call: ev.ToolCall) -> Generator[ChatRequest, Generation, ev.ToolResult]:
        """Run ``specialist``'s sub-episode on this episode's session and return its report as the
        tool's result. Its model calls, tool calls and events join this trace (tagged with the
        specialist's name, exact token ids kept, so GRPO trains on them); anything that goes wrong
        inside it (a crash, the policy failing, the step cap, no answer) comes back as the tool's
        error and the lead goes on."""
        name = specialist.config["agent"]
        request = call.arguments.get("request")
        if not isinstance(request, str) or not request.strip():
            return ev.ToolResult("", error=f"{call.name} needs a non-empty 'request' string")
        if self.depth + 1 > MAX_DELEGATION_DEPTH:
            return ev.ToolResult("", error=f"delegation deeper than {MAX_DELEGATION_DEPTH} level(s) is not allowed")
        start = time.perf_counter()
        agent = f"{self.agent}/{name}" if self.agent else name
        try:
            harness = specialist.harness_for(self.harness)
            sub = EpisodeRun(Job(self.job.task, harness, self.job.variant), self.env, self.trace.model_version,
                              min(self.max_steps, specialist.config["max_steps"]), depth=self.depth + 1, agent=agent,
                              session=self.session, request=request, tools=self.state.available_tools,
                              tool_timeout_s=self.tool_timeout_s)
        except Exception as err:  # the specialist's harness does not compose
            return ev.ToolResult("", error=f"specialist {name!r} could not start: {type(err).__name__}: {err}")
        failure = None
        try:
            yield from sub._steps()
        except Exception as err:  # noqa: BLE001 - whatever failed stays in the sub-episode
            failure = f"specialist {name!r} failed: {err}" if isinstance(err, EpisodeError) else (
                f"specialist {name!r} failed: {type(err).__name__}: {err}")
        self._adopt(sub)
        seconds = time.perf_counter() - start
        if failure is not None:
            return ev.ToolResult("", error=failure, seconds=seconds)
        if sub.state.final_answer is None:
            return ev.ToolResult("", error=f"specialist {name!r} gave no answer (stopped: {sub.state.stop_reason})",
                                 seconds=seconds)
        return ev.ToolResult(str(sub.state.final_answer), seconds=seconds)

    def _adopt(self, sub: EpisodeRun) -> None:
        """A finished sub-episode's records and costs, added to this episode's."""
        self.trace.model_calls += sub.trace.model_calls
        self.trace.tool_calls += sub.trace.tool_calls
        self.trace.events += [{**e, "agent": sub.agent} for e in sub.trace.events]
        for key, n in sub.state.usage.items():
            self._count(key, n)
        self._count("delegations")

    def _verify(self) -> None:
        try:
            score = self.session.verify(self.state.final_answer)
        except Exception as err:
            raise EpisodeError("env verify", err, "env") from err
        record_score(self.trace, score, "env verify", "env")

    def _finish(self, seconds: float) -> Trace:
        return finish_trace(self.trace, self.state, seconds)


def record_score(trace: Trace, score: Score, where: str, source: str) -> None:
    """``score`` on ``trace``; a reward outside [0, 1] fails the episode as ``where``'s error."""
    if not 0.0 <= score.reward <= 1.0:
        raise EpisodeError(where, ValueError(f"reward {score.reward} outside [0, 1]"), source)
    trace.reward, trace.passed = float(score.reward), bool(score.passed)
    trace.verifier_info = dict(score.info)


def finish_trace(t: Trace, s: ev.EpisodeState, seconds: float) -> Trace:
    """The episode's state copied onto its trace (a failed one scores 0 and is never trained on)."""
    if t.error is not None:
        t.reward, t.passed, s.trainable = 0.0, False, False
    t.messages = s.messages
    t.final_answer = s.final_answer
    t.replies = list(s.replies)
    t.stop_reason = s.stop_reason
    t.trainable = s.trainable
    t.journal, t.metrics = s.journal, s.metrics
    t.cost = {
        "prompt_tokens": s.usage.get("prompt_tokens", 0),
        "completion_tokens": s.usage.get("completion_tokens", 0),
        "seconds": round(seconds, 4),
    }
    return t


def _close_quietly(session: EnvSession) -> None:
    """Close a session nobody will use (a reset's that came too late); its errors go nowhere."""
    try:
        session.close()
    except Exception:  # noqa: BLE001, S110 - no episode is left to report it to
        pass


def _short(arguments: dict[str, Any], width: int = 80) -> str:
    text = ", ".join(f"{k}={v!r}" for k, v in arguments.items())
    return text if len(text) <= width else text[: width - 1] + "…"
