"""The rule meta-agent: an offline, deterministic Planner built on a catalogue of typed edits.

It exists so AEGIS runs (and is tested) without any LLM: every failure cause of the taxonomy
(``coevo.evolution.types.CAUSES``) maps to an ordered list of edit templates drawn only from the
built-in processor library. The order encodes what is known to move a small model: on
SmolLM2-135M one worked demonstration of the answer format lifted 2-term arithmetic from 0/24 to
7/24 where instructions alone did nothing (DESIGN §5), so context and answer-format edits come
first and heavier machinery (verification passes, extra tools) last. The one piece of evidence
the order reads is the cluster's excerpts: when they show answers stated in prose, reading the
last number comes first (``template_order``).

Templates read the harness before proposing: they never insert a processor that is already
there, and they set parameters only on processors that are present (found by kind, addressed by
instance name). Every draft is applied to the harness before it is returned, so a proposal from
this agent always builds.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from coevo.evolution.meta_agent import Demo, PlanContext, TokenLedger, as_demo
from coevo.evolution.types import CAUSES, IMPLICATED, Cluster, Digest, Proposal
from coevo.harness.edits import Edit, apply_edit
from coevo.harness.errors import CompositionError
from coevo.harness.events import Message
from coevo.harness.harness import Harness
from coevo.harness.library import (
    AnswerExtraction,
    FewShotDemos,
    LoopDetection,
    ParseRetry,
    PythonExecutor,
    SelfVerification,
    SlidingWindowMemory,
    SummaryMemory,
    TemperatureSchedule,
    ToolChoice,
    ToolRegistry,
    ToolSchemaHint,
    ToolWhitelist,
    processor_class,
)
from coevo.harness.library.context import split_demos
from coevo.harness.processor import Processor

FORMAT_PROMPT = (
    "You are a careful problem solver working on {env} tasks. Think briefly, step by step.\n"
    "To use a tool, reply with exactly\n"
    '<tool_call>{"name": "TOOL_NAME", "arguments": {"ARGUMENT": "VALUE"}}</tool_call>\n'
    "and wait for its result.\n"
    "When you know the final answer, reply with exactly <answer>ANSWER</answer>, where ANSWER is only "
    "the final value, and write nothing after it."
)
"""The clearer system prompt: both output formats spelled out literally. No example values, so
it can never quote a task's answer."""

CLEAR_TOOL_HINT = (
    "Tools you can call:\n{tools}\n"
    "To call a tool, reply with exactly\n"
    '<tool_call>{"name": "TOOL_NAME", "arguments": {...}}</tool_call>\n'
    "where the arguments are a JSON object with double-quoted keys that gives every argument the "
    "tool's schema lists. Call one tool per reply and wait for its result before answering with "
    "<answer>...</answer>."
)

MAX_PARSE_RETRIES = 3
MAX_STEPS = 32
MAX_NEW_TOKENS = 1024
MAX_TOOL_TIMEOUT_S = 120.0
MAX_PYTHON_TIMEOUT_S = 60.0

Draft = tuple[str, list[Edit]]
"""What a template returns: the hypothesis and the edits that test it."""


@dataclass(frozen=True)
class Template:
    """One catalogue entry. ``kinds`` are the processor kinds its edits touch: they identify which
    template a proposal came from (for ``revise``) and the first one gives the proposal's dimension."""

    name: str
    kinds: tuple[str, ...]
    build: Callable[[Cluster, Harness, PlanContext], Draft | None]

    def made(self, kinds: set[str]) -> bool:
        """Whether a proposal touching processor ``kinds`` can come from this template: it touches
        the template's first kind and no kind outside the template's (a template may leave its
        later kinds out, e.g. ``tool_choice`` adds demonstrations only where some are missing)."""
        return self.kinds[0] in kinds and kinds <= set(self.kinds)

    @property
    def dimension(self) -> str:
        return processor_class(self.kinds[0]).dimension.value


# ---------------------------------------------------------------------------------------- helpers
def find_kind(harness: Harness, kind: str) -> Processor | None:
    """The first processor of ``kind`` in firing order, or None."""
    return next((p for p in harness if p.kind == kind), None)


def _fresh_name(harness: Harness, kind: str) -> str:
    name, k = kind, 2
    while name in harness:
        name, k = f"{kind}_{k}", k + 1
    return name


def insert_edit(harness: Harness, processor: Processor) -> Edit | None:
    """An insert of ``processor`` at the latest position of its hook that the algebra accepts.

    Trying positions from the end backwards respects ``runs_after`` and event-type constraints
    without restating them here (e.g. ``python_executor`` must precede ``tool_registry``).
    Returns None when no position works (a singleton conflict, say)."""
    for index in range(len(harness.at(processor.hook)), -1, -1):
        try:
            harness.insert(processor, index=index)
        except CompositionError:
            continue
        return Edit("insert", processor.name, spec=processor.spec(), index=index)
    return None


def set_edit(harness: Harness, kind: str, param: str, value: object) -> Edit | None:
    """A set_param on the present processor of ``kind``, or None when absent or already ``value``."""
    p = find_kind(harness, kind)
    if p is None or p.config[param] == value:
        return None
    return Edit("set_param", p.name, param=param, value=value)


def applies(harness: Harness, edits: list[Edit]) -> bool:
    """Whether ``edits`` apply in order and change the harness."""
    current = harness
    try:
        for e in edits:
            current = apply_edit(current, e)
    except (CompositionError, ValueError, TypeError):
        return False
    return bool(edits) and current.id != harness.id


def flatten(demos: list[Demo]) -> list[Message]:
    """Demonstrations as one ``few_shot`` ``turns`` list."""
    return [dict(turn) for demo in demos for turn in demo]


def _n_tasks(cluster: Cluster) -> str:
    return f"{cluster.count} failed traces on {len(cluster.task_ids)} tasks ({cluster.cause})"


# -------------------------------------------------------------------------------------- templates
def _demo_draft(demos: list[Demo], why: str, harness: Harness) -> Draft | None:
    """``demos`` in the ``turns`` of a ``few_shot`` processor: inserted, or appended to the present
    one (demonstrations it already shows are not repeated); None when nothing would be new."""
    if not demos:
        return None
    present = find_kind(harness, "few_shot")
    if present is None:
        edit = insert_edit(harness, FewShotDemos(name=_fresh_name(harness, "few_shot"), turns=flatten(demos)))
        return (why, [edit]) if edit else None
    have = split_demos(list(present.config["turns"]))
    shown = have + [as_demo(p) for p in zip(present.config["demos"][::2], present.config["demos"][1::2])]
    new = [d for d in demos if d not in shown]
    if not new:
        return None
    return why, [Edit("set_param", present.name, param="turns", value=flatten(have + new))]


def _few_shot_demos(cluster: Cluster, harness: Harness, context: PlanContext) -> Draft | None:
    """Worked demonstrations in the runtime's turn structure (task, tool call, tool result turn,
    answer), in the ``turns`` of a ``few_shot`` processor: inserted, or appended to the present one."""
    why = (f"{_n_tasks(cluster)}: a worked demonstration of the expected reply shows a small model the "
           "answer and tool-call format better than any instruction")
    return _demo_draft(list(context.demos), why, harness)


def demo_tools(demo: Demo) -> set[str]:
    """Tools whose result a demonstration shows (its ``tool`` turns)."""
    return {str(t.get("name", "")) for t in demo if t.get("role") == "tool"}


def tool_path_demos(context: PlanContext) -> list[Demo]:
    """The context's demonstrations that call a tool (``PlanContext`` holds them as ``Demo`` already)."""
    return [d for d in context.demos if demo_tools(d)]


def _tool_demos(cluster: Cluster, harness: Harness, context: PlanContext) -> Draft | None:
    """Only the demonstrations that call a tool (the call, the tool's result turn, the answer).
    The evidence: the traces answered without a tool that genuine solutions use
    (``premature_answer``: the reference or the task's capabilities name it), and references show
    the tool path. On the reasoning env SmolLM2 passed 12 of 15 episodes where it called the
    calculator and ~5% where it guessed (issue 12), so showing the call is the edit that can move
    the most tasks; an instruction to verify (the catalogue's next entry) cannot supply arithmetic
    the model lacks."""
    with_tools = tool_path_demos(context)
    tools = ", ".join(sorted(set().union(*map(demo_tools, with_tools))))
    why = (f"{_n_tasks(cluster)}: the traces answered without the tool genuine solutions use; worked "
           f"demonstrations of the call ({tools}), its result turn and the answer show the model the tool path")
    return _demo_draft(with_tools, why, harness)


def forced_tool(context: PlanContext) -> str:
    """The tool ``tool_choice`` should force: the one the demonstrations call (when they call
    exactly one offered tool), else the environment's only tool, else "" (any tool)."""
    offered = set(context.tools)
    shown = set().union(*map(demo_tools, context.demos)) - {""}
    if offered:
        shown &= offered
    if shown:
        return next(iter(shown)) if len(shown) == 1 else ""
    return context.tools[0] if len(offered) == 1 else ""


def _tool_choice(cluster: Cluster, harness: Harness, context: PlanContext) -> Draft | None:
    """Force the first reply to open a tool call (``tool_choice``), as ``tool_choice="required"``
    or a named tool does in a chat API, and show the tool path (the demonstrations that call a
    tool, where the harness does not show them yet). The evidence: the traces answered without the
    tool genuine solutions use. Measured on SmolLM2-135M (40 validation tasks x 2 attempts of the
    reasoning env, lenient harness; docs/RESULTS.md): pass@1 0.088 as is; demonstrations alone
    0.075-0.100 (3-4 tool calls in 80 episodes: the model imitated their final answer turn); the
    forced call alone 0.188 (76 calls); both together 0.525 (80 calls). Only the first call is
    forced, so the model answers from the result."""
    if any(p.group == ToolChoice.group for p in harness):
        return None
    tool = forced_tool(context)
    registry = find_kind(harness, "tool_registry")
    enabled = registry.config["enabled"] if registry is not None else ["*"]
    if tool and "*" not in enabled and tool not in enabled:
        return None  # forcing a disabled tool does nothing; enabling it is another template's edit
    edit = insert_edit(harness, ToolChoice(name=_fresh_name(harness, "tool_choice"), tool=tool))
    if edit is None:
        return None
    target = f"the {tool} tool" if tool else "a tool"
    why = (f"{_n_tasks(cluster)}: the traces answered without the tool genuine solutions use, and demonstrations "
           f"alone do not make a small model call it; prefill the first reply with the opening of a call to "
           f"{target} (as tool_choice=required does), so the model writes the arguments and answers from the result")
    shown = _demo_draft(tool_path_demos(context), why,
                        apply_edit(harness, edit))
    if shown is None:
        return why, [edit]
    return why + ", with worked demonstrations of that path", [edit, *shown[1]]


def _format_system_prompt(cluster: Cluster, harness: Harness, context: PlanContext) -> Draft | None:
    template = FORMAT_PROMPT
    if context.tools:
        template += "\nTools you can call: " + ", ".join(sorted(context.tools)) + "."
    edit = set_edit(harness, "system_prompt", "template", template)
    why = f"{_n_tasks(cluster)}: a system prompt stating the exact <answer> and <tool_call> formats"
    return (why, [edit]) if edit else None


def _last_number_fallback(cluster: Cluster, harness: Harness, context: PlanContext) -> Draft | None:
    why = f"{_n_tasks(cluster)}: replies state their number outside answer tags; take the last number"
    if find_kind(harness, "answer_extraction") is None:
        edit = insert_edit(harness, AnswerExtraction(last_number_fallback=True))
    else:
        edit = set_edit(harness, "answer_extraction", "last_number_fallback", True)
    return (why, [edit]) if edit else None


def _parse_retry_up(cluster: Cluster, harness: Harness, context: PlanContext) -> Draft | None:
    why = f"{_n_tasks(cluster)}: another format reminder gives the model a second chance at a parseable reply"
    present = find_kind(harness, "parse_retry")
    if present is None:
        edit = insert_edit(harness, ParseRetry(name=_fresh_name(harness, "parse_retry"), max_retries=2))
    elif present.config["max_retries"] >= MAX_PARSE_RETRIES:
        edit = None
    else:
        edit = set_edit(harness, "parse_retry", "max_retries", present.config["max_retries"] + 1)
    return (why, [edit]) if edit else None


def _lenient_parser(cluster: Cluster, harness: Harness, context: PlanContext) -> Draft | None:
    edit = set_edit(harness, "json_tool_parser", "lenient", True)
    why = f"{_n_tasks(cluster)}: accept bare JSON tool calls the model writes without <tool_call> tags"
    return (why, [edit]) if edit else None


def _self_verification(cluster: Cluster, harness: Harness, context: PlanContext) -> Draft | None:
    if find_kind(harness, "self_verification") is not None:
        return None
    edit = insert_edit(harness, SelfVerification(name=_fresh_name(harness, "self_verification")))
    why = f"{_n_tasks(cluster)}: asking the model to check its first answer once catches slips before submitting"
    return (why, [edit]) if edit else None


def _python_executor(cluster: Cluster, harness: Harness, context: PlanContext) -> Draft | None:
    if find_kind(harness, "python_executor") is not None:
        return None
    edit = insert_edit(harness, PythonExecutor(name=_fresh_name(harness, "python_executor")))
    why = f"{_n_tasks(cluster)}: a python tool lets the model compute instead of guessing"
    return (why, [edit]) if edit else None


def _clear_tool_hint(cluster: Cluster, harness: Harness, context: PlanContext) -> Draft | None:
    why = f"{_n_tasks(cluster)}: spell out the tool-call format and that every schema argument is required"
    if find_kind(harness, "tool_schema_hint") is None:
        edit = insert_edit(harness, ToolSchemaHint(name=_fresh_name(harness, "tool_schema_hint"),
                                                   template=CLEAR_TOOL_HINT))
    else:
        edit = set_edit(harness, "tool_schema_hint", "template", CLEAR_TOOL_HINT)
    return (why, [edit]) if edit else None


def _enable_all_tools(cluster: Cluster, harness: Harness, context: PlanContext) -> Draft | None:
    why = f"{_n_tasks(cluster)}: the tasks need a tool the registry leaves disabled; enable every offered tool"
    if find_kind(harness, "tool_registry") is None:
        edit = insert_edit(harness, ToolRegistry(enabled=["*"]))
    else:
        edit = set_edit(harness, "tool_registry", "enabled", ["*"])
    return (why, [edit]) if edit else None


def _tool_whitelist(cluster: Cluster, harness: Harness, context: PlanContext) -> Draft | None:
    if find_kind(harness, "tool_whitelist") is not None:
        return None
    # An empty list means "the enabled tools", so harness-provided tools stay allowed.
    edit = insert_edit(harness, ToolWhitelist(name=_fresh_name(harness, "tool_whitelist"), allowed=[]))
    why = f"{_n_tasks(cluster)}: answer calls to unknown tools with the list of real ones instead of an error"
    return (why, [edit]) if edit else None


def _loop_warn(cluster: Cluster, harness: Harness, context: PlanContext) -> Draft | None:
    why = f"{_n_tasks(cluster)}: warn the model that it repeats itself instead of ending the episode"
    if find_kind(harness, "loop_detection") is None:
        edit = insert_edit(harness, LoopDetection(action="warn"))
    else:
        edit = set_edit(harness, "loop_detection", "action", "warn")
    return (why, [edit]) if edit else None


def _temperature_schedule(cluster: Cluster, harness: Harness, context: PlanContext) -> Draft | None:
    if find_kind(harness, "temperature_schedule") is not None:
        return None
    edit = insert_edit(harness, TemperatureSchedule(name=_fresh_name(harness, "temperature_schedule")))
    why = f"{_n_tasks(cluster)}: raise the temperature after failed replies so a stuck model tries something else"
    return (why, [edit]) if edit else None


def _step_budget_up(cluster: Cluster, harness: Harness, context: PlanContext) -> Draft | None:
    present = find_kind(harness, "step_budget")
    if present is None:
        return None
    current = present.config["max_steps"]
    edit = set_edit(harness, "step_budget", "max_steps", min(MAX_STEPS, current + max(2, current // 2)))
    why = f"{_n_tasks(cluster)}: episodes were cut by the step budget of {current}; allow more steps"
    return (why, [edit]) if edit else None


def _max_new_tokens_up(cluster: Cluster, harness: Harness, context: PlanContext) -> Draft | None:
    present = find_kind(harness, "sampling")
    if present is None:
        return None
    current = present.config["max_new_tokens"]
    edit = set_edit(harness, "sampling", "max_new_tokens", min(MAX_NEW_TOKENS, 2 * current))
    why = f"{_n_tasks(cluster)}: completions were cut at {current} tokens; double the completion budget"
    return (why, [edit]) if edit else None


def _memory(kind: str, cls: type[Processor]) -> Callable[[Cluster, Harness, PlanContext], Draft | None]:
    def build(cluster: Cluster, harness: Harness, context: PlanContext) -> Draft | None:
        if any(p.group == "context_window" for p in harness):
            return None
        edit = insert_edit(harness, cls(name=_fresh_name(harness, kind)))
        why = f"{_n_tasks(cluster)}: the context grew too long; show the model a shorter view of older steps"
        return (why, [edit]) if edit else None

    return build


def _tool_timeout_up(cluster: Cluster, harness: Harness, context: PlanContext) -> Draft | None:
    present = find_kind(harness, "tool_timeout")
    if present is None:
        return None
    current = present.config["default_s"]
    edit = set_edit(harness, "tool_timeout", "default_s", min(MAX_TOOL_TIMEOUT_S, 2 * current))
    why = f"{_n_tasks(cluster)}: tool calls hit the {current:g}s limit; give tools more time"
    return (why, [edit]) if edit else None


def _python_timeout_up(cluster: Cluster, harness: Harness, context: PlanContext) -> Draft | None:
    present = find_kind(harness, "python_executor")
    if present is None:
        return None
    current = present.config["timeout_s"]
    edit = set_edit(harness, "python_executor", "timeout_s", min(MAX_PYTHON_TIMEOUT_S, 2 * current))
    why = f"{_n_tasks(cluster)}: python runs hit the {current:g}s limit; give them more time"
    return (why, [edit]) if edit else None


TEMPLATES: dict[str, Template] = {
    "few_shot_demos": Template("few_shot_demos", ("few_shot",), _few_shot_demos),
    "tool_demos": Template("tool_demos", ("few_shot",), _tool_demos),
    "tool_choice": Template("tool_choice", ("tool_choice", "few_shot"), _tool_choice),
    "format_system_prompt": Template("format_system_prompt", ("system_prompt",), _format_system_prompt),
    "last_number_fallback": Template("last_number_fallback", ("answer_extraction",), _last_number_fallback),
    "parse_retry_up": Template("parse_retry_up", ("parse_retry",), _parse_retry_up),
    "lenient_parser": Template("lenient_parser", ("json_tool_parser",), _lenient_parser),
    "self_verification": Template("self_verification", ("self_verification",), _self_verification),
    "python_executor": Template("python_executor", ("python_executor",), _python_executor),
    "clear_tool_hint": Template("clear_tool_hint", ("tool_schema_hint",), _clear_tool_hint),
    "enable_all_tools": Template("enable_all_tools", ("tool_registry",), _enable_all_tools),
    "tool_whitelist": Template("tool_whitelist", ("tool_whitelist",), _tool_whitelist),
    "loop_warn": Template("loop_warn", ("loop_detection",), _loop_warn),
    "temperature_schedule": Template("temperature_schedule", ("temperature_schedule",), _temperature_schedule),
    "step_budget_up": Template("step_budget_up", ("step_budget",), _step_budget_up),
    "max_new_tokens_up": Template("max_new_tokens_up", ("sampling",), _max_new_tokens_up),
    "summary_memory": Template("summary_memory", ("summary_memory",), _memory("summary_memory", SummaryMemory)),
    "sliding_window": Template("sliding_window", ("sliding_window",), _memory("sliding_window", SlidingWindowMemory)),
    "tool_timeout_up": Template("tool_timeout_up", ("tool_timeout",), _tool_timeout_up),
    "python_timeout_up": Template("python_timeout_up", ("python_executor",), _python_timeout_up),
}

CATALOGUE: dict[str, tuple[str, ...]] = {
    "format_error": ("few_shot_demos", "format_system_prompt", "last_number_fallback", "parse_retry_up",
                     "lenient_parser"),
    "wrong_answer": ("few_shot_demos", "format_system_prompt", "last_number_fallback", "parse_retry_up",
                     "lenient_parser", "self_verification", "python_executor"),
    "tool_misuse": ("clear_tool_hint", "few_shot_demos", "lenient_parser"),
    "missing_tool": ("enable_all_tools", "python_executor"),
    "wrong_tool": ("tool_whitelist", "clear_tool_hint"),
    "loop": ("loop_warn", "temperature_schedule"),
    "step_budget": ("step_budget_up",),
    "premature_answer": ("tool_choice", "tool_demos", "self_verification", "format_system_prompt"),
    "context_overflow": ("max_new_tokens_up", "summary_memory", "sliding_window"),
    "env_error": ("tool_timeout_up", "python_timeout_up"),
}
"""cause → template names, most promising first."""
assert set(CATALOGUE) == set(CAUSES)
assert all(name in TEMPLATES for names in CATALOGUE.values() for name in names)

STATED_NUMBER = re.compile(r"(?:=|\bis|\bequals|:)\s*-?\d+(?:\.\d+)?(?![\w.]*\w)", re.IGNORECASE)
"""A value stated in prose: ``The answer is 10.``, ``6 + 1 = 7`` (not ``compute 3 + 4``, ``version 3.1.x``)."""


def states_numbers(cluster: Cluster) -> bool:
    """Whether at least half of a cluster's excerpts state a number outside answer tags: the model
    answered in prose, so reading that number is the edit most likely to flip the cluster."""
    hits = sum("<answer>" not in e and STATED_NUMBER.search(e) is not None for e in cluster.excerpts)
    return bool(cluster.excerpts) and 2 * hits >= len(cluster.excerpts)


def template_order(cluster: Cluster, catalogue: Mapping[str, tuple[str, ...]] = CATALOGUE) -> tuple[str, ...]:
    """The cluster's catalogue entry, with ``last_number_fallback`` moved first when the excerpts
    show prose answers (``states_numbers``). On SmolLM2-135M most format errors on arithmetic are
    ``The answer is 9.``: a demonstration helps a few tasks, reading the number helps most."""
    names = catalogue.get(cluster.cause, ())
    if "last_number_fallback" in names and states_numbers(cluster):
        return ("last_number_fallback", *(n for n in names if n != "last_number_fallback"))
    return names


# ------------------------------------------------------------------------------------- ordering
def order_clusters(clusters: list[Cluster], priorities: dict[str, float]) -> list[Cluster]:
    """Clusters by severity × the priority of the dimension they implicate (default 1.0),
    highest first; ties by cause name, so the order never depends on the digest's."""
    def weight(c: Cluster) -> float:
        return c.severity * priorities.get(c.component.dimension, 1.0)

    return sorted(clusters, key=lambda c: (-weight(c), c.cause))


def touched_kinds(proposal: Proposal, harness: Harness) -> set[str]:
    """Processor kinds a proposal's edits touch (insert/replace: the new spec's kind; set_param and
    remove: the kind of the named processor when present)."""
    kinds = set()
    for e in proposal.edits:
        if e.spec is not None and "kind" in e.spec:
            kinds.add(str(e.spec["kind"]))
        elif e.processor in harness:
            kinds.add(harness.get(e.processor).kind)
    return kinds


# ------------------------------------------------------------------------------------ revisions
LEAKED_LINE = re.compile(r"^\s*leaked\s*:\s*(.+)$", re.IGNORECASE | re.MULTILINE)
QUOTED = re.compile(r"'([^']+)'|\"([^\"]+)\"")


def leaked_strings(reason: str) -> list[str]:
    """The offending strings a Critic's reason names: the ``leaked: a | b`` line the engine appends
    (from ``QualityReport.leaked``), else any quoted strings."""
    found = [s.strip() for m in LEAKED_LINE.finditer(reason) for s in m.group(1).split(" | ")]
    if not found:
        found = [a or b for a, b in QUOTED.findall(reason)]
    return [s for s in found if s]


def quotes(text: str, leaked: str) -> bool:
    """Whether ``text`` contains ``leaked`` as a whole token (not inside a longer word or number),
    so a leaked answer ``4`` flags ``<answer>4</answer>`` but not ``42``."""
    pattern = r"(?<![A-Za-z0-9_.])" + re.escape(leaked) + r"(?![A-Za-z0-9_])"
    return re.search(pattern, text) is not None


def _is_demo_edit(e: Edit) -> bool:
    """An edit of this agent that carries demonstrations (a ``few_shot`` insert, or its ``turns``)."""
    if e.op in ("insert", "replace"):
        return (e.spec or {}).get("kind") == "few_shot"
    return e.op == "set_param" and e.param == "turns"


def _with_demos(e: Edit, demos: list[Demo]) -> Edit:
    flat = flatten(demos)
    if e.op == "set_param":
        return replace(e, value=flat)
    spec = dict(e.spec or {})
    spec["params"] = {**(spec.get("params") or {}), "turns": flat}
    return replace(e, spec=spec)


def _demos_of(e: Edit) -> list[Demo]:
    turns = e.value if e.op == "set_param" else (e.spec or {}).get("params", {}).get("turns", [])
    return split_demos(list(turns or []))


# ----------------------------------------------------------------------------------------- agent
class RuleMetaAgent:
    """The ``rule`` backend: catalogue templates in a fixed order, no model, no randomness.

    ``propose`` is a function of (digest, harness, context) alone. ``revise`` also skips drafts
    this agent has already proposed for the variant (``self.tried``): the engine copies
    ``context.rejected`` at the start of a round, so a proposal rejected a moment ago is not in it.

    ``templates`` and ``catalogue`` default to ``TEMPLATES`` and ``CATALOGUE``; pass extended copies
    to let the agent propose processors of your own (docs/processors.md), e.g. ``RuleMetaAgent(templates=
    {**TEMPLATES, "mine": t}, catalogue={**CATALOGUE, "loop": ("mine", *CATALOGUE["loop"])})``.
    A catalogue may leave causes out (nothing is proposed for them); every name it lists must be a template.
    """

    name = "rule"

    def __init__(self, templates: Mapping[str, Template] | None = None,
                 catalogue: Mapping[str, tuple[str, ...]] | None = None) -> None:
        self.templates: Mapping[str, Template] = TEMPLATES if templates is None else dict(templates)
        self.catalogue: Mapping[str, tuple[str, ...]] = CATALOGUE if catalogue is None else dict(catalogue)
        unknown_causes = sorted(set(self.catalogue) - set(CAUSES))
        if unknown_causes:
            raise ValueError(f"catalogue causes {unknown_causes} are not failure causes; use those of {list(CAUSES)}")
        missing = sorted({n for names in self.catalogue.values() for n in names} - set(self.templates))
        if missing:
            raise ValueError(f"catalogue names templates {missing} that are not in templates; add them, or use "
                             f"one of {sorted(self.templates)}")
        self.ledger = TokenLedger()
        self.tried: dict[str, set[str]] = {}

    def state_dict(self) -> dict[str, Any]:
        return {"ledger": self.ledger.as_dict(), "tried": {v: sorted(keys) for v, keys in self.tried.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.ledger.load(state["ledger"])
        self.tried = {v: set(keys) for v, keys in state["tried"].items()}

    # ------------------------------------------------------------------ planning
    def _proposal(self, template: Template, draft: Draft, cluster: Cluster, digest: Digest,
                  context: PlanContext) -> Proposal:
        hypothesis, edits = draft
        return Proposal(
            hypothesis=hypothesis,
            edits=edits,
            dimension=template.dimension,
            cluster=cluster.cause,
            target_tasks=list(cluster.task_ids),
            predicted_flips=list(cluster.task_ids),
            at_risk=list(digest.passed_task_ids),
            variant=context.variant,
            source=self.name,
        )

    def _drafts(self, cluster: Cluster, digest: Digest, harness: Harness, context: PlanContext,
                names: tuple[str, ...]) -> list[Proposal]:
        """Proposals from ``names`` (in order) that build and were not rejected."""
        out = []
        for name in names:
            template = self.templates[name]
            draft = template.build(cluster, harness, context)
            if draft is None or not applies(harness, draft[1]):
                continue
            proposal = self._proposal(template, draft, cluster, digest, context)
            if proposal.key() not in context.rejected:
                out.append(proposal)
        return out

    def propose(self, digest: Digest, harness: Harness, context: PlanContext) -> list[Proposal]:
        """Round-robin over the ordered clusters: each cluster's first usable template, then each
        one's next, ... until ``context.max_proposals``. An edit already taken for one cluster is
        passed over for the next one of the same cluster (format_error and wrong_answer share
        templates), so every cluster in a round gets a distinct proposal while any are left."""
        if context.max_proposals < 0:
            raise ValueError(f"max_proposals must be >= 0, got {context.max_proposals}")
        self.ledger.record("plan")
        queues = [self._drafts(c, digest, harness, context, template_order(c, self.catalogue))
                  for c in order_clusters(digest.clusters, context.priorities) if c.cause in self.catalogue]
        chosen: list[Proposal] = []
        seen: set[str] = set()
        while len(chosen) < context.max_proposals and any(queues):
            for queue in queues:
                while queue and queue[0].key() in seen:
                    queue.pop(0)
                if queue and len(chosen) < context.max_proposals:
                    seen.add(queue[0].key())
                    chosen.append(queue.pop(0))
        self.tried.setdefault(context.variant, set()).update(seen)
        return chosen

    # ------------------------------------------------------------------ revising
    def revise(self, proposal: Proposal, reason: str, digest: Digest, harness: Harness,
               context: PlanContext) -> Proposal | None:
        """Leakage: drop the demonstrations that quote a leaked string, keep the rest. Bloat: keep
        one demonstration. Anything else (or when that is impossible): the next template of the
        same cluster not yet tried. None when nothing is left."""
        self.ledger.record("revise")
        tried = self.tried.setdefault(context.variant, set())
        tried.add(proposal.key())
        revised = self._trim_demos(proposal, reason, harness, context)
        if revised is None:
            revised = self._next_template(proposal, digest, harness, context)
        if revised is not None:
            tried.add(revised.key())
        return revised

    def _trim_demos(self, proposal: Proposal, reason: str, harness: Harness, context: PlanContext) -> Proposal | None:
        if not any(_is_demo_edit(e) for e in proposal.edits):
            return None
        leaked = leaked_strings(reason) if re.search(r"leak", reason, re.IGNORECASE) else []
        if leaked:
            def keep(demos: list[Demo]) -> list[Demo]:
                return [d for d in demos
                        if not any(quotes(str(t.get("content", "")), s) for t in d for s in leaked)]
            note = "dropped the demonstrations that quoted leaked text"
        elif re.search(r"bloat", reason, re.IGNORECASE):
            def keep(demos: list[Demo]) -> list[Demo]:
                return demos[:1]
            note = "kept one demonstration to stay within the prompt budget"
        else:
            return None
        edits = []
        for e in proposal.edits:
            if _is_demo_edit(e):
                before = _demos_of(e)
                after = keep(before)
                if not after or after == before:
                    return None
                e = _with_demos(e, after)
            edits.append(e)
        revised = replace(proposal, edits=edits, hypothesis=f"{proposal.hypothesis} (revised: {note})",
                          revision=proposal.revision + 1, source=self.name)
        if not applies(harness, edits) or revised.key() in context.rejected:
            return None
        return revised

    def _next_template(self, proposal: Proposal, digest: Digest, harness: Harness,
                       context: PlanContext) -> Proposal | None:
        cause = proposal.cluster
        if cause not in self.catalogue:
            return None
        cluster = digest.cluster(cause) or Cluster(
            cause=cause, component=IMPLICATED[cause], count=len(proposal.target_tasks), severity=0.0,
            task_ids=list(proposal.target_tasks), trace_ids=[], excerpts=[],
        )
        names = template_order(cluster, self.catalogue)
        kinds = touched_kinds(proposal, harness)
        start = next((i + 1 for i, n in enumerate(names) if self.templates[n].made(kinds)), 0)
        tried = self.tried.get(context.variant, set())
        for candidate in self._drafts(cluster, digest, harness, context, names[start:]):
            if candidate.key() not in tried and candidate.key() != proposal.key():
                return replace(candidate, revision=proposal.revision + 1)
        return None
