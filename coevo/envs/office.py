"""The ``office`` env: an offline office assistant with stateful tools owned by four entities
(calendar, contacts, mail, files), written for coevo, deterministic and dependency-free.

Task ``i`` of seed ``s`` (id ``office-<s>-<i>``) is generated from ``(s, i)`` alone: its world
(``office_world.make_world``) and one of ten kinds, five touching one entity and five needing tools
of two to four entities. Every task has its gold tool-call sequence, ``tool:<name>`` capabilities for
exactly the tools of that sequence, ``metadata["entities"]`` (the owners it touches) and, as its
``answer``, the target state. ``verify`` checks the session's FINAL STATE against that target
(``office_world.check``: contacts and calendar exactly as the gold path leaves them, no other file
changed, written files and sent mails holding the required texts, no extra mail) and, for the two
kinds that ask a question, that the final answer holds the asked-for value.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from coevo.envs.base import Env, EnvSession, Score, Task, assign_split, check_split
from coevo.envs.office_world import (
    DATES,
    ENTITIES,
    FIELDS,
    MUTATING,
    OWNER,
    TOOLS,
    World,
    check,
    make_world,
    slug,
    target,
)
from coevo.harness.events import Message, ToolCall, ToolResult, ToolSpec

__all__ = ["ENTITIES", "FIELDS", "OWNER", "OfficeEnv", "OfficeSession", "degraded", "final_answer", "gold_solver",
           "make_task"]

C = ToolCall
Made = tuple[str, list[ToolCall], list[dict[str, Any]], dict[str, list[str]], "str | None"]
"""A kind's task: instruction, gold calls, mails to be sent, files to be written, final-answer text."""
Kind = Callable[[dict[str, Any], random.Random], Made]


def _contacts(world: dict[str, Any], rng: random.Random, n: int = 1) -> list[dict[str, Any]]:
    return rng.sample(sorted(world["contacts"].values(), key=lambda c: c["id"]), n)


def _event(world: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    return rng.choice(sorted(world["events"].values(), key=lambda e: e["id"]))


def _on(event: dict[str, Any]) -> str:
    return f"{DATES[event['date']]} {event['date']}"


def _new_time(rng: random.Random, old: str) -> str:
    return rng.choice([t for t in (f"{h:02d}:00" for h in range(8, 18)) if t != old])


def lookup_phone(w: dict[str, Any], rng: random.Random) -> Made:
    c = _contacts(w, rng)[0]
    gold = [C("contacts_find", {"name": c["name"]}), C("contacts_update", {"contact_id": c["id"], "field": "status",
                                                                         "value": "called"})]
    return (f"What is {c['name']}'s phone number? Give it as your final answer, and set their contact status to "
            "'called'.", gold, [], {}, c["phone"])


def update_phone(w: dict[str, Any], rng: random.Random) -> Made:
    c, phone = _contacts(w, rng)[0], f"555-{rng.randint(1000, 9999)}"
    gold = [C("contacts_find", {"name": c["name"]}), C("contacts_update", {"contact_id": c["id"], "field": "phone",
                                                                         "value": phone})]
    return f"{c['name']} has a new phone number, {phone}. Update their contact.", gold, [], {}, None


def create_block(w: dict[str, Any], rng: random.Random) -> Made:
    date, title = rng.choice(sorted(DATES)), f"Focus time {rng.randint(1, 99)}"
    time = f"{rng.randint(8, 16):02d}:00"
    gold = [C("calendar_create", {"title": title, "date": date, "time": time, "attendees": []})]
    return (f"Block my calendar: create an event '{title}' on {DATES[date]} {date} at {time} with no attendees.",
            gold, [], {}, None)


def cancel_event(w: dict[str, Any], rng: random.Random) -> Made:
    e = _event(w, rng)
    gold = [C("calendar_list", {"date": e["date"]}), C("calendar_cancel", {"event_id": e["id"]})]
    return f"Cancel the '{e['title']}' meeting on {_on(e)}.", gold, [], {}, None


def invoice(w: dict[str, Any], rng: random.Random) -> Made:
    m = rng.choice(w["inbox"])
    vendor, number = m["subject"].removeprefix("Invoice from "), re.search(r"INV-\d+", m["body"]).group()
    gold = [C("mail_search", {"query": vendor}),
            C("mail_send", {"to": m["from"], "subject": f"Invoice {number} received", "body": "Thank you."})]
    return (f"Find the invoice mail from {vendor}, reply to its sender confirming receipt (quote the invoice "
            "number), and give the invoice number as your final answer.",
            gold, [{"to": m["from"], "contains": [number]}], {}, number)


def invite(w: dict[str, Any], rng: random.Random) -> Made:
    a, b = _contacts(w, rng, 2)
    date, time, title = rng.choice(sorted(DATES)), f"{rng.randint(8, 16):02d}:30", f"Chat {rng.randint(1, 99)}"
    gold = [C("contacts_find", {"name": a["name"]}), C("contacts_find", {"name": b["name"]}),
            C("calendar_create", {"title": title, "date": date, "time": time,
                                  "attendees": sorted([a["email"], b["email"]])})]
    return (f"Schedule '{title}' on {DATES[date]} {date} at {time} with {a['name']} and {b['name']} as attendees.",
            gold, [], {}, None)


def send_agenda(w: dict[str, Any], rng: random.Random) -> Made:
    c, e = _contacts(w, rng)[0], _event(w, rng)
    items = re.findall(r"^\d\. (.+)$", w["files"][e["agenda"]], flags=re.MULTILINE)
    gold = [C("contacts_find", {"name": c["name"]}), C("calendar_list", {"date": e["date"]}),
            C("files_read", {"path": e["agenda"]}),
            C("mail_send", {"to": c["email"], "subject": e["title"], "body": "; ".join(items)})]
    return (f"Find {c['name']}'s email and send them the agenda of the '{e['title']}' meeting on {_on(e)} (the "
            "event names its agenda file); put the meeting title in the subject and the agenda items in the body.",
            gold, [{"to": c["email"], "contains": [e["title"], *items]}], {}, None)


def move_and_notify(w: dict[str, Any], rng: random.Random) -> Made:
    e = _event(w, rng)
    time = _new_time(rng, e["time"])
    gold = [C("calendar_list", {"date": e["date"]}),
            C("calendar_reschedule", {"event_id": e["id"], "date": e["date"], "time": time})]
    gold += [C("mail_send", {"to": to, "subject": f"{e['title']} moved", "body": f"Now at {time}."})
             for to in e["attendees"]]
    mails = [{"to": to, "contains": [e["title"], time]} for to in e["attendees"]]
    return (f"Move the '{e['title']}' on {_on(e)} to {time} (same day) and tell every attendee by mail, one mail "
            "each, naming the meeting and the new time.", gold, mails, {}, None)


def save_card(w: dict[str, Any], rng: random.Random) -> Made:
    c = _contacts(w, rng)[0]
    path = f"cards/{slug(c['name'])}.txt"
    gold = [C("contacts_find", {"name": c["name"]}),
            C("files_write", {"path": path, "content": f"{c['name']}\n{c['email']}\n{c['phone']}\n"})]
    return (f"Save {c['name']}'s email address and phone number in the file {path}.", gold, [],
            {path: [c["email"], c["phone"]]}, None)


def new_email(w: dict[str, Any], rng: random.Random) -> Made:
    c = _contacts(w, rng)[0]
    new = f"{slug(c['name']).replace('-', '')}{rng.randint(1, 99)}@new.io"
    gold = [C("contacts_find", {"name": c["name"]}),
            C("contacts_update", {"contact_id": c["id"], "field": "email", "value": new}),
            C("mail_send", {"to": new, "subject": "Email updated", "body": "We updated your contact."})]
    return (f"{c['name']}'s email address is now {new}. Update their contact, then send a mail to the new address "
            "confirming the change.", gold, [{"to": new, "contains": []}], {}, None)


KINDS: dict[str, Kind] = {k.__name__: k for k in (lookup_phone, update_phone, create_block, cancel_event, invoice,
                                                   invite, send_agenda, move_and_notify, save_card, new_email)}
TASK_RE = re.compile(r"\bTicket (office-(-?\d+)-(\d+))\b")


def world_seed(seed: int, index: int) -> str:
    return f"office-world:{seed}:{index}"


@lru_cache(maxsize=4096)
def make_task(seed: int, index: int) -> Task:
    """Task ``index`` of ``seed``: its kind cycles through ``KINDS``, everything else comes from (seed, index)."""
    world = make_world(world_seed(seed, index))
    kind = list(KINDS)[index % len(KINDS)]
    instruction, gold, mails, files, reply = KINDS[kind](world, random.Random(f"office-task:{seed}:{index}"))
    task_id = f"office-{seed}-{index:03d}"
    tools = sorted({c.name for c in gold})
    return Task(task_id=task_id, env="office", instruction=f"Ticket {task_id}: {instruction}",
                split=assign_split(task_id, seed), answer=target(world, gold, mails, files, reply),
                capabilities=tuple(f"tool:{t}" for t in tools), gold_actions=tuple(gold),
                metadata={"entities": sorted({OWNER[t] for t in tools}), "kind": kind,
                          "world_seed": world_seed(seed, index)})


def final_answer(task: Task) -> str:
    """A final answer the verifier accepts for a task whose state is right: the asked-for value, or 'done'."""
    return task.answer["reply"] or "done"


def degraded(gold_actions: tuple[ToolCall, ...] | list[ToolCall]) -> list[ToolCall]:
    """The gold path without its last state-changing call (every task has one), for tests."""
    calls = list(gold_actions)
    last = max(i for i, c in enumerate(calls) if c.name in MUTATING)
    return calls[:last] + calls[last + 1:]


@dataclass
class OfficeSession(EnvSession):
    task: Task
    observation: str
    world: World
    tools: dict[str, ToolSpec] = field(default_factory=lambda: dict(TOOLS))
    done: bool = False

    def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        return self.world.call(name, arguments)

    def verify(self, answer: str | None) -> Score:
        problems = check(self.world.state, self.task.answer, answer)
        return Score(0.0 if problems else 1.0, not problems, {"problems": problems})

    def close(self) -> None:
        pass


class OfficeEnv(Env):
    """``n_tasks`` office tasks of ``seed`` (100 by default); splits by ``assign_split``."""

    name = "office"
    tool_owners = OWNER  # tool -> entity: the agents axis makes one specialist per entity
    gold_answer = staticmethod(final_answer)  # what coevo.agent.gold.GoldPolicy answers once the calls are made

    def __init__(self, n_tasks: int = 100, seed: int = 0) -> None:
        if not 1 <= n_tasks <= 1000:
            raise ValueError(f"office env: n_tasks must be in [1, 1000], got {n_tasks}")
        self._tasks = [make_task(seed, i) for i in range(n_tasks)]

    def tasks(self, split: str) -> list[Task]:
        check_split(split)
        return [t for t in self._tasks if t.split == split]

    def reset(self, task: Task) -> OfficeSession:
        world = World(make_world(task.metadata["world_seed"]))
        return OfficeSession(task, task.instruction, world)


def gold_solver(messages: list[Message]) -> str:
    """A scripted agent that replays the task's gold actions: it finds ``Ticket office-<seed>-<i>`` in
    the user messages, rebuilds that task, emits the next gold call (one per turn, counted from the
    assistant turns that made a call) in the ``<tool_call>`` JSON the base harness parses, then the answer."""
    text = "\n".join(m.get("content") or "" for m in messages if m.get("role") == "user")
    match = TASK_RE.search(text)
    if match is None:
        return "<answer>I cannot find the ticket.</answer>"
    task = make_task(int(match.group(2)), int(match.group(3)))
    made = sum(1 for m in messages if m.get("role") == "assistant" and "<tool_call>" in (m.get("content") or ""))
    if made < len(task.gold_actions):
        call = task.gold_actions[made]
        return "<tool_call>" + json.dumps({"name": call.name, "arguments": call.arguments}) + "</tool_call>"
    return f"<answer>{final_answer(task)}</answer>"
