"""A scripted policy that replays each task's own gold actions: what an env author runs first, to
check that the env, its verifier and the runtime agree before any model is involved.

``GoldPolicy`` reads the task of each request (``ChatRequest.task_id``), counts the tool results
the episode has seen, and writes the next gold call in the format the default harness parses, then
the final answer. Given an ownership map (tool → entity) it plays a lead agent instead: it hands
each run of consecutive gold calls owned by one entity to that entity's specialist
(``ask_<entity>``, the agents axis), and as that specialist it carries out the calls its request
lists. No registry of sessions, no parsing of observations: tasks are looked up by id.

A conversation with several user turns (``EnvSession.respond``) gives its gold calls per turn in
``task.metadata["turn_calls"]`` (how many gold calls belong to each user turn, in order): the
policy makes a turn's calls, then answers that turn with ``reply(task, turn)`` (default
``task.metadata["gold_replies"][turn]``, else ``done``), and the last turn's answer is the final one.
Replies are written as ``<answer>...</answer>``, or as plain text when the task says its turns end
with plain text (``task.metadata["plain_replies"]``, a function-calling conversation).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping

from coevo.agent.policy import ChatRequest, ScriptedPolicy
from coevo.envs.base import Task
from coevo.harness.events import Message, ToolCall
from coevo.harness.library.delegation import DELEGATE_PREFIX
from coevo.harness.library.tools import tool_call_text

CALLS_HEADER = "Carry out these tool calls in order, then report:"


def segments(calls: Iterable[ToolCall], owner: Mapping[str, str]) -> list[tuple[str, list[ToolCall]]]:
    """Runs of consecutive calls owned by one entity, in order: (entity, its calls)."""
    out: list[tuple[str, list[ToolCall]]] = []
    for call in calls:
        entity = owner[call.name]
        if out and out[-1][0] == entity:
            out[-1][1].append(call)
        else:
            out.append((entity, [call]))
    return out


def _last_user(messages: list[Message]) -> int:
    """Index of the last user message (the current user turn)."""
    return max(i for i, m in enumerate(messages) if m.get("role") == "user")


def _results(messages: list[Message]) -> list[str]:
    return [m.get("content") or "" for m in messages if m.get("role") == "tool"]


class GoldPolicy(ScriptedPolicy):
    """Replays ``tasks``' gold actions (see the module docstring). ``answer(task)``: the final
    answer once the calls are made (default: ``done``; an env whose verifier checks an answer
    offers ``gold_answer``); ``owner``: play a lead that delegates by entity.

    Its replies are never cut at the completion budget: a gold replay checks the env and the
    harness's plumbing, and a reference call cut at 192 bytes would fail as the env's own error."""

    cut_at_budget = False

    def __init__(self, tasks: Iterable[Task], *, answer: Callable[[Task], str | None] | None = None,
                 owner: Mapping[str, str] | None = None, model_version: str = "gold") -> None:
        super().__init__(self._unused, model_version=model_version)
        self.tasks = {t.task_id: t for t in tasks}
        self.answer, self.owner = answer, dict(owner) if owner is not None else None
        self.made: dict[str, int] = {}  # episode (trace id) -> gold calls it was given so far

    def _made(self, request: ChatRequest) -> int:
        """Calls this episode has been given: counted per episode (demonstrations, retry prompts and
        memory processors do not move it); read from the tool results for a request without one."""
        return self.made.get(request.episode, 0) if request.episode else len(_results(request.messages))

    def _give(self, request: ChatRequest, text: str) -> str:
        if request.episode:
            self.made[request.episode] = self.made.get(request.episode, 0) + 1
        return text

    @staticmethod
    def _unused(messages: list[Message]) -> str:
        raise AssertionError("GoldPolicy answers from the request")

    def reply(self, request: ChatRequest) -> str:
        task = self.tasks.get(request.task_id)
        if task is None:
            return f"<answer>unknown task {request.task_id!r}</answer>"
        made = self._made(request)
        if request.agent:  # a specialist: the calls its request lists
            listed = next(m["content"] for m in request.messages if m.get("role") == "user")
            calls = [ToolCall(c["name"], c["arguments"]) for c in json.loads(listed.split("\n", 1)[1])]
            if made < len(calls):
                return self._give(request, tool_call_text(calls[made]))
            # a plain report: a tool result quoted back may hold JSON the lenient parser would take for a call
            return f"<answer>done: {made} call(s) made</answer>"
        turn_calls = task.metadata.get("turn_calls")
        if turn_calls:  # several user turns: this turn's calls, then this turn's reply
            turn = request.turn
            if not request.episode:  # no episode id: this turn's calls, read from the messages
                made = sum(turn_calls[:turn]) + len(_results(request.messages[_last_user(request.messages):]))
            if made < sum(turn_calls[: turn + 1]):
                return self._give(request, tool_call_text(task.gold_actions[made]))
            replies = task.metadata.get("gold_replies") or []
            final = self._final(task) if turn == len(turn_calls) - 1 else (
                replies[turn] if turn < len(replies) else "done")
            return final if task.metadata.get("plain_replies") else f"<answer>{final}</answer>"
        plan = ([(None, [c]) for c in task.gold_actions] if self.owner is None
                else segments(task.gold_actions, self.owner))
        if made < len(plan):
            entity, calls = plan[made]
            if entity is None:
                return self._give(request, tool_call_text(calls[0]))
            listing = json.dumps([{"name": c.name, "arguments": c.arguments} for c in calls], ensure_ascii=False)
            return self._give(request, tool_call_text(
                ToolCall(DELEGATE_PREFIX + entity, {"request": f"{CALLS_HEADER}\n{listing}"})))
        return f"<answer>{self._final(task)}</answer>"

    def _final(self, task: Task) -> str:
        """The final answer once the calls are made: ``answer(task)``, or ``done`` where it gives none."""
        final = self.answer(task) if self.answer is not None else None
        return "done" if final is None else final
