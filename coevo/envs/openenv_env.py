"""Any OpenEnv environment as a coevo env: served from a URL, or from an app served here.

``train.py env=openenv env.args.app=examples.openenv.guess:app`` serves an OpenEnv FastAPI app
(``create_app``'s) on the loopback interface in this process (no docker, no Hugging Face Space);
``env.args.base_url=http://host:port`` plays a server already running. Each task is one set of
``resets`` (keyword arguments of the environment's ``reset``); an episode is one OpenEnv session
(its WebSocket), played as verifiers' OpenEnv taskset plays it:

- the user turn is the observation and the action's JSON schema, as JSON;
- the agent's reply is the action: a JSON object (fenced or not), or, when the schema has exactly
  one required field, the bare value of that field; it is stepped, and the next observation is the
  next user turn until the environment says ``done``;
- a reply that is not a valid action is told so as the next user turn (a step with reward 0), where
  verifiers fails the episode: a small model learns the format from the message;
- the reward is the sum of the steps' rewards, clipped to [0, 1] (the steps' rewards in ``info``);
  ``passed`` is reward >= ``pass_threshold``.

Run it under a harness whose replies are the whole text (``--harness function_calling``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import socket
import threading
import time
import urllib.request
from typing import Any

from coevo.config.imports import import_object
from coevo.config.optional import require
from coevo.envs.base import Env, EnvSession, Score, Task, assign_split, check_split
from coevo.errors import UsageError
from coevo.harness.events import ToolResult

SERVE_TIMEOUT_S = 30.0
"""Seconds an app served here may take to accept connections."""


def parse_action(reply: str, schema: dict[str, Any]) -> dict[str, Any]:
    """The action a reply states: a JSON object (a surrounding code fence dropped), or the value of
    the schema's one required field. A ValueError says why it is neither."""
    text = reply.strip()
    if text.startswith("```"):
        text = "\n".join(text.splitlines()[1:-1]).strip()
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        value = text
    if isinstance(value, dict):
        return value
    required = schema.get("required") or []
    if len(required) != 1:
        fields = sorted(schema.get("properties", {}))
        raise ValueError(f"reply with a JSON object matching the action schema (fields {fields})")
    return {required[0]: value}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _ClientGone(logging.Filter):
    """openenv 0.4.1's server logs every closed session as an ASGI error (a WebSocketDisconnect
    traceback); a session coevo closed is no error."""

    def filter(self, record: logging.LogRecord) -> bool:
        err = record.exc_info[1] if record.exc_info else None
        while err is not None:
            if type(err).__name__ in ("WebSocketDisconnect", "ConnectionClosedOK"):
                return False
            err = err.__cause__ or err.__context__
        return True


def serve_app(app_path: str) -> str:
    """Serve the FastAPI app at ``app_path`` on the loopback interface in a daemon thread; its URL."""
    uvicorn = require("uvicorn", "env 'openenv' with app=")
    app = import_object(app_path, "OpenEnv app")
    if not any(isinstance(f, _ClientGone) for f in logging.getLogger("uvicorn.error").filters):
        logging.getLogger("uvicorn.error").addFilter(_ClientGone())
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, name="coevo-openenv", daemon=True).start()
    deadline = time.monotonic() + SERVE_TIMEOUT_S
    while not server.started:
        if time.monotonic() > deadline or not threading.main_thread().is_alive():
            raise UsageError(f"OpenEnv app {app_path!r} did not start serving within {SERVE_TIMEOUT_S:g} s")
        time.sleep(0.02)
    return f"http://127.0.0.1:{port}"


class OpenEnvEnv(Env):
    """Tasks (one per reset) and sessions of one OpenEnv environment."""

    def __init__(self, base_url: str | None = None, app: str | None = None, resets: list[dict[str, Any]] | None = None,
                 name: str | None = None, seed: int = 0, pass_threshold: float = 1.0) -> None:
        if (base_url is None) == (app is None):
            raise UsageError("env 'openenv' needs one of base_url (a running OpenEnv server) or app "
                             "(package.module:app, an OpenEnv create_app app served here)")
        require("openenv", "env 'openenv'")
        self.base_url = (base_url or serve_app(str(app))).rstrip("/")
        try:
            with urllib.request.urlopen(f"{self.base_url}/schema", timeout=10) as response:
                self.action_schema = json.load(response)["action"]
        except OSError as err:
            raise UsageError(f"OpenEnv server {self.base_url} did not answer /schema: {err}") from None
        self.name = name or (str(app).partition(":")[0].rpartition(".")[2] if app else "openenv")
        self.pass_threshold = float(pass_threshold)
        self._tasks = []
        for reset in resets or [{}]:
            key = json.dumps(reset, sort_keys=True)
            task_id = f"{self.name}-{hashlib.sha256(key.encode()).hexdigest()[:10]}"
            self._tasks.append(Task(task_id, self.name, f"OpenEnv {self.name}, reset {key}",
                                    assign_split(task_id, seed), answer=None, metadata={"reset": dict(reset)}))

    def tasks(self, split: str) -> list[Task]:
        check_split(split)
        return [t for t in self._tasks if t.split == split]

    def reset(self, task: Task) -> OpenEnvSession:
        return OpenEnvSession(self.base_url, self.action_schema, dict(task.metadata["reset"]), self.pass_threshold)


class OpenEnvSession(EnvSession):
    """One OpenEnv session (a WebSocket): every reply is a step until the environment is done."""

    def __init__(self, base_url: str, schema: dict[str, Any], reset: dict[str, Any], pass_threshold: float) -> None:
        from openenv import GenericEnvClient

        self.schema, self.pass_threshold = schema, pass_threshold
        self.client = GenericEnvClient(base_url=base_url).sync()
        self.client.connect()
        try:
            result = self.client.reset(**reset)
        except BaseException:
            self.client.close()
            raise
        self.rewards: list[float] = []
        self.tools = {}
        self.observation = self._turn(result.observation)

    def _turn(self, observation: object) -> str:
        return json.dumps({"observation": observation, "action_schema": self.schema}, ensure_ascii=False)

    def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        return ToolResult("", error="an OpenEnv environment takes actions as replies, not tool calls")

    def respond(self, reply: str) -> str | None:
        try:
            action = parse_action(reply, self.schema)
            result = self.client.step(action)
        except (ValueError, RuntimeError) as err:  # not an action, or the server refused it (validation)
            self.rewards.append(0.0)
            return f"That is not a valid action ({err}). {self._turn('reply with the action only')}"
        self.rewards.append(float(result.reward or 0.0))
        if result.done:
            self.done = True
            return None
        return self._turn(result.observation)

    def verify(self, answer: str | None) -> Score:
        total = sum(self.rewards)
        return Score(min(1.0, max(0.0, total)), total >= self.pass_threshold, {"step_rewards": list(self.rewards)})

    def close(self) -> None:
        self.client.close()
