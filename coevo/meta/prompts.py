"""The LLM meta-agent's prompts: the harness and the processor catalogue as text
(``harness_summary``, ``processor_catalogue``), the messages of each stage (``plan_messages``,
``revise_messages``, ``route_messages``) and the follow-up that quotes a failure back to the model
(``follow_up``). Pure functions of the digest, the harness and the context, so a prompt can be
read and tested without a model. ``withhold_secrets`` redacts secret environment values from a
prompt before it is sent (``LLMMetaAgent.call``) and says that a value was withheld.
"""

from __future__ import annotations

import json
from typing import Any

from coevo.evolution.meta_agent import PlanContext
from coevo.harness.harness import Harness
from coevo.harness.hooks import HOOK_ORDER
from coevo.harness.library import PROCESSORS
from coevo.meta.schema import PLAN_SCHEMA, PROPOSAL_SCHEMA, REVISE_SCHEMA, ROUTE_SCHEMA
from coevo.rundir.evolve_records import Digest, Proposal
from coevo.safety.secrets import REDACTED, contains_secret, redact_text, secret_env_values


# -------------------------------------------------------------------------------------- prompts
def harness_summary(harness: Harness) -> str:
    """One line per processor: instance name, kind, hook, dimension, group, every parameter."""
    lines = [f"harness {harness.id} ({len(harness)} processors, in firing order):"]
    for p in harness:
        group = f", group {p.group}" if p.group else ""
        lines.append(f"- {p.name}: kind {p.kind} at {p.hook.value} ({p.dimension.value}{group}); "
                     f"params {json.dumps(dict(p.config), default=str)}")
    return "\n".join(lines)


def processor_catalogue() -> str:
    """Every processor kind a spec may name, with its hook, parameters and what it does."""
    def order(kind: str) -> tuple[int, str]:
        hook = getattr(PROCESSORS[kind], "hook", None)  # CodeProcessor sets its hook per instance, from its source
        return (HOOK_ORDER.index(hook) if hook in HOOK_ORDER else len(HOOK_ORDER), kind)

    lines = []
    for kind in sorted(PROCESSORS, key=order):
        cls = PROCESSORS[kind]
        hook = getattr(cls, "hook", None)  # None for the code kind (see order)
        where = (f"at {hook.value} ({cls.dimension.value})" if hook is not None
                 else "at the hook its base class declares")
        group = f", singleton group {cls.group}" if cls.group else ""
        after = f", runs after {sorted(cls.runs_after)}" if cls.runs_after else ""
        lines.append(f"- {kind} {where}{group}{after}: {cls.description}")
        for p in cls.params:
            choices = f" one of {list(p.choices)}" if p.choices else ""
            lines.append(f"    {p.name} ({p.type}{choices}, default {json.dumps(p.default)}): {p.description}")
    return "\n".join(lines)


def _task_ids(digest: Digest) -> str:
    lines = [f"- {c.cause}: {', '.join(c.task_ids)}" for c in digest.clusters]
    lines.append(f"- passed: {', '.join(digest.passed_task_ids) or '(none)'}")
    return "\n".join(lines)


def _demo_text(turns: list[dict[str, Any]]) -> str:
    """One demonstration, a turn a line: the JSON a ``few_shot`` ``turns`` edit may quote as it is."""
    return "- " + "\n  ".join(json.dumps(t, ensure_ascii=False) for t in turns)


def _context_text(context: PlanContext) -> str:
    demos = "\n".join(_demo_text(d) for d in context.demos)
    lessons = "\n".join(f"- {x}" for x in context.lessons)
    rejected = "\n".join(f"- {k}" for k in sorted(context.rejected))
    return (
        f"variant: {context.variant}, round {context.round}\n"
        f"dimension priorities (default 1.0): {json.dumps(context.priorities, sort_keys=True)}\n"
        f"environment tools: {', '.join(context.tools) or '(none)'}\n"
        f"demonstrations you may quote (from reference trajectories; as few_shot turns, one turn a line):\n"
        f"{demos or '(none)'}\n"
        f"lessons from earlier verdicts:\n{lessons or '(none)'}\n"
        f"rejected edits (do not propose again):\n{rejected or '(none)'}"
    )


EDIT_RULES = (
    "Edits apply in order:\n"
    '- {"op": "insert", "processor": NEW_NAME, "spec": {"kind": KIND, "name": NEW_NAME, "params": {...}}} adds a '
    'processor of a catalogue kind at its hook (optionally "after": EXISTING_NAME or "index": position in the hook);\n'
    '- {"op": "set_param", "processor": EXISTING_NAME, "param": PARAM, "value": VALUE} changes one parameter;\n'
    '- {"op": "replace", "processor": EXISTING_NAME, "spec": {...}} swaps a processor for one at the same hook;\n'
    '- {"op": "remove", "processor": EXISTING_NAME}.\n'
    "Use only catalogue kinds, their parameter names and types; address existing processors by instance name; a "
    "singleton group admits one processor; never repeat a rejected edit; the only task text an edit may quote is "
    "the demonstrations given. On small models one worked demonstration of the answer format moves pass rates "
    "more than any instruction, so context, tool and answer-format edits come first."
)


def _system(role: str, schema: dict[str, Any]) -> dict[str, str]:
    return {"role": "system", "content": f"{role}\n\nReply with one JSON object and nothing else, matching this "
                                         f"JSON schema:\n{json.dumps(schema)}"}


def plan_messages(digest: Digest, harness: Harness, context: PlanContext) -> list[dict[str, str]]:
    role = (
        "You are the Planner of AEGIS, which evolves the harness around a small language-model agent: the "
        "processors that assemble its prompt, parse its replies, run its tools and end its episodes. From a digest "
        "of the last round's failures, propose hypotheses, each tested by typed edits to the harness, with its "
        "scope: the failure cluster it addresses, target_tasks and predicted_flips (failed task ids it should fix) "
        "and at_risk (passed task ids it could break). When the digest says how the model behaves without the "
        "harness's scaffolding (a forced tool-call prefill, demonstrations) and it behaves as the scaffolding forces "
        "it to and passes nearly as often, propose removing the scaffolding (op remove): it costs prompt tokens on "
        "every call.\n" + EDIT_RULES
    )
    user = (
        f"## Digest\n{digest.text()}\n\n## Task ids\n{_task_ids(digest)}\n\n## Harness\n{harness_summary(harness)}\n\n"
        f"## Processor catalogue\n{processor_catalogue()}\n\n## Context\n{_context_text(context)}\n\n"
        f"Propose at most {context.max_proposals} proposal(s), most promising first."
    )
    return [_system(role, PLAN_SCHEMA), {"role": "user", "content": user}]


def revise_messages(proposal: Proposal, reason: str, digest: Digest, harness: Harness,
                    context: PlanContext) -> list[dict[str, str]]:
    role = (
        "You are the reviser of AEGIS. The Critic rejected a proposed harness edit before running it. Answer its "
        'reason with a revised proposal, {"proposal": {...}}, whose edits differ from the rejected ones, or give up '
        'with {"give_up": true} when the idea cannot be saved.\n' + EDIT_RULES
    )
    shown = {k: v for k, v in proposal.to_dict().items() if k in PROPOSAL_SCHEMA["properties"]}
    user = (
        f"## Rejected proposal\n{json.dumps(shown, indent=1, default=str)}\n\n## Critic's reason\n{reason}\n\n"
        f"## Digest\n{digest.text()}\n\n## Task ids\n{_task_ids(digest)}\n\n## Harness\n{harness_summary(harness)}\n\n"
        f"## Processor catalogue\n{processor_catalogue()}\n\n## Context\n{_context_text(context)}"
    )
    return [_system(role, REVISE_SCHEMA), {"role": "user", "content": user}]


def route_messages(task_text: str, options: dict[str, str], lessons: list[str]) -> list[dict[str, str]]:
    role = (
        "You route a task to the harness variant most likely to solve it. Each variant is a harness evolved for "
        "some kind of task; its record says how it did. Give the variant's name and your confidence in [0, 1]."
    )
    variants = "\n".join(f"- {name}: {record}" for name, record in options.items())
    user = (f"## Task\n{task_text}\n\n## Variants\n{variants}\n\n## Routing lessons\n"
            + ("\n".join(f"- {x}" for x in lessons) or "(none)"))
    return [_system(role, ROUTE_SCHEMA), {"role": "user", "content": user}]


WITHHELD = (f"Some values in this conversation were secrets (API keys, tokens or passwords from the trainer's "
            f"environment) and were withheld: each is shown as {REDACTED}. Do not guess them or quote the marker "
            "in an edit.")
"""The sentence a prompt gains when ``withhold_secrets`` redacted something in it."""


def withhold_secrets(messages: list[dict[str, str]]) -> list[dict[str, str]]:
    """``messages`` with every secret environment value replaced by ``<redacted>``, and ``WITHHELD``
    added to the system message when anything was (the messages themselves when nothing was).

    Digests, demonstrations and routed tasks quote task texts, which may hold a key (a tool's
    output, a scraped page); the endpoint is another party, so the key must not leave the trainer.
    The model is told a value was withheld so it does not read the marker as the task's content."""
    secrets = secret_env_values()
    if not contains_secret(messages, secrets):
        return messages
    clean = [{**m, "content": redact_text(m["content"], secrets)} if isinstance(m.get("content"), str) else m
             for m in messages]
    if clean and clean[0].get("role") == "system":
        if WITHHELD not in clean[0]["content"]:
            clean[0] = {**clean[0], "content": f"{clean[0]['content']}\n\n{WITHHELD}"}
    else:
        clean.insert(0, {"role": "system", "content": WITHHELD})
    return clean


def follow_up(error: str, accepted: int = 0) -> str:
    kept = (f"{accepted} proposal(s) were accepted; send corrected versions of the others only. "
            if accepted else "")
    return f"Your reply could not be used: {error}\n{kept}Reply again with the corrected JSON object only."
