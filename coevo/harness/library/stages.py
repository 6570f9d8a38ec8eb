"""Processors that expose one stage of a harness stream (``coevo.streams``): the stage's tool
catalogue (released tools plus distractors) and a retrievable skill pool.

They are built-ins like the rest of the library, so a stream's stage harnesses load back from YAML
and AEGIS can carry them across stages; the rule meta-agent never proposes them.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import Any

from coevo.harness.errors import ParamError
from coevo.harness.events import TaskStartEvent, ToolResult, ToolSpec
from coevo.harness.hooks import Dimension, Hook
from coevo.harness.processor import Param, Processor

_QUERY = {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}

DISTRACTORS: dict[str, tuple[str, dict[str, Any]]] = {
    "unit_converter": ("Convert a quantity between units of length, mass, time or temperature.",
                       {"value": {"type": "number"}, "from_unit": {"type": "string"}, "to_unit": {"type": "string"}}),
    "web_search": ("Search the web and return the titles of the top results.", {"query": {"type": "string"}}),
    "date_diff": ("Count the days between two calendar dates.",
                  {"start": {"type": "string"}, "end": {"type": "string"}}),
    "dictionary": ("Look up the definition of an English word.", {"word": {"type": "string"}}),
    "currency_rates": ("Return the exchange rate between two currencies.",
                       {"base": {"type": "string"}, "quote": {"type": "string"}}),
    "weather": ("Report the current weather in a city.", {"city": {"type": "string"}}),
    "translate": ("Translate a text into another language.",
                  {"text": {"type": "string"}, "target_language": {"type": "string"}}),
    "stock_quote": ("Return the latest price of a stock ticker.", {"ticker": {"type": "string"}}),
    "geocode": ("Return the coordinates of a street address.", {"address": {"type": "string"}}),
    "spell_check": ("Suggest spelling corrections for a sentence.", {"text": {"type": "string"}}),
}
"""Plausible tools that never help: name → (description, argument properties). Stages add them in
this order, so the distractors of stage s are a prefix of those of stage s + 1."""


def distractor_spec(name: str, provider: str) -> ToolSpec:
    description, properties = DISTRACTORS[name]
    return ToolSpec(name, description, {"type": "object", "properties": properties, "required": sorted(properties)},
                    provider=provider)


class StageTools(Processor):
    """The tools axis at one stage. Of the axis's tools (``universe``) only ``released`` stay
    offered, whoever offers them (the env session or a harness processor such as
    ``python_executor``); tools outside the universe are left alone. ``distractors`` (names from
    ``DISTRACTORS``) are offered too and answer every call with a "nothing relevant" error.

    It runs before ``tool_registry``, so an edit that sets the registry to ``['*']`` cannot expose
    a tool the stream has not released yet.
    """

    kind = "stage_tools"
    description = ("Offers a harness-stream stage's tool catalogue: withholds the axis's unreleased tools and adds "
                   "distractor tools that return nothing useful.")
    hook = Hook.TASK_START
    dimension = Dimension.TOOLS
    consumes = produces = TaskStartEvent
    group = "stage_tools"
    runs_after = frozenset({"python_executor"})  # harness-provided tools are offered before they are gated
    params = (
        Param("released", "str_list", [], "tools of the axis released so far"),
        Param("universe", "str_list", [], "every tool of the axis; those not released are withheld"),
        Param("distractors", "str_list", [], f"distractor tools to offer, from {sorted(DISTRACTORS)}"),
    )

    def __init__(self, name: str | None = None, **params: object) -> None:
        super().__init__(name, **params)
        released, universe, fake = self.config["released"], self.config["universe"], self.config["distractors"]
        stray = sorted(set(released) - set(universe))
        if stray:
            raise ParamError(self.name, f"released tools {stray} are not in the universe {sorted(universe)}")
        unknown = sorted(set(fake) - set(DISTRACTORS))
        if unknown:
            raise ParamError(self.name, f"unknown distractors {unknown}; choose from {sorted(DISTRACTORS)}")
        clash = sorted(set(fake) & set(universe))
        if clash or len(set(fake)) != len(fake):
            raise ParamError(self.name, f"distractors must be distinct and outside the universe; clash: {clash}")

    def provided_tools(self) -> list[ToolSpec]:
        return [distractor_spec(n, self.name) for n in self.config["distractors"]]

    def process(self, event: TaskStartEvent) -> TaskStartEvent:
        withheld = set(self.config["universe"]) - set(self.config["released"])
        offered = {n: spec for n, spec in event.state.available_tools.items() if n not in withheld}
        for spec in self.provided_tools():
            offered.setdefault(spec.name, spec)
        event.state.available_tools = offered
        return event

    def call_tool(self, call_name: str, arguments: dict[str, Any], timeout_s: float) -> ToolResult:
        if call_name not in self.config["distractors"]:
            return super().call_tool(call_name, arguments, timeout_s)
        return ToolResult("", error=f"{call_name} found nothing relevant to this request")


SKILL_TOOL = "skill_lookup"
_WORD = re.compile(r"[a-z0-9]+")
_STOP = frozenset({"a", "an", "and", "are", "as", "be", "by", "do", "does", "for", "from", "how", "i", "if", "in", "is",
                   "it", "its", "of", "on", "or", "so", "that", "the", "then", "this", "to", "what", "when", "which",
                   "with", "you", "your", "solve", "task", "tasks"})


def _words(text: str) -> set[str]:
    """Content words, lower-cased, a plural ``s`` dropped (``letters`` matches ``letter``)."""
    words = _WORD.findall(text.lower().replace("_", " "))
    return {w[:-1] if len(w) > 3 and w.endswith("s") and not w.endswith("ss") else w for w in words} - _STOP


class SkillLibrary(Processor):
    """The skills axis at one stage: a pool of procedural notes the agent retrieves with the
    ``skill_lookup`` tool. Nothing is injected into the prompt; the tool's description lists the
    skill names (an index), and a lookup returns the ``top_k`` notes whose name and text share
    the most content words with the query, rarer words weighing more and name words double (an
    exact name wins)."""

    kind = "skill_library"
    description = "Offers a skill_lookup tool that retrieves procedural notes from a pool of skill documents."
    hook = Hook.TASK_START
    dimension = Dimension.TOOLS
    consumes = produces = TaskStartEvent
    group = "skill_library"
    params = (
        Param("skills", "dict", {}, "skill name -> procedural note"),
        Param("top_k", "int", 1, "notes returned per lookup"),
    )

    def __init__(self, name: str | None = None, **params: object) -> None:
        super().__init__(name, **params)
        bad = sorted(k for k, v in self.config["skills"].items() if not isinstance(k, str) or not isinstance(v, str))
        if bad:
            raise ParamError(self.name, f"skills must map names to note texts; bad entries: {bad}")
        if self.config["top_k"] < 1:
            raise ParamError(self.name, f"top_k must be >= 1, got {self.config['top_k']}")

    def provided_tools(self) -> list[ToolSpec]:
        names = ", ".join(sorted(self.config["skills"])) or "none yet"
        desc = f"Retrieve a procedural note (how to solve a kind of task) by skill name or keywords. Skills: {names}."
        return [ToolSpec(SKILL_TOOL, desc, _QUERY, provider=self.name)]

    def process(self, event: TaskStartEvent) -> TaskStartEvent:
        for spec in self.provided_tools():
            event.state.available_tools[spec.name] = spec
        return event

    def lookup(self, query: str) -> list[str]:
        """Names of the notes a query retrieves, best first."""
        skills: dict[str, str] = self.config["skills"]
        key = query.strip().lower().replace(" ", "_")
        if key in skills:
            return [key]
        q = _words(query)
        bags = {n: (_words(n), _words(doc)) for n, doc in skills.items()}
        df = Counter(w for name_words, doc_words in bags.values() for w in name_words | doc_words)
        weight = {w: math.log(1 + len(skills) / df[w]) for w in q if w in df}  # rarer words count more
        scores = {n: sum(2 * weight[w] for w in q & nw) + sum(weight[w] for w in q & dw)
                  for n, (nw, dw) in bags.items()}
        ranked = sorted((n for n, s in scores.items() if s > 0), key=lambda n: (-scores[n], n))
        return ranked[: self.config["top_k"]]

    def call_tool(self, call_name: str, arguments: dict[str, Any], timeout_s: float) -> ToolResult:
        if call_name != SKILL_TOOL:
            return super().call_tool(call_name, arguments, timeout_s)
        query = arguments.get("query")
        if not isinstance(query, str):
            return ToolResult("", error=f"{SKILL_TOOL} needs a string argument 'query'")
        skills: dict[str, str] = self.config["skills"]
        found = self.lookup(query)
        if not found:
            return ToolResult(f"No skill matches {query!r}. Skills: {', '.join(sorted(skills)) or 'none'}.")
        return ToolResult("\n\n".join(f"Skill {n}:\n{skills[n]}" for n in found))
