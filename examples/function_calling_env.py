"""A function-calling conversation shaped like BFCL's multi-turn category (docs/environments.md).

A user works with a small file-system API over four or five turns. Some turns need calls, some are
only talk ("Thanks, nothing else in there yet."); the agent answers each turn in plain text, and
a reply without a tool call ends its turn, as function-calling APIs have it. The gold replies are
all the same short "Done.", which a loop detector that ignored the user's turns would take for a
loop. Run it under the ``function_calling`` harness (plain text is the turn's reply):

    PYTHONPATH=. coevo eval --env examples.function_calling_env:FunctionCallingEnv --model gold \\
        --harness function_calling --split val --max-steps 12

Tools carry a result schema (``ToolSpec.returns``, BFCL's ``response``). ``verify`` compares the
final file system with the gold calls' and checks that every turn got a reply.
"""

from __future__ import annotations

import copy
import hashlib
import json
import random
from typing import Any

from coevo.envs.base import Env, EnvSession, Score, Task, assign_split, check_split
from coevo.harness.events import ToolCall, ToolResult, ToolSpec

RESULT = {"type": "object", "properties": {"result": {"type": "string"}}}


def _spec(name: str, description: str, **args: str) -> ToolSpec:
    props = {k: {"type": "string", "description": v} for k, v in args.items()}
    return ToolSpec(name, description, {"type": "object", "properties": props, "required": list(args)},
                    returns=RESULT)


TOOLS = {t.name: t for t in (
    _spec("ls", "List the folders and files."),
    _spec("mkdir", "Create a folder.", dir_name="the new folder's name"),
    _spec("echo", "Write text to a file in a folder (creates the file).", dir_name="an existing folder",
          file_name="e.g. notes.txt", content="the text"),
    _spec("mv", "Move a file from one folder to another.", file_name="the file", source="its folder",
          destination="an existing folder"),
)}


API_CLASSES = {
    "Message": "This tool belongs to the Message API, which is used to manage user-to-user messaging in a "
               "workspace, with contacts, inboxes and message history.",
    "Ticket": "This tool belongs to the Ticket API, which provides functionality for creating, reading, "
              "updating and resolving support tickets in a help-desk system.",
    "Trading": "This tool belongs to the Trading Bot API, which provides functionality for managing "
               "stock watchlists, orders, account balances and market data.",
    "Travel": "This tool belongs to the Travel Booking API, which provides functionality for booking "
              "flights, managing credit cards, insurance and travel budgets.",
}
ACTIONS = ["get", "list", "add", "remove", "update", "search", "send", "cancel", "view", "set"]
OBJECTS = ["contact", "message", "ticket", "order", "watchlist", "booking", "card", "budget", "invoice",
           "reminder", "account", "alert"]


def bfcl_like_tools(n: int) -> dict[str, ToolSpec]:
    """``n`` tools shaped like BFCL's multi-turn APIs, none of them this env's: every description of a
    class opens with the same sentence (BFCL's boilerplate), then says what the tool does; 3-4
    described arguments each. They make the listing as long as BFCL's (20 tools: a first prompt of
    ~4.7k SmolLM2 tokens)."""
    rng = random.Random(f"bfcl_like_tools:{n}")
    out: dict[str, ToolSpec] = {}
    classes = sorted(API_CLASSES)
    for i in range(n):
        api = classes[i % len(classes)]
        action, obj = ACTIONS[(i // len(classes)) % len(ACTIONS)], OBJECTS[i % len(OBJECTS)]
        name = f"{api.lower()}_{action}_{obj}"
        args = {f"{obj}_{field}": f"The {field.replace('_', ' ')} of the {obj}, as the user gave it; required "
                f"when the {obj} is not the current one."
                for field in rng.sample(["id", "name", "owner", "date", "amount", "status", "note"], rng.randint(3, 4))}
        out[name] = _spec(name, f"{API_CLASSES[api]} Tool description: {action.capitalize()} a {obj} of the "
                          f"user's {api.lower()} account and return its details.", **args)
    return out


class FileSystem:
    """Folders of files; bad input is an error result."""

    def __init__(self, tree: dict[str, dict[str, str]]) -> None:
        self.tree = copy.deepcopy(tree)

    def call(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        if name not in TOOLS:
            return ToolResult("", error=f"{name!r} is not a file-system tool; this task's calls go to {sorted(TOOLS)}")
        args = [arguments.get(k) for k in TOOLS[name].parameters["required"]]
        if not all(isinstance(a, str) and a.strip() for a in args):
            return ToolResult("", error=f"{name} needs the string arguments {TOOLS[name].parameters['required']}")
        return getattr(self, name)(*(a.strip() for a in args))

    def ls(self) -> ToolResult:
        return ToolResult(json.dumps({"result": json.dumps({d: sorted(f) for d, f in sorted(self.tree.items())})}))

    def mkdir(self, d: str) -> ToolResult:
        if d in self.tree:
            return ToolResult("", error=f"folder {d!r} exists")
        self.tree[d] = {}
        return ToolResult(json.dumps({"result": f"created {d}"}))

    def echo(self, d: str, f: str, content: str) -> ToolResult:
        if d not in self.tree:
            return ToolResult("", error=f"no folder {d!r}")
        self.tree[d][f] = content
        return ToolResult(json.dumps({"result": f"wrote {d}/{f}"}))

    def mv(self, f: str, source: str, destination: str) -> ToolResult:
        if f not in self.tree.get(source, {}) or destination not in self.tree:
            return ToolResult("", error=f"cannot move {source}/{f} to {destination!r}")
        self.tree[destination][f] = self.tree[source].pop(f)
        return ToolResult(json.dumps({"result": f"moved {f} to {destination}"}))


class FunctionCallingSession(EnvSession):
    def __init__(self, task: Task, extra_tools: dict[str, ToolSpec] | None = None) -> None:
        self.tools = {**TOOLS, **(extra_tools or {})}
        self.task, self.done, self.replies = task, False, []
        self.fs = FileSystem(task.metadata["tree"])
        self.turns = list(task.metadata["user_turns"][1:])
        self.observation = task.instruction

    def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        return self.fs.call(name, arguments)

    def respond(self, reply: str) -> str | None:
        """The agent's reply ended this turn: the user's next message, or None after the last."""
        self.replies.append(reply)
        return self.turns.pop(0) if self.turns else None

    def verify(self, answer: str | None) -> Score:
        n_turns = len(self.task.metadata["user_turns"])
        replied = sum(1 for r in self.replies if r.strip())
        right = self.fs.tree == self.task.answer
        return Score((float(right) + replied / n_turns) / 2, right and replied == n_turns,
                     {"state_matches": right, "turns_replied": replied, "turns": n_turns})

    def close(self) -> None:
        pass


def conversation(rng: random.Random, tree: dict[str, dict[str, str]]) -> tuple[list[str], list[list[ToolCall]]]:
    """(user turns, gold calls per turn): calls, then two turns of talk only, then more calls."""
    new, old = f"project_{rng.randint(10, 99)}", rng.choice(sorted(tree))
    moved = rng.choice(sorted(tree[old]))
    text = rng.choice(["draft one", "call Sam at 5", "buy milk", "ship v2"])
    return ([f"Please create a folder called {new}.", "Thanks, nothing else in there yet.",
             "I'll think about what goes in it.", f"Write '{text}' into {new}/todo.txt, then move {moved} "
             f"from {old} into {new}.", "That's all, thanks."],
            [[ToolCall("mkdir", {"dir_name": new})], [], [],
             [ToolCall("echo", {"dir_name": new, "file_name": "todo.txt", "content": text}),
              ToolCall("mv", {"file_name": moved, "source": old, "destination": new})], []])


class FunctionCallingEnv(Env):
    name = "function_calling"

    def __init__(self, n_tasks: int = 30, seed: int = 0, api_tools: int = 0) -> None:
        """``api_tools``: that many more tools in every session, from other APIs (``bfcl_like_tools``), as
        BFCL lists a whole API's tools whatever the turn needs; a call to one is an error result."""
        if n_tasks < 1:
            raise ValueError(f"n_tasks >= 1, got {n_tasks}")
        if api_tools < 0:
            raise ValueError(f"api_tools >= 0, got {api_tools}")
        self.seed = seed
        self.extra_tools = bfcl_like_tools(api_tools)
        self._tasks = [self._make(i) for i in range(n_tasks)]

    def _make(self, i: int) -> Task:
        rng = random.Random(f"function_calling:{self.seed}:{i}")
        folders = rng.sample(["docs", "src", "tmp", "art"], 2)
        tree = {d: {f"{d}_{k}.txt": f"note {k}" for k in range(2)} for d in folders}
        turns, per_turn = conversation(rng, tree)
        gold = [c for calls in per_turn for c in calls]
        target = FileSystem(tree)
        assert all(target.call(c.name, dict(c.arguments)).error is None for c in gold)
        task_id = "fcall-" + hashlib.sha256(json.dumps([tree, turns]).encode()).hexdigest()[:10]
        return Task(task_id=task_id, env=self.name, split=assign_split(task_id, self.seed), answer=target.tree,
                    instruction=turns[0], capabilities=tuple(sorted({f"tool:{c.name}" for c in gold})),
                    gold_actions=tuple(gold),
                    metadata={"tree": tree, "user_turns": turns, "turn_calls": [len(c) for c in per_turn],
                              "gold_replies": ["Done."] * (len(turns) - 1), "plain_replies": True})

    def tasks(self, split: str) -> list[Task]:
        check_split(split)
        return [t for t in self._tasks if t.split == split]

    def reset(self, task: Task) -> FunctionCallingSession:
        return FunctionCallingSession(task, self.extra_tools)

    @staticmethod
    def gold_answer(task: Task) -> str:
        return "Done."
