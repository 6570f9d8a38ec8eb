"""A verifiers 0.4 taskset (``verifiers.v1``) under a v1 harness program, with coevo's policy as the model.

``train.py env=verifiers env.args.taskset=examples.verifiers_v1.arith:ArithTaskset`` or
``coevo eval --env verifiers --env-arg taskset=ID``: an import path names a ``vf.Taskset`` class,
anything else is a taskset id verifiers itself resolves (``vf.load_taskset``: a module of that
name on the path). ``taskset_args`` go to the taskset's config. Each episode is one verifiers
rollout (``vf.Agent.run``) of the task under ``harness`` (``null``: the tool-less chat loop;
``bash``: the chat loop with a bash tool) in the ``subprocess`` runtime: verifiers launches the
harness program, whose every model request passes its interception server to coevo's
``VerifiersClient``, which hands it to the episode (``coevo.programs``). The program's system
prompt, loop and tools are verifiers'; what the model sees is shaped by coevo's harness, and the
ids it evaluated and sampled are recorded by coevo's episode and given back to verifiers as the
turn's ``TurnTokens``.

How v1's concepts map onto coevo's (docs/environments.md, "Agents as programs"):

- a ``Task`` is a coevo task: its ``id`` (or taskset index), its prompt as the instruction, an
  ``answer`` field of its data as the hidden ground truth; splits are assigned by hash of the id;
- the task's ``@reward`` functions, weighted and summed by verifiers, are the reward (clipped to
  [0, 1], the raw sum in ``info``); ``passed`` is reward >= ``pass_threshold``; its ``@metric`` values
  and the rollout's stop condition are in ``info``;
- a rollout verifiers records as failed (the program exited with an error, a provider error) fails
  the episode as a program error; a timeout is a stop, scored as verifiers scores it.

The classic API (``vf.Environment``, ``MultiTurnEnv``, ``ToolEnv``; ``env.args.environment=``)
left verifiers in 0.4; asking for it is a one-line error naming the version.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib.metadata
import logging
import os
import socket
import sys
import threading
import typing
from collections.abc import Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any

from coevo.config.imports import import_object, is_import_path
from coevo.config.optional import require
from coevo.envs.base import Score, Task, assign_split, check_split
from coevo.envs.program_env import PROGRAM_TIMEOUT_S, ProgramEnv, ProgramError, ProgramRun, run_in_thread
from coevo.errors import UsageError
from coevo.programs.channel import ModelChannel

if TYPE_CHECKING:
    import verifiers.v1 as vf_types
    from verifiers.v1.clients.client import Client as VfClient
    from verifiers.v1.configs.client import BaseClientConfig
    from verifiers.v1.dialects.base import Dialect
    from verifiers.v1.graph import PendingTurn
    from verifiers.v1.types import SamplingConfig

    from coevo.programs.channel import TokenRecord

CLASSIC_API = ("verifiers 0.4 removed the classic environment API (vf.Environment, MultiTurnEnv, ToolEnv) that "
               "env.args.environment loaded; coevo runs v1 tasksets: env.args.taskset=ID or package.module:Taskset "
               "(docs/environments.md, 'Agents as programs')")
HARNESSES = ("null", "bash")
"""The v1 harnesses run here offline (any other id verifiers can import works too)."""
QUIET_LOGGERS = ("verifiers", "aiohttp.access")
UNUSED_URL = "http://127.0.0.1:9/v1"
"""The model address verifiers' config asks for; coevo's client answers instead, so nothing is sent there."""


def _vf() -> ModuleType:
    """``verifiers.v1``, or a one-line error naming the installed version that lacks it."""
    require("verifiers", "verifiers")
    try:
        import verifiers.v1 as vf
    except ModuleNotFoundError:
        raise UsageError(f"env 'verifiers' runs verifiers 0.4 tasksets (verifiers.v1); verifiers "
                         f"{importlib.metadata.version('verifiers')} is installed: pip install 'coevo[envs]'") from None
    return vf


def _taskset(vf: ModuleType, taskset: str, args: Mapping[str, Any]) -> vf_types.Taskset:
    if is_import_path(taskset):
        cls = import_object(taskset, "verifiers taskset")
        if not (isinstance(cls, type) and issubclass(cls, vf.Taskset)):
            raise UsageError(f"verifiers taskset {taskset!r} is a {type(cls).__name__}, not a vf.Taskset subclass")
        return cls(_config_type(cls, vf)(id=taskset.rpartition(":")[2], **args))
    config = vf.taskset_config_type(taskset)(id=taskset, **args)
    return vf.load_taskset(config)


def _loaded(vf: ModuleType, taskset: str, args: Mapping[str, Any]) -> list[Any]:
    """The taskset's tasks; a resource it cannot fetch offline is a one-line error naming it."""
    try:
        return list(_taskset(vf, taskset, args))
    except UsageError:
        raise
    except Exception as err:
        failure = unreachable(err)
        if failure is None:
            raise
        raise UsageError(f"verifiers taskset {taskset!r} needs something it cannot fetch here "
                         f"({type(failure).__name__}: {failure}); fetch it once where the network reaches (a "
                         "Hugging Face dataset: into its cache, then run with HF_HUB_OFFLINE=1) or give the "
                         "taskset local data") from None


NETWORK_ERRORS = ("LocalEntryNotFoundError", "OfflineModeIsEnabled", "ConnectError", "ConnectTimeout",
                  "DatasetNotFoundError")
"""Names of the network failures of the hub and HTTP clients (matched by name: none of those
libraries is a dependency of this module)."""


def unreachable(err: BaseException) -> BaseException | None:
    """The network failure in ``err``'s chain of causes, if there is one."""
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, (ConnectionError, TimeoutError, socket.gaierror)) or type(seen).__name__ in NETWORK_ERRORS:
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _config_type(cls: type, vf: ModuleType) -> type:
    """The config class a taskset class declares (``Taskset[TaskT, ConfigT]``), else ``vf.TasksetConfig``."""
    bases = [base for klass in cls.__mro__ for base in vars(klass).get("__orig_bases__", ())]
    for base in bases:
        for arg in typing.get_args(base):
            if isinstance(arg, type) and issubclass(arg, vf.TasksetConfig):
                return arg
    return vf.TasksetConfig


def _instruction(prompt: str | list[Any] | None) -> str:
    """A task's prompt as text: a string, or its typed messages' contents, one a line."""
    if prompt is None:
        return ""
    if isinstance(prompt, str):
        return prompt
    parts = []
    for m in prompt:  # typed messages (verifiers.v1's: each has its content) or their dicts
        content = m.get("content", "") if isinstance(m, dict) else m.content
        parts.append(content if isinstance(content, str) else str(content))
    return "\n".join(parts)


class VerifiersClient:
    """Builds the v1 ``Client`` that hands each chat request of a rollout to its episode's channel."""

    @staticmethod
    def for_channel(vf: Any, channel: ModelChannel) -> VfClient:  # Any: its Client is a base class here
        from verifiers.v1.dialects import ChatDialect

        class Client(vf.Client):
            async def get_response(self, dialect: Dialect, body: dict, sampling: SamplingConfig,
                                   session_id: str | None = None, turn: PendingTurn | None = None,
                                   headers: Mapping[str, str] | None = None) -> vf_types.Response:
                if not isinstance(dialect, ChatDialect):
                    raise vf.ProviderError(f"coevo answers chat completions only, not {type(dialect).__name__}",
                                           status_code=400)
                loop, pending = asyncio.get_running_loop(), channel.submit(body)
                answered = loop.create_future()
                pending.when_done(lambda: _set_soon(loop, answered))
                await answered  # the episode answers on the runtime's threads; no thread waits here
                if pending.response is None:
                    raise vf.ProviderError(pending.refusal or "refused", status_code=pending.status)
                return _response(vf, pending.response, pending.tokens)

            async def close(self) -> None:
                """Nothing held: the channel belongs to the episode."""

        return Client()


def _cancel(future: concurrent.futures.Future[Any]) -> None:
    future.cancel()


def _set_soon(loop: asyncio.AbstractEventLoop, future: asyncio.Future[None]) -> None:
    """Resolve ``future`` on its own loop, from any thread."""
    loop.call_soon_threadsafe(future.set_result, None)


def _response(vf: ModuleType, raw: dict[str, Any], tokens: TokenRecord | None) -> vf_types.Response:
    """A v1 ``Response`` from coevo's chat-completions answer, with the turn's exact tokens."""
    choice = raw["choices"][0]
    message = choice["message"]
    calls = [vf.ToolCall(id=c["id"], name=c["function"]["name"], arguments=c["function"]["arguments"])
             for c in message.get("tool_calls") or []]
    usage = raw["usage"]
    response = vf.Response(
        id=raw["id"], created=raw["created"], model=raw["model"],
        message=vf.AssistantMessage(content=message.get("content"), tool_calls=calls or None),
        finish_reason=choice["finish_reason"],
        usage=vf.Usage(prompt_tokens=usage["prompt_tokens"], completion_tokens=usage["completion_tokens"]),
        tokens=None if tokens is None else vf.TurnTokens(prompt_ids=list(tokens.prompt_ids),
                                                         completion_ids=list(tokens.completion_ids),
                                                         completion_logprobs=list(tokens.logprobs or [])))
    response.raw = raw  # what the program receives
    return response


class VerifiersEnv(ProgramEnv):
    """The tasks of one v1 taskset, each episode a rollout of ``harness`` in the subprocess runtime."""

    def __init__(self, taskset: str = "", taskset_args: dict[str, Any] | None = None, harness: str = "null",
                 harness_args: dict[str, Any] | None = None, max_turns: int = 16, pass_threshold: float = 1.0,
                 name: str | None = None, seed: int = 0, program_timeout_s: float = PROGRAM_TIMEOUT_S,
                 environment: str | None = None, args: dict[str, Any] | None = None) -> None:
        if environment is not None or args is not None:
            raise UsageError(CLASSIC_API)
        if not taskset:
            raise UsageError("env 'verifiers' needs a taskset: env.args.taskset=ID or package.module:TasksetClass")
        self.vf = _vf()
        self.taskset_ref, self.harness = taskset, harness
        self.harness_args = {"compaction": None, **(harness_args or {})} if harness == "bash" else dict(
            harness_args or {})
        self.max_turns, self.pass_threshold = int(max_turns), float(pass_threshold)
        if harness == "bash":  # what verifiers' bash program offers (known before it runs)
            self.program_tools = ("bash", "edit") if self.harness_args.get("edit", True) else ("bash",)
        self.program_timeout_s = float(program_timeout_s)
        self.name = name or (taskset.partition(":")[0].rpartition(".")[2] if is_import_path(taskset) else taskset)
        self._vf_tasks: dict[str, Any] = {}
        self._tasks: list[Task] = []
        for vf_task in _loaded(self.vf, taskset, dict(taskset_args or {})):
            data = vf_task.data
            task_id = str(data.id if data.id is not None else f"{self.name}-{data.idx}")
            if task_id in self._vf_tasks:
                raise UsageError(f"taskset {taskset!r} has two tasks with id {task_id!r}")
            self._vf_tasks[task_id] = vf_task
            fields = data.model_dump()
            self._tasks.append(Task(task_id, self.name, _instruction(data.prompt), assign_split(task_id, seed),
                                    answer=fields.get("answer", ""), metadata={"system_prompt": data.system_prompt}))
        if not self._tasks:
            raise UsageError(f"verifiers taskset {taskset!r} has no tasks")
        _put_uv_on_path()
        for logger in QUIET_LOGGERS:  # a line per request and per rollout would drown the run's progress
            logging.getLogger(logger).setLevel(logging.WARNING)

    def tasks(self, split: str) -> list[Task]:
        check_split(split)
        return [t for t in self._tasks if t.split == split]

    def gold_answer(self, task: Task) -> str | None:
        return str(task.answer) if task.answer not in (None, "") else None

    def launch(self, task: Task, channel: ModelChannel) -> ProgramRun:
        vf, vf_task = self.vf, self._vf_tasks[task.task_id]
        config = vf.AgentConfig(model="coevo", harness={"id": self.harness, **self.harness_args},
                                runtime=vf.SubprocessConfig(), max_turns=self.max_turns,
                                client=vf.TrainClientConfig(base_url=UNUSED_URL, api_key_var="COEVO_UNUSED_KEY"))
        client = VerifiersClient.for_channel(vf, channel)

        async def rollout() -> vf_types.Trace:
            from verifiers.v1.interception import InterceptionServer

            class Interception(InterceptionServer):  # the rollout's model requests go to coevo's client
                def _client(self, config: BaseClientConfig) -> VfClient:
                    return client

            async with Interception() as server:
                return await vf.Agent(config, interception=server).run(vf_task)

        future = asyncio.run_coroutine_threadsafe(rollout(), _shared_loop())
        return run_in_thread(lambda: self._score(future.result()), channel, channel.session_id,
                             stop=lambda: _cancel(future))

    def _score(self, trace: vf_types.Trace) -> Score:
        if not trace.ok:
            error = trace.last_error
            why = f"{error.type}: {error.message}" if error is not None else "no error recorded"
            raise ProgramError(f"verifiers rollout failed ({trace.stop_condition}): {why}")
        raw = float(trace.reward)
        rewards = {k: (None if r is None else r.value) for k, r in trace.rewards.items()}
        info = {"raw_reward": raw, "rewards": rewards, "metrics": dict(trace.metrics),
                "stop_condition": trace.stop_condition, "turns": trace.num_turns}
        return Score(min(1.0, max(0.0, raw)), raw >= self.pass_threshold, info)


_loop: asyncio.AbstractEventLoop | None = None
_loop_lock = threading.Lock()


def _shared_loop() -> asyncio.AbstractEventLoop:
    """The one event loop every verifiers rollout of this process runs on (a daemon thread's):
    verifiers keeps asyncio locks across rollouts (its harness programs are prepared once), and a
    lock belongs to the loop it was first used on."""
    global _loop
    with _loop_lock:
        if _loop is None:
            _loop = asyncio.new_event_loop()
            threading.Thread(target=_loop.run_forever, name="coevo-verifiers-loop", daemon=True).start()
        return _loop


def _put_uv_on_path() -> None:
    """verifiers prepares its harness programs with ``uv`` (found on PATH, else installed with pip);
    the one in coevo's environment is found first, so a run installs nothing outside it."""
    bin_dir = os.path.dirname(sys.executable)
    if os.path.exists(os.path.join(bin_dir, "uv")) and bin_dir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
