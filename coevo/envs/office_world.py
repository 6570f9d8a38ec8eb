"""The world of the ``office`` env: contacts, a calendar, a mailbox and files, with the tools that
read and change them and the check of a final state against a task's target.

Written for coevo (no outside source or dependency). A world is generated from a seed string, so a
task's session rebuilds exactly the world its task was generated from, and every session owns its
own copy: episodes never share state.
"""

from __future__ import annotations

import copy
import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from coevo.harness.events import ToolResult, ToolSpec

ENTITIES = ("calendar", "contacts", "mail", "files")
DATES = {"2026-03-02": "Monday", "2026-03-03": "Tuesday", "2026-03-04": "Wednesday", "2026-03-05": "Thursday",
         "2026-03-06": "Friday"}
FIRST = ("Dana", "Omar", "Priya", "Lena", "Marco", "Yuki", "Sam", "Ines", "Tomas", "Aisha", "Felix", "Nora",
         "Ravi", "Greta", "Hugo", "Zara")
LAST = ("Reyes", "Haddad", "Iyer", "Novak", "Rossi", "Tanaka", "Okafor", "Silva", "Berg", "Khan", "Weber",
        "Lund", "Mehta", "Vogel", "Duarte", "Clarke")
MEETINGS = ("Standup", "Budget review", "Design sync", "Hiring panel", "Roadmap planning", "Client call",
            "Retro", "Security review", "Offsite prep", "Launch check-in")
ITEMS = ("open questions", "Q2 targets", "staffing", "risks", "timeline", "demo", "customer feedback",
         "action items", "vendor quotes", "metrics")
VENDORS = ("Acme Paper", "Globex Cloud", "Initech Travel", "Umbrella Catering", "Stark Printing")
FIELDS = ("email", "phone", "status")
DATE_RE, TIME_RE = re.compile(r"^2\d{3}-\d{2}-\d{2}$"), re.compile(r"^([01]\d|2[0-3]):[0-5]\d$")
MUTATING = frozenset({"calendar_create", "calendar_cancel", "calendar_reschedule", "contacts_update", "mail_send",
                      "files_write"})


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def make_world(seed: str) -> dict[str, Any]:
    """Eight contacts with distinct first names, six events with distinct titles over one week (each
    with an agenda file), three vendor invoices in the inbox."""
    rng = random.Random(seed)
    firsts, lasts = rng.sample(FIRST, 8), rng.sample(LAST, 8)
    contacts = {}
    for n, (first, last) in enumerate(zip(firsts, lasts, strict=False), 1):
        cid = f"c-{n}"
        contacts[cid] = {"id": cid, "name": f"{first} {last}", "email": f"{first}.{last}@acme.io".lower(),
                         "phone": f"555-{rng.randint(1000, 9999)}", "status": "active"}
    emails = [c["email"] for c in contacts.values()]
    events, files = {}, {}
    for n, title in enumerate(rng.sample(MEETINGS, 6), 1):
        eid, path = f"ev-{n}", f"agendas/ev-{n}.txt"
        events[eid] = {"id": eid, "title": title, "date": rng.choice(sorted(DATES)),
                       "time": f"{rng.randint(8, 16):02d}:{rng.choice(('00', '30'))}",
                       "attendees": sorted(rng.sample(emails, rng.randint(2, 3))), "agenda": path}
        items = rng.sample(ITEMS, 3)
        files[path] = f"Agenda for {title}:\n" + "".join(f"{i}. {item}\n" for i, item in enumerate(items, 1))
    inbox = []
    for n, vendor in enumerate(rng.sample(VENDORS, 3), 1):
        number = f"INV-{rng.randint(10000, 99999)}"
        inbox.append({"id": f"m-{n}", "from": f"billing@{slug(vendor)}.com", "to": "me@acme.io",
                      "subject": f"Invoice from {vendor}",
                      "body": f"Dear customer, please find invoice {number} from {vendor} attached."})
    return {"contacts": contacts, "events": events, "files": files, "inbox": inbox, "sent": [],
            "next": {"event": 7, "mail": 4}}


def _spec(tool: str, description: str, **props: str) -> ToolSpec:
    types = {k: ({"type": "array", "items": {"type": "string"}} if v == "list" else {"type": v})
             for k, v in props.items()}
    return ToolSpec(tool, description, {"type": "object", "properties": types, "required": sorted(props)})


TOOLS = {t.name: t for t in (
    _spec("calendar_list", "List the events on a date (YYYY-MM-DD).", date="string"),
    _spec("calendar_create", "Create an event; attendees are email addresses. Returns the new event.",
          title="string", date="string", time="string", attendees="list"),
    _spec("calendar_cancel", "Cancel (delete) the event with this id.", event_id="string"),
    _spec("calendar_reschedule", "Move the event with this id to a new date (YYYY-MM-DD) and time (HH:MM).",
          event_id="string", date="string", time="string"),
    _spec("contacts_find", "Find contacts whose name contains the text: id, name, email, phone, status.",
          name="string"),
    _spec("contacts_update", f"Set a field ({', '.join(FIELDS)}) of the contact with this id.",
          contact_id="string", field="string", value="string"),
    _spec("mail_send", "Send a mail to one email address.", to="string", subject="string", body="string"),
    _spec("mail_search", "Search received and sent mail (sender, recipient, subject, body) for the text.",
          query="string"),
    _spec("files_read", "Read a text file by its path.", path="string"),
    _spec("files_write", "Write (create or replace) a text file.", path="string", content="string"),
)}
OWNER = {name: name.split("_")[0] for name in TOOLS}


class ToolError(Exception):
    pass


def _check_args(name: str, args: object) -> dict[str, Any]:
    if not isinstance(args, dict):
        raise ToolError(f"{name} needs an object of arguments")
    props = TOOLS[name].parameters["properties"]
    missing, extra = sorted(set(props) - set(args)), sorted(set(args) - set(props))
    if missing or extra:
        raise ToolError(f"{name} takes {sorted(props)}; missing {missing}, unexpected {extra}")
    for key, schema in props.items():
        value = args[key]
        if schema["type"] == "array":
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ToolError(f"{name}: {key!r} must be a list of strings")
        elif not isinstance(value, str) or not value.strip():
            raise ToolError(f"{name}: {key!r} must be a non-empty string")
    if "date" in args and (not DATE_RE.match(args["date"])):
        raise ToolError(f"{name}: date must be YYYY-MM-DD, got {args['date']!r}")
    if "time" in args and not TIME_RE.match(args["time"]):
        raise ToolError(f"{name}: time must be HH:MM, got {args['time']!r}")
    for addr in args.get("attendees", []) + ([args["to"]] if "to" in args else []):
        if "@" not in addr:
            raise ToolError(f"{name}: {addr!r} is not an email address")
    return args


def _dump(value: object) -> str:
    return json.dumps(value, ensure_ascii=False)


@dataclass
class World:
    """One session's mutable state and the tools over it (plain data inside, deep-copied on creation)."""

    state: dict[str, Any]
    handlers: dict[str, Callable[[dict[str, Any]], str]] = field(init=False)

    def __post_init__(self) -> None:
        self.state = copy.deepcopy(self.state)
        self.handlers = {name: getattr(self, name) for name in TOOLS}

    def call(self, name: str, arguments: object) -> ToolResult:
        if name not in self.handlers:
            return ToolResult("", error=f"unknown tool {name!r}; available: {sorted(TOOLS)}")
        try:
            return ToolResult(self.handlers[name](_check_args(name, arguments)))
        except ToolError as err:
            return ToolResult("", error=str(err))

    def _event(self, event_id: str) -> dict[str, Any]:
        if event_id not in self.state["events"]:
            raise ToolError(f"no event with id {event_id!r}")
        return self.state["events"][event_id]

    def calendar_list(self, a: dict[str, Any]) -> str:
        found = [e for e in self.state["events"].values() if e["date"] == a["date"]]
        return _dump(sorted(found, key=lambda e: e["time"])) if found else f"no events on {a['date']}"

    def calendar_create(self, a: dict[str, Any]) -> str:
        eid = f"ev-{self.state['next']['event']}"
        self.state["next"]["event"] += 1
        event = {"id": eid, "title": a["title"].strip(), "date": a["date"], "time": a["time"],
                 "attendees": sorted(x.strip().lower() for x in a["attendees"]), "agenda": None}
        self.state["events"][eid] = event
        return _dump(event)

    def calendar_cancel(self, a: dict[str, Any]) -> str:
        event = self._event(a["event_id"])
        del self.state["events"][event["id"]]
        return f"cancelled {event['id']} ({event['title']} on {event['date']})"

    def calendar_reschedule(self, a: dict[str, Any]) -> str:
        event = self._event(a["event_id"])
        event["date"], event["time"] = a["date"], a["time"]
        return _dump(event)

    def contacts_find(self, a: dict[str, Any]) -> str:
        query = a["name"].strip().lower()
        found = [c for c in self.state["contacts"].values() if query in c["name"].lower()]
        return _dump(found) if found else f"no contact matches {a['name']!r}"

    def contacts_update(self, a: dict[str, Any]) -> str:
        contact = self.state["contacts"].get(a["contact_id"])
        if contact is None:
            raise ToolError(f"no contact with id {a['contact_id']!r}")
        if a["field"] not in FIELDS:
            raise ToolError(f"field must be one of {list(FIELDS)}, got {a['field']!r}")
        contact[a["field"]] = a["value"].strip()
        return _dump(contact)

    def mail_send(self, a: dict[str, Any]) -> str:
        mid = f"m-{self.state['next']['mail']}"
        self.state["next"]["mail"] += 1
        self.state["sent"].append({"id": mid, "from": "me@acme.io", "to": a["to"].strip().lower(),
                                   "subject": a["subject"], "body": a["body"]})
        return f"sent {mid} to {a['to']}"

    def mail_search(self, a: dict[str, Any]) -> str:
        query = a["query"].lower()
        found = [m for m in self.state["inbox"] + self.state["sent"]
                 if any(query in m[k].lower() for k in ("from", "to", "subject", "body"))]
        return _dump(found) if found else f"no mail matches {a['query']!r}"

    def files_read(self, a: dict[str, Any]) -> str:
        if a["path"] not in self.state["files"]:
            raise ToolError(f"no file {a['path']!r}")
        return self.state["files"][a["path"]]

    def files_write(self, a: dict[str, Any]) -> str:
        self.state["files"][a["path"].strip()] = a["content"]
        return f"wrote {len(a['content'])} characters to {a['path']}"


def _events(state: dict[str, Any]) -> list[list[Any]]:
    return sorted([e["title"].lower(), e["date"], e["time"], sorted(e["attendees"])] for e in state["events"].values())


def _norm(text: str) -> str:
    return re.sub(r"[^a-z0-9@]+", "", text.lower())


def target(initial: dict[str, Any], gold: Any, mails: list[dict[str, Any]], files: dict[str, list[str]],
           reply: str | None) -> dict[str, Any]:
    """A task's target state: contacts and events as the gold actions leave them (events without ids),
    every other file unchanged, the written ``files`` holding their required texts, and exactly the
    ``mails`` sent (each ``{"to", "contains"}``); plus ``reply``, a text the final answer must hold."""
    world = World(initial)
    for call in gold:
        result = world.call(call.name, call.arguments)
        if result.error is not None:
            raise ValueError(f"gold call {call.name}({call.arguments}) fails: {result.error}")
    kept = {p: c for p, c in world.state["files"].items() if p not in files}
    return {"contacts": world.state["contacts"], "events": _events(world.state), "kept_files": kept,
            "files": files, "mails": mails, "reply": reply}


def check(state: dict[str, Any], want: dict[str, Any], answer: str | None) -> list[str]:
    """What differs between a final state (and answer) and the target; empty when they agree."""
    problems = []
    if state["contacts"] != want["contacts"]:
        problems.append("contacts differ from the target")
    if _events(state) != want["events"]:
        problems.append("calendar differs from the target")
    written = {p: c for p, c in state["files"].items() if p not in want["files"]}
    if written != want["kept_files"]:
        problems.append("files other than the ones to write were changed, added or deleted")
    for path, needed in want["files"].items():
        content = state["files"].get(path)
        if content is None or not all(_norm(n) in _norm(content) for n in needed):
            problems.append(f"file {path} missing or lacks {needed}")
    unmatched = list(state["sent"])
    for mail in want["mails"]:
        hit = next((m for m in unmatched if m["to"] == mail["to"]
                    and all(_norm(n) in _norm(m["subject"] + " " + m["body"]) for n in mail["contains"])), None)
        if hit is None:
            problems.append(f"no mail to {mail['to']} mentioning {mail['contains']}")
        else:
            unmatched.remove(hit)
    if unmatched:
        problems.append(f"{len(unmatched)} mail(s) sent that the task did not ask for")
    if want["reply"] is not None and (answer is None or _norm(want["reply"]) not in _norm(answer)):
        problems.append(f"the final answer does not give {want['reply']!r}")
    return problems
