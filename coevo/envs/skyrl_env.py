"""Any `skyrl-gym` text environment as a coevo env, with no adapter code.

``train.py env=skyrl_gym env.args.env_class=gsm8k env.args.rows=my_module:rows`` or
``coevo eval --env skyrl_gym --env-arg env_class=gsm8k --env-arg rows=data.jsonl``: ``env_class`` is
an id registered with ``skyrl_gym.register`` (the built-ins, or one the user's module registers on
import: name that module in ``register``); ``rows`` is a JSON-lines or Parquet file, or an import
path to a function that returns the rows, in SkyRL's dataset format (``prompt`` messages,
``env_class``, ``reward_spec``, ``extra_info``). A row's own ``env_class`` wins over the argument.

How SkyRL's concepts map onto coevo's (docs/environments.md has the table):

- a row is a task; its prompt messages are the instruction (``coevo.envs.chat_rows``), its
  ``reward_spec`` the hidden ground truth; rows are hashed into train, val and test;
- a session is ``skyrl_gym.make(env_class, env_config=..., extras=row)`` and ``init(prompt)``;
- SkyRL environments read actions from the model's text themselves (a ``<search>`` tag, a final
  ``####`` line), so they take no tool calls: every reply goes to ``step`` as written (run them
  under a harness whose replies are the whole text, ``--harness function_calling``), the step's
  observations are the next user turn, and ``done`` ends the episode;
- the episode's reward is the last step's reward (SkyRL's outcome reward; every step's reward is
  kept in ``info``), ``passed`` is reward >= ``pass_threshold``.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coevo.config.imports import import_object, is_import_path
from coevo.config.optional import require
from coevo.envs.base import Env, EnvSession, Score, Task, check_split
from coevo.envs.chat_rows import messages_text, split_rows
from coevo.harness.events import ToolResult

if TYPE_CHECKING:
    from skyrl_gym.envs.base_text_env import BaseTextEnv


def read_rows(rows: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows from a list, an import path to a function returning them, a ``.jsonl`` or a ``.parquet`` file."""
    if isinstance(rows, list):
        return [dict(r) for r in rows]
    if is_import_path(rows):
        return [dict(r) for r in import_object(rows, "skyrl_gym rows")()]
    path = Path(rows)
    if not path.is_file():
        raise FileNotFoundError(f"skyrl_gym rows {rows!r}: no such file, and not an import path 'module:function'")
    if path.suffix == ".parquet":
        import pandas

        return pandas.read_parquet(path).to_dict("records")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class SkyRLEnv(Env):
    """Tasks and turns of one skyrl-gym environment class over a set of rows."""

    def __init__(self, rows: str | list[dict[str, Any]], env_class: str | None = None,
                 env_config: dict[str, Any] | None = None, register: str | None = None,
                 pass_threshold: float = 1.0, name: str | None = None, seed: int = 0):
        self.gym = require("skyrl_gym", "env=skyrl_gym")
        if register:  # a user's module that calls skyrl_gym.register on import
            importlib.import_module(register)
        loaded = read_rows(rows)
        if not loaded:
            raise ValueError(f"skyrl_gym rows {rows!r} hold no row")
        classes = {r.get("env_class") or env_class for r in loaded}
        unknown = sorted(str(c) for c in classes if c not in self.gym.registry)
        if unknown:
            raise ValueError(f"skyrl_gym env class {unknown} is not registered "
                             f"(registered: {sorted(self.gym.registry)}); "
                             "set env_class, or name the module that registers it in register")
        self.env_class, self.env_config, self.pass_threshold = env_class, dict(env_config or {}), pass_threshold
        self.name = name or (env_class or str(loaded[0].get("env_class")))
        self._tasks = [Task(task_id, self.name, messages_text(row["prompt"]), split, answer=reward_spec(row),
                            capabilities=_capabilities(row), metadata={"row": row})
                       for task_id, split, row in split_rows(loaded, None, self.name, seed)]

    def tasks(self, split: str) -> list[Task]:
        check_split(split)
        return [t for t in self._tasks if t.split == split]

    def reset(self, task: Task) -> SkyRLSession:
        row = task.metadata["row"]
        spec = reward_spec(row)  # under both names: SkyRL's environments read one or the other (aime: reward_model)
        extras = {**row, "reward_spec": spec, "reward_model": spec} if spec is not None else row
        env = self.gym.make(row.get("env_class") or self.env_class, env_config=self.env_config, extras=extras)
        return SkyRLSession(env, task, self.pass_threshold)

    @staticmethod
    def gold_answer(task: Task) -> str:
        """``#### <ground truth>``: the final-answer line SkyRL's math environments read."""
        spec = task.answer if isinstance(task.answer, dict) else {}
        return f"#### {spec.get('ground_truth', '')}"


def reward_spec(row: dict[str, Any]) -> dict[str, Any] | None:
    """A row's ground truth: SkyRL's ``reward_spec``, or ``reward_model`` as verl-style rows (and
    skyrl-gym's own ``aime``) name it."""
    spec = row.get("reward_spec", row.get("reward_model"))
    return dict(spec) if isinstance(spec, dict) else None


def _capabilities(row: dict[str, Any]) -> tuple[str, ...]:
    source = row.get("data_source")
    return (f"skill:{source}",) if isinstance(source, str) and source else ()


class SkyRLSession(EnvSession):
    """One episode: the model's replies are the environment's actions."""

    tools: dict = {}  # SkyRL environments parse their actions from the reply text

    def __init__(self, env: BaseTextEnv, task: Task, pass_threshold: float):
        self.env, self.task, self.pass_threshold, self.done = env, task, pass_threshold, False
        prompt, _ = env.init(list(task.metadata["row"]["prompt"]))
        self.observation = messages_text(prompt)
        self.rewards: list[float] = []

    def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        return ToolResult("", error=f"{self.task.env} takes no tool calls: write the action in the reply")

    def respond(self, reply: str) -> str | None:
        out = self.env.step(reply)
        self.rewards.append(float(out["reward"] or 0.0))
        if out["done"]:
            self.done = True
            return None
        return messages_text(out["observations"])

    def verify(self, answer: str | None) -> Score:
        raw = self.rewards[-1] if self.rewards else 0.0
        info = {"step_rewards": list(self.rewards), "metrics": self.env.get_metrics()}
        return Score(min(1.0, max(0.0, raw)), raw >= self.pass_threshold, info)

    def close(self) -> None:
        self.env.close()
