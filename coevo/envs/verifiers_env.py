"""Any `verifiers` environment (Prime Intellect's classic API) as a coevo env, with no adapter code.

``train.py env=verifiers env.args.environment=my_module:load_environment`` or
``coevo eval --env verifiers --env-arg environment=wordle``: an import path names a function that
returns a ``vf.Environment`` (``SingleTurnEnv``, ``MultiTurnEnv``, ``ToolEnv``, ...); anything else
is an installed environment's id, loaded by ``vf.load_environment``. ``args`` go to that function.

How verifiers' concepts map onto coevo's (docs/environments.md has the table):

- rows of ``dataset`` / ``eval_dataset`` are tasks (``coevo.envs.chat_rows.split_rows``); the row's
  prompt messages are the instruction, its ``answer`` the hidden ground truth;
- the env's ``tool_defs`` are the session's tools; a coevo tool call is an assistant message with
  that call, answered by the env's own ``env_response`` (so ``ToolEnv``'s and ``StatefulToolEnv``'s
  argument handling and error formatting run as written);
- an answer is the assistant's text reply: the env's ``env_response`` gives the next user turn, and
  its stop conditions (``is_completed``) end the episode;
- the rubric scores the rollout: ``reward`` is its weighted sum, clipped to [0, 1] (the raw value
  is in ``info``), ``passed`` is reward >= the env's ``pass_threshold``.

The session keeps a verifiers ``State`` built by the env's own ``init_state`` and ``setup_state``,
with one trajectory step per model action, so rubric functions read ``prompt``, ``completion``,
``answer``, ``info`` and ``state`` as they do under verifiers' own rollout loop. Verifiers is async:
each session runs the env's coroutines on its own event loop.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from coevo.config.imports import import_object, is_import_path
from coevo.config.optional import require
from coevo.envs.base import Env, EnvSession, Score, Task, check_split
from coevo.envs.chat_rows import content_text, messages_text, split_rows
from coevo.harness.events import ToolResult, ToolSpec

if TYPE_CHECKING:
    from types import ModuleType
    
    from datasets import Dataset
    from verifiers import Environment

NOT_HERE = "coevo's runtime calls the model; a verifiers client is never asked to"


T = TypeVar("T")


def _load(environment: str, args: dict[str, Any]) -> Environment:
    vf = require("verifiers", "verifiers")
    if is_import_path(environment):
        env = import_object(environment, "verifiers environment")(**args)
    else:
        env = vf.load_environment(environment, **args)
    if not isinstance(env, vf.Environment):
        raise TypeError(f"verifiers environment {environment!r} gave a {type(env).__name__}, not a vf.Environment")
    return env


def _dataset_rows(dataset: Dataset | None) -> list[dict[str, Any]]:
    return [] if dataset is None else [dict(row) for row in dataset]


class VerifiersEnv(Env):
    """Tasks, tools, turns and rewards of one verifiers environment."""

    def __init__(self, environment: str, args: dict[str, Any] | None = None, name: str | None = None, seed: int = 0):
        self.vf_env = _load(environment, dict(args or {}))
        self.name = name or self.vf_env.env_id or environment.rpartition(":")[2].removeprefix("load_")
        self.vf_env.build_dataset()
        self.vf_env.build_eval_dataset()
        rows = split_rows(_dataset_rows(self.vf_env.dataset), _dataset_rows(self.vf_env.eval_dataset), self.name, seed)
        self._tasks = [Task(task_id, self.name, messages_text(row["prompt"]), split,
                            answer=row.get("answer", ""), capabilities=_capabilities(row),
                            metadata={"row": row}) for task_id, split, row in rows]

    def tasks(self, split: str) -> list[Task]:
        check_split(split)
        return [t for t in self._tasks if t.split == split]

    def reset(self, task: Task) -> VerifiersSession:
        return VerifiersSession(self.vf_env, task)

    @staticmethod
    def gold_answer(task: Task) -> str:
        """The row's ``answer``: what the gold policy replies (a check that the rubric accepts it)."""
        return str(task.answer)


def _capabilities(row: dict[str, Any]) -> tuple[str, ...]:
    """``skill:<env_id>`` for a row an ``EnvGroup`` routes to one of its environments (``info['env_id']``)."""
    info = row.get("info")
    skill = info.get("env_id") if isinstance(info, dict) else None
    return (f"skill:{skill}",) if isinstance(skill, str) and skill else ()


class VerifiersSession(EnvSession):
    """One rollout of a verifiers environment, driven by coevo's runtime one action at a time."""

    def __init__(self, vf_env: Environment, task: Task):
        vf = require("verifiers", "verifiers")
        self.vf, self.env, self.task, self.done = vf, vf_env, task, False
        self._loop = asyncio.new_event_loop()
        try:
            row = dict(task.metadata["row"])
            client = _client_class(vf)(None)  # init_state wants a client; coevo never lets it call
            self.state = self._run(vf_env.init_state(row, client, "coevo"))
            self.state = self._run(vf_env.setup_state(self.state)) or self.state
        except BaseException:
            self._loop.close()
            raise
        self.messages: list[Any] = list(self.state["prompt"])  # the conversation so far, as verifiers keeps it
        self.observation = task.instruction
        self.tools = {t.name: ToolSpec(t.name, t.description, dict(t.parameters)) for t in self.state["tool_defs"]}
        self._calls = 0

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return self._loop.run_until_complete(coroutine)

    def _step(self, completion: list[Any]) -> None:
        """Record one model action as a trajectory step, as verifiers' rollout loop does."""
        step = {"prompt": list(self.messages), "completion": completion, "response": None, "tokens": None,
                "reward": None, "advantage": None, "is_truncated": False,
                "trajectory_id": self.state["trajectory_id"], "extras": {}}
        self._run(self.env.add_trajectory_step(self.state, step))
        self.messages += completion

    def _finished(self) -> bool:
        self.done = self.done or bool(self._run(self.env.is_completed(self.state)))
        return self.done

    def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        self._calls += 1
        call = self.vf.ToolCall(id=f"call_{self._calls}", name=name, arguments=json.dumps(arguments))
        self._step([self.vf.AssistantMessage(content=None, tool_calls=[call])])
        try:
            replies = self._run(self.env.env_response(self.messages, self.state))
        except self.vf.Error as err:  # the env's stop errors end the rollout, as under verifiers
            self.state["error"] = err
            self.done = True
            return ToolResult("", error=f"{type(err).__name__}: {err.__cause__ or err}")
        self.messages += replies
        self._finished()
        return ToolResult("\n".join(content_text(m.content) for m in replies if m.role == "tool"))

    def respond(self, reply: str) -> str | None:
        """The assistant's reply: the env's next user turn, or None when its stop conditions hold."""
        self._step([self.vf.AssistantMessage(content=self._as_written(reply))])
        if self._finished():
            return None
        following = self._run(self.env.env_response(self.messages, self.state))
        final = self.state.get("final_env_response")
        if final is not None:
            self.done = True
            return None
        self.messages += following
        return messages_text(following)

    def _as_written(self, reply: str) -> str:
        """The reply as the rubric's parser reads it: re-tagged for an XMLParser whose answer field the
        harness's answer extraction stripped (``<answer>`` under the base harness)."""
        parser = self.env.parser
        if isinstance(parser, self.vf.XMLParser) and parser.answer_field and f"<{parser.answer_field}>" not in reply:
            return f"<{parser.answer_field}>\n{reply}\n</{parser.answer_field}>"
        return reply

    def verify(self, answer: str | None) -> Score:
        self._run(self.env.render_completion(self.state))
        self._run(self.env.rubric.score_rollout(self.state))
        raw = float(self.state["reward"] or 0.0)
        reward = min(1.0, max(0.0, raw))
        info = {"reward": raw, "metrics": dict(self.state.get("metrics") or {}),
                "stop": self.state.get("stop_condition")}
        return Score(reward, raw >= self.env.pass_threshold, info)

    def close(self) -> None:
        try:
            self._run(self.env.cleanup(self.state))
        finally:
            self._loop.close()


@functools.cache
def _client_class(vf: ModuleType) -> type:
    """A concrete verifiers ``Client`` for ``init_state`` whose every model method refuses: coevo's
    runtime calls the model, the session only records what it generated."""

    async def refuse(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(NOT_HERE)

    methods = ("setup_client", "to_native_tool", "to_native_prompt", "get_native_response",
               "raise_from_native_response", "from_native_response", "close")
    return type("CoevoDrivesTheModel", (vf.Client,), {m: refuse for m in methods})
