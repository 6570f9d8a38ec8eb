"""A help desk with a stateful account API; customers write several times (docs/environments.md, example 1).

Each task is a conversation of two or three user turns. In each turn the customer asks for
something, the agent acts with the tools, then replies (``<answer>...</answer>`` in the default
harness); the session's ``respond`` hands the runtime the customer's next message, or None after
the last one. ``verify`` checks the accounts' FINAL STATE against the state the gold calls leave,
and that every turn got a reply; the reply texts themselves are not graded.

    PYTHONPATH=. coevo eval --env examples.helpdesk_env:HelpdeskEnv --model gold --split val \\
        --max-steps 12      # also raises the harness's step budget (6) to 12
"""

from __future__ import annotations

import copy
import hashlib
import json
import random
from typing import Any

from coevo.envs.base import Env, EnvSession, Score, Task, assign_split, check_split
from coevo.harness.events import ToolCall, ToolResult, ToolSpec

PLANS = ("basic", "pro", "team")
NAMES = ("Ana Lima", "Ben Okafor", "Chen Wei", "Dara Shah", "Eli Novak", "Fay Moreau", "Gus Berg", "Hana Sato")


def _spec(name: str, description: str, **args: str) -> ToolSpec:
    props = {k: {"type": "string", "description": v} for k, v in args.items()}
    return ToolSpec(name, description, {"type": "object", "properties": props, "required": list(args)})


TOOLS = {t.name: t for t in (
    _spec("find_account", "Look up an account by the customer's email: id, plan, invoices.", email="the email"),
    _spec("change_plan", "Move an account to another plan.", account_id="e.g. A-31", plan="basic | pro | team"),
    _spec("refund", "Refund one paid invoice of an account.", account_id="e.g. A-31", invoice_id="e.g. INV-3105"),
    _spec("update_email", "Change an account's email address.", account_id="e.g. A-31", email="the new address"),
)}


class Accounts:
    """The account API: a dict world, one method per tool; bad input is an error result."""

    def __init__(self, world: dict[str, Any]) -> None:
        self.world = copy.deepcopy(world)  # every session mutates its own copy

    def call(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        if name not in TOOLS:
            return ToolResult("", error=f"unknown tool {name!r}; tools: {sorted(TOOLS)}")
        required = TOOLS[name].parameters["required"]
        bad = [k for k in required if not isinstance(arguments.get(k), str)]
        if bad:
            return ToolResult("", error=f"{name} needs the string arguments {bad}")
        if "account_id" in arguments and arguments["account_id"] not in self.world:
            return ToolResult("", error=f"no account {arguments['account_id']!r}")
        return getattr(self, name)(*(arguments[k].strip() for k in required))

    def find_account(self, email: str) -> ToolResult:
        for aid, acc in self.world.items():
            if acc["email"] == email.lower():
                bills = ", ".join(f"{i} {s}" for i, s in acc["invoices"].items())
                return ToolResult(f"{aid}: {acc['name']}, plan {acc['plan']}, invoices: {bills}")
        return ToolResult("", error=f"no account with email {email!r}")

    def change_plan(self, aid: str, plan: str) -> ToolResult:
        if plan not in PLANS:
            return ToolResult("", error=f"plan must be one of {list(PLANS)}")
        self.world[aid]["plan"] = plan
        return ToolResult(f"{aid} is on the {plan} plan")

    def refund(self, aid: str, invoice: str) -> ToolResult:
        status = self.world[aid]["invoices"].get(invoice)
        if status != "paid":
            return ToolResult("", error=f"{invoice} is not a paid invoice of {aid} ({status or 'unknown'})")
        self.world[aid]["invoices"][invoice] = "refunded"
        return ToolResult(f"{invoice} refunded")

    def update_email(self, aid: str, email: str) -> ToolResult:
        if "@" not in email or any(a["email"] == email.lower() for a in self.world.values()):
            return ToolResult("", error=f"{email!r} is not a valid, unused address")
        self.world[aid]["email"] = email.lower()
        return ToolResult(f"{aid} email is {email.lower()}")


class HelpdeskSession(EnvSession):
    tools = TOOLS

    def __init__(self, task: Task) -> None:
        self.task, self.done, self.replies = task, False, []
        self.accounts = Accounts(task.metadata["world"])
        self.turns = list(task.metadata["user_turns"][1:])  # what the customer still has to say
        self.observation = task.instruction

    def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        return self.accounts.call(name, arguments)

    def respond(self, reply: str) -> str | None:
        """The agent answered this turn: the customer's next message, or None when they are done."""
        self.replies.append(reply)
        return self.turns.pop(0) if self.turns else None

    def verify(self, answer: str | None) -> Score:
        target, world = self.task.answer, self.accounts.world
        wrong = sorted(aid for aid in target if world[aid] != target[aid])
        n_turns = len(self.task.metadata["user_turns"])
        replied = sum(1 for r in self.replies if r.strip())
        passed = not wrong and replied == n_turns and answer is not None
        reward = (float(not wrong) + replied / n_turns) / 2
        return Score(reward, passed, {"wrong_accounts": wrong, "turns_replied": replied, "turns": n_turns})

    def close(self) -> None:
        pass


def conversation(rng: random.Random, world: dict[str, Any], kind: int, i: int):
    """(user turns, gold calls per turn, gold replies to the non-final turns) of one task."""
    aid = rng.choice(sorted(world))
    acc = world[aid]
    email, plan = acc["email"], rng.choice([p for p in PLANS if p != acc["plan"]])
    invoice = rng.choice(sorted(acc["invoices"]))
    new_email = f"{acc['name'].split()[1].lower()}.{i}@example.org"
    find = ToolCall("find_account", {"email": email})
    change = ToolCall("change_plan", {"account_id": aid, "plan": plan})
    refund = ToolCall("refund", {"account_id": aid, "invoice_id": invoice})
    update = ToolCall("update_email", {"account_id": aid, "email": new_email})
    if kind == 0:
        return ([f"Hi, this is {email}. Please move my account to the {plan} plan.",
                 f"Thanks! I was charged twice: please refund invoice {invoice}."],
                [[find, change], [refund]], [f"You are on the {plan} plan now."])
    if kind == 1:
        return ([f"Hello, my email is {email}. Which plan am I on?", f"Please switch me to {plan}.",
                 f"One more thing: change my email to {new_email}."],
                [[find], [change], [update]], [f"You are on the {acc['plan']} plan.", f"Switched to {plan}."])
    return ([f"I'm {email}. Please refund invoice {invoice}.", f"Also move me to the {plan} plan.",
             f"And update my email to {new_email}, thanks."],
            [[find, refund], [change], [update]], ["Refunded.", f"You are on the {plan} plan now."])


class HelpdeskEnv(Env):
    name = "helpdesk"

    def __init__(self, n_tasks: int = 30, seed: int = 0) -> None:
        if n_tasks < 1:
            raise ValueError(f"n_tasks >= 1, got {n_tasks}")
        self.seed = seed
        self._tasks = [self._make(i) for i in range(n_tasks)]

    def _make(self, i: int) -> Task:
        rng = random.Random(f"helpdesk:{self.seed}:{i}")
        world = {}
        for n, name in enumerate(rng.sample(NAMES, 4)):
            world[f"A-{n + 1}{rng.randint(10, 99)}"] = {
                "name": name, "email": name.split()[0].lower() + "@example.com", "plan": rng.choice(PLANS),
                "invoices": {f"INV-{n + 1}{k}{rng.randint(10, 99)}": "paid" for k in range(2)}}
        turns, per_turn, replies = conversation(rng, world, i % 3, i)
        gold = [c for calls in per_turn for c in calls]
        target = Accounts(world)
        assert all(target.call(c.name, dict(c.arguments)).error is None for c in gold)
        task_id = "helpdesk-" + hashlib.sha256(json.dumps([world, turns]).encode()).hexdigest()[:10]
        size = "two" if len(turns) == 2 else "three"
        return Task(task_id=task_id, env=self.name, split=assign_split(task_id, self.seed), answer=target.world,
                    instruction=(f"You work at the Acme help desk. A customer writes:\n\n{turns[0]}\n\nUse the "
                                 "tools to do what they ask, then reply to them as <answer>your reply</answer>. "
                                 "They may write again."),
                    capabilities=tuple(sorted({f"tool:{c.name}" for c in gold})) + (f"skill:helpdesk_{size}_turns",),
                    gold_actions=tuple(gold),
                    metadata={"world": world, "user_turns": turns, "turn_calls": [len(c) for c in per_turn],
                              "gold_replies": replies})

    def tasks(self, split: str) -> list[Task]:
        check_split(split)
        return [t for t in self._tasks if t.split == split]

    def reset(self, task: Task) -> HelpdeskSession:
        return HelpdeskSession(task)

    @staticmethod
    def gold_answer(task: Task) -> str:
        """The gold policy's reply to the last turn (the verifier reads the state, not this text)."""
        return "All done. Anything else, just write."
