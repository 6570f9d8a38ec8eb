"""The JSON schemas of the LLM meta-agent's stages (plan, revise, route) and the small validator
that checks a model's reply against them (``schema_errors``, ``parse_reply``).

An LLM's reply is never trusted: it is parsed as JSON and checked against the stage's schema
before anything is built from it; the errors name the path of each mismatch, so the agent
(``coevo.meta.llm``) can quote them back to the model. The validator covers the subset of JSON
Schema these schemas use, so no extra package is needed.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from coevo.evolution.types import CAUSES
from coevo.harness.edits import EDIT_OPS
from coevo.harness.hooks import Dimension

# ------------------------------------------------------------------------------------- schemas
EDIT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "op": {"type": "string", "enum": list(EDIT_OPS)},
        "processor": {"type": "string"},
        "spec": {
            "type": ["object", "null"],
            "properties": {
                "kind": {"type": "string"},
                "name": {"type": ["string", "null"]},
                "params": {"type": ["object", "null"]},
            },
            "required": ["kind"],
        },
        "param": {"type": ["string", "null"]},
        "value": {},
        "after": {"type": ["string", "null"]},
        "index": {"type": ["integer", "null"]},
    },
    "required": ["op", "processor"],
    "additionalProperties": False,
}

PROPOSAL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "hypothesis": {"type": "string"},
        "dimension": {"type": "string", "enum": [d.value for d in Dimension]},
        "cluster": {"type": ["string", "null"], "enum": [*CAUSES, None]},
        "target_tasks": {"type": "array", "items": {"type": "string"}},
        "predicted_flips": {"type": "array", "items": {"type": "string"}},
        "at_risk": {"type": "array", "items": {"type": "string"}},
        "edits": {"type": "array", "items": EDIT_SCHEMA, "minItems": 1},
    },
    "required": ["hypothesis", "dimension", "cluster", "target_tasks", "predicted_flips", "at_risk", "edits"],
    "additionalProperties": False,
}

PLAN_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"proposals": {"type": "array", "items": PROPOSAL_SCHEMA}},
    "required": ["proposals"],
    "additionalProperties": False,
}

REVISE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"give_up": {"type": "boolean"}, "proposal": PROPOSAL_SCHEMA},
    "additionalProperties": False,
}

ROUTE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "variant": {"type": "string"},
        "confidence": {"type": "number", "minimum": 0, "maximum": 1},
    },
    "required": ["variant", "confidence"],
    "additionalProperties": False,
}

SCHEMAS: dict[str, dict[str, Any]] = {"plan": PLAN_SCHEMA, "revise": REVISE_SCHEMA, "route": ROUTE_SCHEMA}
"""stage → the JSON schema its reply must match."""

_JSON_TYPES: dict[str, Callable[[object], bool]] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


def _type_name(value: object) -> str:
    return next((name for name, test in _JSON_TYPES.items() if test(value)), type(value).__name__)


def schema_errors(value: Any, schema: dict[str, Any], path: str = "$") -> list[str]:
    """Where ``value`` breaks ``schema``: the subset of JSON Schema the stage schemas use (type,
    enum, minimum/maximum, required, properties, additionalProperties: false, items,
    minItems). jsonschema is not a dependency, and the messages go back to the model verbatim,
    so each names the JSON path."""
    types = schema.get("type")
    if types is not None:
        allowed = [types] if isinstance(types, str) else list(types)
        if not any(_JSON_TYPES[t](value) for t in allowed):
            return [f"{path}: expected {' or '.join(allowed)}, got {_type_name(value)}"]
    errors: list[str] = []
    if "enum" in schema and not any(value == e and type(value) is type(e) for e in schema["enum"]):
        errors.append(f"{path}: must be one of {schema['enum']}, got {value!r}")
    if _JSON_TYPES["number"](value):
        if "minimum" in schema and value < schema["minimum"]:
            errors.append(f"{path}: must be >= {schema['minimum']}, got {value}")
        if "maximum" in schema and value > schema["maximum"]:
            errors.append(f"{path}: must be <= {schema['maximum']}, got {value}")
    if isinstance(value, dict):
        props = schema.get("properties", {})
        errors += [f"{path}: missing required property {name!r}" for name in schema.get("required", [])
                   if name not in value]
        if schema.get("additionalProperties") is False:
            extra = sorted(set(value) - set(props))
            if extra:
                errors.append(f"{path}: unexpected properties {extra}; allowed: {sorted(props)}")
        for name, sub in props.items():
            if name in value:
                errors += schema_errors(value[name], sub, f"{path}.{name}")
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            errors.append(f"{path}: needs at least {schema['minItems']} item(s), got {len(value)}")
        if "items" in schema:
            for i, item in enumerate(value):
                errors += schema_errors(item, schema["items"], f"{path}[{i}]")
    return errors


def parse_reply(text: str, schema: dict[str, Any]) -> tuple[Any, str | None]:
    """(data, None) or (None, error). Tolerates code fences and prose around the first JSON object,
    which small models often add; the schema decides whether the content is usable."""
    body = text.strip()
    start = body.find("{")
    if start < 0:
        return None, f"the reply holds no JSON object (it starts {body[:60]!r})"
    try:
        data, _ = json.JSONDecoder().raw_decode(body, start)
    except json.JSONDecodeError as err:
        return None, f"invalid JSON: {err}"
    errors = schema_errors(data, schema)
    if errors:
        more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
        return None, "the JSON does not match the schema: " + "; ".join(errors[:5]) + more
    return data, None
