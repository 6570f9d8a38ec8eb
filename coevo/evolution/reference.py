"""Reference trajectories: passing, genuine solutions of train tasks, built with the ground truth.

The Digester locates a failure at its first divergence from a reference, and AEGIS turns references
into worked demonstrations (``reference_demo``) in the runtime's own turn structure. A reference
comes from:

- the environment's gold actions (``gold_reference``): each gold tool call written the way the
  harness's ``json_tool_parser`` reads it, run in a fresh session, then the answer; kept only if
  the verifier accepts it;
- the policy itself with the answer in its context (``policy_reference``): it is told the correct
  answer and asked to solve the task with the tools; a passing trace counts only if it is
  *genuine* (``is_genuine``): it really used the tools the task needs and did not just restate
  the answer it was given.

References use ground truth, so only train tasks may have one: every entry point refuses others.
They are marked not trainable (a gold trace has no real token ids; a policy reference was
conditioned on the answer) and carry ``metrics["reference"]`` = {"source", "instruction"}.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import os
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

from coevo.agent.episode import tool_message
from coevo.agent.rollouts import RolloutService
from coevo.agent.trace import ModelCall, ToolCallRecord, Trace
from coevo.envs.base import Env, Task
from coevo.evolution.meta_agent import demo_question
from coevo.evolution.steps import trace_steps
from coevo.harness.events import Message, ToolResult
from coevo.harness.harness import Harness
from coevo.harness.library.context import InstructionTemplate, demo_problem
from coevo.harness.library.tools import tool_call_text
from coevo.safety.traces import redact_trace

HINT = "The correct answer is {answer}. Solve it step by step with the tools, then give the answer."
"""Appended to the task message for a policy reference; {answer} is the ground truth."""
MIN_REASONING_WORDS = 5
"""Words besides the answer that a tool-free reference's answering reply must hold."""
REFERENCE_VARIANT = "reference"
MAX_NAME_CHARS = 200
_ANSWER_TAG_RE = re.compile(r"<answer>[\s\S]*?</answer>")
_WORD_RE = re.compile(r"\w+")


def _require_train(task: Task) -> None:
    if task.split != "train":
        raise ValueError(
            f"task {task.task_id!r} is in split {task.split!r}; references use ground truth, so only "
            "split 'train' may have one"
        )


def answer_text(answer: Any) -> str:
    """The ground truth as an agent would write it: strings as they are, other values as JSON."""
    if isinstance(answer, str):
        return answer
    if isinstance(answer, (int, float)) and not isinstance(answer, bool):
        return str(answer)
    return json.dumps(answer, ensure_ascii=False)


def required_tools(task: Task, offered: Iterable[str] | None = None) -> set[str]:
    """Tools a genuine solution must call: those of the gold actions, ``tool:<name>``
    capabilities, and bare capabilities (no ``kind:`` prefix) that name a tool, i.e. that are in
    ``offered`` when it is given, or any bare capability when it is not."""
    offered_set = None if offered is None else set(offered)
    names = {c.name for c in task.gold_actions}
    for cap in task.capabilities:
        if cap.startswith("tool:"):
            names.add(cap[len("tool:"):])
        elif ":" not in cap and (offered_set is None or cap in offered_set):
            names.add(cap)
    return names


def _mark(trace: Trace, source: str, task: Task) -> Trace:
    trace.trainable = False
    trace.metrics = {**trace.metrics, "reference": {"source": source, "instruction": task.instruction}}
    return trace


def gold_reference(env: Env, task: Task) -> Trace | None:
    """The task's gold actions as a trace, run for real in a fresh session; None when the task has
    no gold actions, a gold call returns an error, or the verifier refuses the result.

    Each gold call is one step whose completion is the call's ``<tool_call>`` text; then a last
    step answers ``<answer>{ground truth}</answer>`` (``env.gold_answer(task)`` when the env has
    one) unless the environment ended the episode (a game won by its last action). A conversation
    with several user turns (``task.metadata["turn_calls"]``, ``EnvSession.respond``) answers each
    earlier turn after its calls (``task.metadata["gold_replies"]``) and goes on with the user's
    next message, as the runtime does. Environment exceptions propagate: a broken env is a bug to
    see, not a missing reference.
    """
    _require_train(task)
    if not task.gold_actions:
        return None
    session = env.reset(task)
    try:
        messages: list[Message] = [{"role": "user", "content": session.observation}]
        trace = Trace(trace_id=f"gold:{task.task_id}", task_id=task.task_id, env=task.env, split=task.split,
                      harness_id="gold", variant=REFERENCE_VARIANT, model_version="gold")

        def model_call(step: int, text: str) -> None:
            trace.model_calls.append(ModelCall(step, copy.deepcopy(messages), [], [], None, text, "stop", False))
            messages.append({"role": "assistant", "content": text})

        turn_ends = list(itertools.accumulate(task.metadata.get("turn_calls") or []))[:-1]
        replies = list(task.metadata.get("gold_replies") or [])
        step = 0
        for k, call in enumerate(task.gold_actions):
            if turn_ends and k == turn_ends[0]:  # this user turn's calls are made: answer it, hear the next
                turn_ends.pop(0)
                reply = replies.pop(0) if replies else "done"
                model_call(step, f"<answer>{reply}</answer>")
                trace.events.append({"hook": "after_model", "step": step, "tool_calls": [], "answer": reply,
                                     "parse_error": None})
                trace.replies.append(reply)
                following = session.respond(reply)
                if following is None:  # the conversation ended before the gold calls did
                    return None
                messages.append({"role": "user", "content": following})
                step += 1
            model_call(step, tool_call_text(call))
            trace.events.append({"hook": "after_model", "step": step, "tool_calls": [call.name], "answer": None,
                                 "parse_error": None})
            result = session.call_tool(call.name, dict(call.arguments))
            trace.tool_calls.append(ToolCallRecord(step, call.name, dict(call.arguments), result.output, result.error,
                                                   result.seconds, f"s{step}c0"))
            if result.error is not None:
                return None
            messages.append(tool_message(call.name, result))
            step += 1
            if session.done:
                break
        step -= 1
        if session.done:
            trace.stop_reason = "env_done"
        else:
            step += 1
            answer = env.gold_answer(task)
            answer = answer_text(task.answer) if answer is None else answer
            if session.respond(answer) is not None:  # the runtime hands every answer to the user
                return None  # the user still had something to ask: not a whole conversation
            model_call(step, f"<answer>{answer}</answer>")
            trace.events.append({"hook": "after_model", "step": step, "tool_calls": [], "answer": answer,
                                 "parse_error": None})
            trace.final_answer, trace.stop_reason = answer, "answer"
        trace.events.append({"hook": "task_end", "step": step, "stop_reason": trace.stop_reason,
                             "answer": trace.final_answer})
        score = session.verify(trace.final_answer)
    finally:
        session.close()
    if not score.passed:
        return None
    trace.messages = messages
    trace.reward, trace.passed, trace.verifier_info = float(score.reward), True, dict(score.info)
    return _mark(trace, "gold", task)


def hinted_harness(harness: Harness, task: Task) -> Harness:
    """``harness`` with the correct answer and ``HINT`` appended to the task message.

    An existing ``instruction_template`` keeps its template, extended by the hint; otherwise one is
    inserted first at task_start, so few-shot demos inserted later still go before the task.
    """
    hint = HINT.replace("{answer}", answer_text(task.answer))
    holder = next((p for p in harness if p.group == InstructionTemplate.group), None)
    if holder is None:
        return harness.insert(InstructionTemplate(template="{instruction}\n\n" + hint), index=0)
    if holder.kind != InstructionTemplate.kind:
        raise ValueError(
            f"processor {holder.name!r} ({holder.kind}) holds the instruction group; a policy reference "
            f"needs an {InstructionTemplate.kind!r} there to add the hint"
        )
    return harness.set_param(holder.name, "template", holder.config["template"] + "\n\n" + hint)


def is_genuine(trace: Trace, task: Task, offered: Iterable[str] | None = None) -> tuple[bool, str]:
    """Whether ``trace`` solves ``task`` rather than restating a known answer; (ok, reason).

    Genuine means: every tool in ``required_tools(task, offered)`` was called at least once without
    error; when tools are required, the first model call does not answer before any tool call;
    when none are, the answering reply holds at least ``MIN_REASONING_WORDS`` words of reasoning
    besides the answer itself.
    """
    if trace.task_id != task.task_id:
        raise ValueError(f"trace is for task {trace.task_id!r}, not {task.task_id!r}")
    steps = trace_steps(trace)
    if not steps:
        return False, "no model call"
    required = required_tools(task, offered)
    used = {r.name for r in trace.tool_calls if r.error is None and not r.blocked}
    missing = sorted(required - used)
    if missing:
        return False, f"required tool(s) {missing} never called without error"
    if required and steps[0].action()[0] == "answer":
        return False, "the first model call states the answer before any tool call"
    if not required:
        answering = next((s for s in steps if s.answer is not None), None)
        if answering is None:
            return False, "no answer"
        rest = _ANSWER_TAG_RE.sub(" ", answering.completion).replace(answering.answer or "", " ")
        if len(_WORD_RE.findall(rest)) < MIN_REASONING_WORDS:
            return False, "the answer is restated without reasoning"
    return True, "genuine"


def _policy_references(tasks: Sequence[Task], harness: Harness, rollouts: RolloutService,
                       attempts: int) -> dict[str, Trace]:
    """All attempts of all tasks in one rollout (one batch for the policy); per task, the first
    passing genuine trace in attempt order."""
    if attempts < 1:
        raise ValueError(f"attempts must be >= 1, got {attempts}")
    for task in tasks:
        _require_train(task)
    done = rollouts.run([hinted_harness(harness, task) for task in tasks], tasks, attempts=attempts, phase=None,
                        variant=REFERENCE_VARIANT, label="policy references",
                        trace_id=lambda task, k: f"policy:{task.task_id}:{k}")
    by_id = {t.task_id: t for t in tasks}
    found: dict[str, Trace] = {}
    for trace in done.traces:
        if trace.task_id in found or not trace.passed:
            continue
        task = by_id[trace.task_id]
        if is_genuine(trace, task)[0]:
            found[trace.task_id] = _mark(trace, "policy", task)
    return found


def policy_reference(task: Task, harness: Harness, rollouts: RolloutService, attempts: int) -> Trace | None:
    """The policy's own solution with the answer in its context (see ``hinted_harness``): the
    first of ``attempts`` tries that passes and ``is_genuine``, or None (episodes run through
    ``rollouts``: its policy and env)."""
    return _policy_references([task], harness, rollouts, attempts).get(task.task_id)


class ReferenceStore:
    """References cached on disk, one JSON file per task id in the directory ``path``.

    Writes are atomic (a temporary file, then ``os.replace``), so a crash leaves the previous
    reference or none, never half a file. File names are the percent-encoded task ids (shortened
    with a hash when too long for a file system); each file also holds its task id. What is stored
    holds no secret value (``coevo.safety.traces.redact_trace``, token ids re-encoded with ``tokenizer``
    when given, else dropped from the calls that showed a secret); ``put`` returns what it stored.
    """

    def __init__(self, path: str | Path, tokenizer: Any | None = None) -> None:
        self.path = Path(path)
        self.tokenizer = tokenizer
        if self.path.exists() and not self.path.is_dir():
            raise ValueError(f"reference store path {str(self.path)!r} exists and is not a directory")
        self.path.mkdir(parents=True, exist_ok=True)

    def _file(self, task_id: str) -> Path:
        name = quote(task_id, safe="")
        if len(name) > MAX_NAME_CHARS:  # file systems cap names at 255 bytes: keep a prefix, add a hash
            name = name[: MAX_NAME_CHARS - 17] + "~" + hashlib.sha256(task_id.encode()).hexdigest()[:16]
        return self.path / (name + ".json")

    def __contains__(self, task_id: object) -> bool:
        return isinstance(task_id, str) and self._file(task_id).is_file()

    def get(self, task_id: str) -> Trace | None:
        file = self._file(task_id)
        if not file.is_file():
            return None
        try:
            data = json.loads(file.read_text())
            return Trace.from_dict(data["trace"])
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise ValueError(f"reference file {str(file)!r} is not a stored trace: {err}") from err

    def put(self, task_id: str, trace: Trace) -> Trace:
        """Store ``trace`` as the reference of ``task_id``; returns the stored trace (redacted)."""
        if trace.task_id != task_id:
            raise ValueError(f"trace is for task {trace.task_id!r}, not {task_id!r}")
        trace = redact_trace(trace, self.tokenizer)
        file = self._file(task_id)
        tmp = file.with_name(file.name + ".tmp")
        tmp.write_text(json.dumps({"task_id": task_id, "trace": trace.to_dict()}, ensure_ascii=False))
        os.replace(tmp, file)
        return trace

    def task_ids(self) -> list[str]:
        ids = []
        for file in sorted(self.path.glob("*.json")):
            ids.append(json.loads(file.read_text())["task_id"])
        return ids

    def __len__(self) -> int:
        return len(list(self.path.glob("*.json")))


def build_references(
    env: Env,
    tasks: Sequence[Task],
    store: ReferenceStore,
    *,
    harness: Harness | None = None,
    rollouts: RolloutService | None = None,
    attempts: int = 2,
) -> dict[str, Trace]:
    """References for ``tasks`` (train only), by task id: cached ones, else the gold trajectory,
    else (with ``harness`` and ``rollouts``, whose env is ``env``) a genuine policy reference. New
    ones are cached, and returned as cached (secret values redacted, ``ReferenceStore.put``)."""
    for task in tasks:
        _require_train(task)
    if (harness is None) != (rollouts is None):
        raise ValueError("harness and rollouts go together: give both to build policy references, or neither")
    found: dict[str, Trace] = {}
    todo: list[Task] = []
    for task in tasks:
        cached = store.get(task.task_id)
        if cached is not None:
            found[task.task_id] = cached
            continue
        gold = gold_reference(env, task)
        if gold is not None and is_genuine(gold, task)[0]:
            found[task.task_id] = store.put(task.task_id, gold)
        else:
            todo.append(task)
    if todo and harness is not None and rollouts is not None:
        for task_id, trace in _policy_references(todo, harness, rollouts, attempts).items():
            found[task_id] = store.put(task_id, trace)
    return found


def split_reference_pool(tasks: Sequence[Task], size: int, seed: int) -> tuple[list[Task], list[Task]]:
    """(reference pool, the rest): ``size`` train tasks split off the train split, chosen by a
    seeded sha256 order of their ids (the same on every machine); the rest keeps its order.

    The pool's tasks are never trained, validated or tested on, so their references can give
    worked demonstrations in a run whose epochs come back to every other train task."""
    if size < 0:
        raise ValueError(f"reference pool size must be >= 0, got {size}")
    for task in tasks:
        _require_train(task)
    if size and size >= len(tasks):
        raise ValueError(f"a reference pool of {size} tasks leaves none of the {len(tasks)} train tasks to train on")
    order = sorted(tasks, key=lambda t: hashlib.sha256(f"{seed}:pool:{t.task_id}".encode()).hexdigest())
    pool_ids = {t.task_id for t in order[:size]}
    return [t for t in tasks if t.task_id in pool_ids], [t for t in tasks if t.task_id not in pool_ids]


def reference_demo(reference: Trace) -> list[Message]:
    """A worked demonstration from a reference, as the turns of a ``few_shot`` edit's ``turns``.

    The turns are those an episode holds: the task (the original instruction, never the hinted
    one) as a user turn; per clean step, the assistant turn with the completion exactly as written
    (a ``<tool_call>`` block the parser reads) and one tool turn per call, rendered as the runtime
    renders it (``coevo.agent.episode.tool_message``); then the answering completion as the last
    assistant turn (none when the environment ended the episode on a tool call: a won game). The
    model is shown tool results where the runtime will put them, so it never learns to write one
    itself. Failed or empty steps are left out: a demonstration shows the clean path (a reference
    without any clean step gives the task alone, which ``few_shot`` refuses as a demonstration).
    A conversation with several user turns keeps its replies and the user's later messages.
    """
    meta = reference.metrics.get("reference") or {}
    instruction = meta.get("instruction")
    if instruction is None:
        instruction = next((str(m.get("content", "")) for m in reference.messages if m.get("role") == "user"), "")
    turns: list[Message] = [{"role": "user", "content": instruction}]
    if reference.replies:  # a whole conversation (a gold one: every step clean): the turns as the runtime held them
        return turns + [dict(m) for m in reference.messages[1:] if m.get("role") != "system"]
    steps = trace_steps(reference)
    for st in steps:
        kind = st.action()[0]
        if kind == "tools" and st.records and all(r.error is None for r in st.records):
            turns.append({"role": "assistant", "content": st.completion})
            turns.extend(tool_message(r.name, ToolResult(r.output, r.error)) for r in st.records)
        elif kind == "answer" and st is steps[-1]:
            turns.append({"role": "assistant", "content": st.completion})
    return turns


def fresh_demos(references: Mapping[str, Trace], exclude: Collection[str], spent: Collection[str],
                limit: int = 2) -> list[list[Message]]:
    """Worked demonstrations (``reference_demo``) from the references of tasks outside ``exclude``
    (the tasks the Critic judges this round and those the caller withholds) whose question no
    rejected edit showed (``spent``): which two tasks are shown changes what a small model copies
    (on SmolLM2 one pair made the forced calculator call lose 7 of 8 paired attempts where another
    pair won 15 of 16, docs/RESULTS.md), so a rejection spends the pair, not the kind of edit."""
    demos = (reference_demo(references[tid]) for tid in sorted(references) if tid not in exclude)
    return [d for d in demos if demo_problem(d) is None and demo_question(d) not in spent][:limit]
