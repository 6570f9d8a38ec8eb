"""The rule meta-agent's catalogue: one edit template per idea, and ``CATALOGUE``, the ordered
templates for each failure cause of the taxonomy (``coevo.evolution.types.CAUSES``), drawn only
from the built-in processor library.

The order encodes what is known to move a small model: on SmolLM2-135M one worked demonstration
of the answer format lifted 2-term arithmetic from 0/24 to 7/24 where instructions alone did
nothing, so context and answer-format edits come first and heavier machinery
(verification passes, extra tools) last. The one piece of evidence the order reads is the
cluster's excerpts: when they show answers stated in prose, reading the last number comes first
(``template_order``).

Templates read the harness before proposing: they never insert a processor that is already
there, and they set parameters only on processors that are present (found by kind, addressed by
instance name). They are written with the helpers of ``coevo.meta.drafts``; the agent that runs
them is ``coevo.meta.rule.RuleMetaAgent``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

from coevo.evolution.meta_agent import Demo, PlanContext
from coevo.evolution.types import CAUSES
from coevo.harness.edits import Edit, apply_edit
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
    SystemPrompt,
    TemperatureSchedule,
    ToolChoice,
    ToolRegistry,
    ToolSchemaHint,
    ToolWhitelist,
)
from coevo.harness.library.context import pair_demo, split_demos
from coevo.harness.processor import Processor
from coevo.meta.drafts import Draft, Template, find_kind, flatten, fresh_name, insert_edit, set_edit
from coevo.rundir.evolve_records import Cluster

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
        edit = insert_edit(harness, FewShotDemos(name=fresh_name(harness, "few_shot"), turns=flatten(demos)))
        return (why, [edit]) if edit else None
    have = split_demos(list(present.config["turns"]))
    pairs = present.config["demos"]  # the processor's (question, reply) texts, flattened
    shown = have + [pair_demo(str(q), str(a)) for q, a in zip(pairs[::2], pairs[1::2], strict=True)]
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
    calculator and ~5% where it guessed, so showing the call is the edit that can move
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
    edit = insert_edit(harness, ToolChoice(name=fresh_name(harness, "tool_choice"), tool=tool))
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
    present = find_kind(harness, "system_prompt")  # absent from a program's harness: the program wrote its own
    edit = (set_edit(harness, "system_prompt", "template", template) if present
            else insert_edit(harness, SystemPrompt(template=template)))
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
        edit = insert_edit(harness, ParseRetry(name=fresh_name(harness, "parse_retry"), max_retries=2))
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
    edit = insert_edit(harness, SelfVerification(name=fresh_name(harness, "self_verification")))
    why = f"{_n_tasks(cluster)}: asking the model to check its first answer once catches slips before submitting"
    return (why, [edit]) if edit else None


def _python_executor(cluster: Cluster, harness: Harness, context: PlanContext) -> Draft | None:
    if find_kind(harness, "python_executor") is not None:
        return None
    edit = insert_edit(harness, PythonExecutor(name=fresh_name(harness, "python_executor")))
    why = f"{_n_tasks(cluster)}: a python tool lets the model compute instead of guessing"
    return (why, [edit]) if edit else None


def _clear_tool_hint(cluster: Cluster, harness: Harness, context: PlanContext) -> Draft | None:
    why = f"{_n_tasks(cluster)}: spell out the tool-call format and that every schema argument is required"
    if find_kind(harness, "tool_schema_hint") is None:
        edit = insert_edit(harness, ToolSchemaHint(name=fresh_name(harness, "tool_schema_hint"),
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
    edit = insert_edit(harness, ToolWhitelist(name=fresh_name(harness, "tool_whitelist"), allowed=[]))
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
    edit = insert_edit(harness, TemperatureSchedule(name=fresh_name(harness, "temperature_schedule")))
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


SPECIALIST_CUT = re.compile(r"specialist '([a-z][a-z0-9_]*)' gave no answer \(stopped: step_cap\)")


def _specialist_budget_up(cluster: Cluster, harness: Harness, context: PlanContext) -> Draft | None:
    """Delegations that came back because the specialist ran out of steps: more steps for it."""
    cut = {m.group(1) for text in cluster.excerpts for m in SPECIALIST_CUT.finditer(text)}
    for p in harness:
        if p.kind == "specialist" and p.config["agent"] in cut and p.config["max_steps"] < MAX_STEPS:
            current = p.config["max_steps"]
            edit = Edit("set_param", p.name, param="max_steps", value=min(MAX_STEPS, current + max(2, current // 2)))
            why = (f"{_n_tasks(cluster)}: the {p.config['agent']} specialist stopped at its step budget of {current} "
                   "before reporting; give its sub-episodes more steps")
            return why, [edit]
    return None


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
        edit = insert_edit(harness, cls(name=fresh_name(harness, kind)))
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
    "specialist_budget_up": Template("specialist_budget_up", ("specialist",), _specialist_budget_up),
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
    "tool_misuse": ("specialist_budget_up", "clear_tool_hint", "few_shot_demos", "lenient_parser"),
    "missing_tool": ("enable_all_tools", "python_executor"),
    "wrong_tool": ("tool_whitelist", "clear_tool_hint"),
    "loop": ("loop_warn", "temperature_schedule"),
    "step_budget": ("step_budget_up",),
    "premature_answer": ("tool_choice", "tool_demos", "self_verification", "format_system_prompt"),
    "truncated": ("max_new_tokens_up", "format_system_prompt"),  # a prompt asking for a brief reply shortens it
    "context_overflow": ("summary_memory", "sliding_window"),
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
