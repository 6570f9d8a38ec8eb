"""A program-driven episode: the program asks, the harness shapes each request, the policy answers.

``ProgramEpisodeRun.run()`` is a generator like ``coevo.agent.episode.EpisodeRun.run()``: it yields
a ``ChatRequest`` whenever the program needs the model and receives the ``Generation``, so the
runtime batches a program's requests with every other episode's. Between requests it blocks on
the program (which is running its tools meanwhile), as a native episode blocks on a tool call.

Each request is shaped by the harness at the interception point, as one step of a native episode:
the request's conversation and tools become the episode state, ``task_start`` assembles it (a
system prompt of the harness replaces the program's, demonstrations go before the task, the
tool listing is written in coevo's format, ``tool_registry`` hides disabled tools),
``before_model`` may prefill the reply, ``after_model`` parses tool calls from it, ``step_end``
keeps the budget. The policy's exact prompt and completion ids and log-probs are recorded as a
``ModelCall`` of the trace, so the trainer learns from what the model saw after the processors.
The program gets the reply in OpenAI form. Past the step budget a request is answered with an
empty reply cut for length (without calling the model), so the program ends the task its own way.

A program that fails to start, exits with an error, sends a request coevo cannot read, or goes
``program_timeout_s`` without a request or an end fails its episode with that cause
(``error_source`` "program", an infrastructure failure: its calls are never trained on).
"""

from __future__ import annotations

import copy
import queue
import time
import uuid
from collections.abc import Generator

from coevo.agent.episode import Episode, Job, finish_trace, record_score
from coevo.agent.firing import EpisodeError, fire
from coevo.agent.policy import ChatRequest, Generation
from coevo.agent.trace import ModelCall, Trace
from coevo.envs.base import Score
from coevo.envs.program_env import ProgramEnv
from coevo.harness import events as ev
from coevo.harness.errors import ProcessorContractError
from coevo.harness.hooks import Hook
from coevo.programs.channel import ModelChannel, PendingRequest, ProgramEnded, TokenRecord
from coevo.programs.chat_api import MalformedRequest, ProgramRequest, chat_completion, read_request

PROGRAM = "program"
"""``Trace.error_source`` of an episode its program failed (``coevo.agent.trace.INFRA_SOURCES``)."""


class ProgramEpisodeRun:
    """State and steps of one program-driven episode; ``run()`` is the generator the driver advances."""

    def __init__(self, job: Job, env: ProgramEnv, model_version: str, max_steps: int) -> None:
        self.job, self.env, self.harness, self.max_steps = job, env, job.harness, max_steps
        task = job.task
        self.trace = Trace(trace_id=job.trace_id or uuid.uuid4().hex, task_id=task.task_id, env=task.env,
                           split=task.split, harness_id=job.harness.id, variant=job.variant,
                           model_version=model_version)
        self.state = ev.EpisodeState(task=ev.TaskView(task.task_id, task.env, task.instruction, task.split),
                                     max_steps=max_steps)
        self.model = model_version

    def run(self) -> Episode:
        start = time.perf_counter()
        channel = ModelChannel(self.trace.trace_id)
        program = None
        try:
            try:
                program = self.env.launch(self.job.task, channel)
            except Exception as err:
                raise EpisodeError("program launch", err, PROGRAM) from err
            score = yield from self._serve(channel)
            self._score(score)
        except EpisodeError as err:
            self.trace.error, self.trace.error_source = str(err), err.source
            self.state.stop("error")
        except Exception as err:  # a policy failure thrown in by the driver
            self.trace.error, self.trace.error_source = f"policy: {type(err).__name__}: {err}", "policy"
            self.state.stop("error")
        finally:
            channel.close(f"episode {self.trace.trace_id} is over")
            if program is not None:
                program.stop()
        return finish_trace(self.trace, self.state, time.perf_counter() - start)

    def _serve(self, channel: ModelChannel) -> Generator[ChatRequest, Generation, object]:
        """Answer the program's requests until it ends; its score."""
        timeout = float(self.env.program_timeout_s)
        while True:
            try:
                item = channel.next(timeout)
            except queue.Empty:
                err = TimeoutError(f"no model request and no end within {timeout:g} s (program_timeout_s)")
                raise EpisodeError("program", err, PROGRAM) from None
            if isinstance(item, ProgramEnded):
                if item.error is not None:
                    raise EpisodeError("program", item.error, PROGRAM) from item.error
                self.state.stop("answer")  # the program ended the task (unless the budget did first)
                fire(self.harness, Hook.TASK_END, ev.TaskEndEvent(self.state), self.trace.events)
                if item.score is None:
                    raise EpisodeError("program", TypeError("the program ended without a score"), PROGRAM)
                return item.score
            yield from self._answer(item)

    def _answer(self, pending: PendingRequest) -> Generator[ChatRequest, Generation, None]:
        try:
            request = read_request(pending.body)
        except MalformedRequest as err:
            pending.refuse(f"malformed request: {err}")
            raise EpisodeError("program request", err, PROGRAM) from err
        state, harness, log = self.state, self.harness, self.trace.events
        if state.done:  # past the budget: an empty reply cut for length, no model call
            pending.answer(chat_completion("", [], "length", 0, 0, self.model))
            return
        if self.trace.model_calls:
            state.step += 1
        self._assemble(request)
        fire(harness, Hook.STEP_START, ev.StepStartEvent(state), log)
        shaped = fire(harness, Hook.BEFORE_MODEL, ev.ModelRequestEvent(
            state, messages=copy.deepcopy(state.messages), sampling=copy.deepcopy(state.sampling)), log)
        sampling, prefix = copy.deepcopy(shaped.sampling), shaped.reply_prefix
        if not isinstance(prefix, str):
            err = ProcessorContractError(f"reply_prefix must be a str, got {type(prefix).__name__}")
            raise EpisodeError(f"processors at {Hook.BEFORE_MODEL.value}", err, "processor")
        try:
            generation = yield ChatRequest(shaped.messages, shaped.sampling, prefix, self.job.task.task_id,
                                           episode=self.trace.trace_id)
        except GeneratorExit:  # closed before the model answered (a context check takes one request only)
            pending.refuse("the episode was closed before the model answered", 503)
            raise
        except BaseException:
            pending.refuse("the model failed on this request", 500)
            raise
        self._count("model_calls")
        self._count("prompt_tokens", len(generation.prompt_ids))
        self._count("completion_tokens", len(generation.completion_ids))
        call = ModelCall(step=state.step, messages=shaped.messages, prompt_ids=list(generation.prompt_ids),
                         completion_ids=list(generation.completion_ids),
                         sampler_logprobs=None if generation.logprobs is None else list(generation.logprobs),
                         text=generation.text, finish_reason=generation.finish_reason,
                         temperature=float(sampling.temperature), top_p=float(sampling.top_p),
                         max_new_tokens=int(sampling.max_new_tokens), reply_prefix=prefix,
                         prefix_tokens=generation.prefix_tokens, demo_span=generation.demo_span,
                         nearest_demo_span=generation.nearest_demo_span)
        self.trace.model_calls.append(call)
        out = fire(harness, Hook.AFTER_MODEL, ev.ModelOutputEvent(
            state, call.reply, generation.finish_reason, len(self.trace.model_calls) - 1), log)
        call.trainable, call.loss_weight = out.trainable, out.loss_weight
        calls = [c for c in out.tool_calls if c.name in state.tools] if isinstance(out, ev.ParsedOutputEvent) else []
        state.messages.append({"role": "assistant", "content": call.reply})
        state.final_answer = call.reply if not calls else state.final_answer
        response = chat_completion(call.reply, calls, generation.finish_reason, len(generation.prompt_ids),
                                   len(generation.completion_ids), self.model, call.sampler_logprobs)
        pending.answer(response, TokenRecord(call.prompt_ids, call.completion_ids, call.sampler_logprobs))
        self._count("tool_calls", len(calls))
        actions = [f"call {c.name}" for c in calls] or ["reply"]
        fire(harness, Hook.STEP_END, ev.StepEndEvent(state, actions=actions), log)
        if state.step + 1 >= self.max_steps:
            state.stop("step_cap")

    def _assemble(self, request: ProgramRequest) -> None:
        """The episode state for one request: the program's conversation and tools, assembled by the
        harness's ``task_start`` processors (run per request: each request carries the whole
        conversation), the request's own sampling fields where the harness sets none."""
        state = self.state
        state.messages = copy.deepcopy(request.messages)
        state.available_tools = dict(request.tools)
        state.tools = dict(request.tools)
        state.sampling = ev.SamplingParams(
            temperature=state.sampling.temperature if request.temperature is None else float(request.temperature),
            top_p=state.sampling.top_p if request.top_p is None else float(request.top_p),
            max_new_tokens=state.sampling.max_new_tokens if request.max_tokens is None else request.max_tokens,
            stop=list(request.stop))
        fire(self.harness, Hook.TASK_START, ev.TaskStartEvent(state), self.trace.events)
        state.prefix_len = len(state.messages)

    def _count(self, key: str, n: int = 1) -> None:
        self.state.usage[key] = self.state.usage.get(key, 0) + n

    def _score(self, score: object) -> None:
        if not isinstance(score, Score):
            raise EpisodeError("program", TypeError(f"scored with a {type(score).__name__}, not a Score"), PROGRAM)
        record_score(self.trace, score, "program", PROGRAM)
