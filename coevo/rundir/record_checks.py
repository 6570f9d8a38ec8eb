"""How a record read back is checked: pydantic's validation of the record dataclasses, its errors
in the run directory's words (``<run>/rounds.jsonl:3: field 'a.b' must be int, got str``), and
``RecordError`` for the checks that are not types (``coevo.rundir.records`` raises it)."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, fields, is_dataclass
from functools import cache
from typing import TYPE_CHECKING, Annotated, Any, Self, TypeVar

import pydantic
from pydantic import AfterValidator, Strict, TypeAdapter

if TYPE_CHECKING:
    from pydantic_core import ErrorDetails

Int = Annotated[int, Strict()]
Float = Annotated[float, Strict()]  # takes an int too, never a bool or a string
Str = Annotated[str, Strict()]
Bool = Annotated[bool, Strict()]


R = TypeVar("R")


def _json(value: Any) -> Any:
    """A free-form part of a record as the run directory holds it (tuples become lists, dict keys
    strings, anything else JSON cannot hold its ``str``), so a record the loop builds equals the one
    read back."""
    return json.loads(json.dumps(value, default=str))


JSONDict = Annotated[dict[Str, Any], AfterValidator(_json)]
"""A free-form object of a record (kept as its JSON form)."""


class RecordError(ValueError):
    """A record that fails a check that is not a type. ``path`` is the offending field relative
    to the record that raised it ('' for the record itself); the message reads ``field <path> <problem>``."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path} {problem}".strip())
        self.path, self.problem = path, problem


@cache
def _adapter(cls: type) -> TypeAdapter:
    return TypeAdapter(cls)


_EXPECTED = {"int_type": "int", "int_from_float": "int", "float_type": "int or float", "string_type": "str",
             "bool_type": "bool", "list_type": "list", "dict_type": "object", "dataclass_type": "object"}


def _path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part != "[key]":
            out += f".{part}" if out else str(part)
    return out


def _join(path: str, sub: str) -> str:
    if not sub:
        return path
    return f"{path}{sub}" if sub.startswith("[") or not path else f"{path}.{sub}"


def _message(error: ErrorDetails, what: str) -> str:
    """One pydantic error in this module's words: ``required field 'a.b' is missing``,
    ``field 'a.b' must be int, got str``, ``field 'a.b' <problem>``."""
    path, kind, value = _path(error["loc"]), error["type"], error.get("input")
    if kind == "missing" or kind == "missing_argument":
        return f"required field {path!r} is missing"
    if not path and kind in ("dataclass_type", "dict_type"):
        return f"{what} must be a JSON object, got {type(value).__name__}"
    if kind in _EXPECTED:
        return f"field {path!r} must be {_EXPECTED[kind]}, got {type(value).__name__}"
    cause = (error.get("ctx") or {}).get("error")
    if isinstance(cause, RecordError):
        where = _join(path, cause.path)
        if cause.problem == "is missing":
            return f"required field {where!r} is missing"
        return f"field {where!r} {cause.problem}" if where else f"{what} {cause.problem}"
    return f"field {path!r}: {error['msg']}" if path else f"{what}: {error['msg']}"


def validate(cls: type[R], data: object, where: str, what: str) -> R:
    """``data`` as a ``cls`` record, or ``ValueError`` naming ``where`` and the first bad field."""
    try:
        return _adapter(cls).validate_python(data)
    except pydantic.ValidationError as e:
        errors = e.errors()
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise ValueError(f"{where}: {_message(errors[0], what)}{more}") from None


def plain(value: Any) -> Any:
    """``value`` in the form a record writes: a nested record by its own ``to_dict`` (a record may
    add or shape fields, e.g. a proposal's edits), another dataclass by ``asdict``, containers rebuilt."""
    if isinstance(value, Record):
        return value.to_dict()
    if is_dataclass(value) and not isinstance(value, type):
        return asdict(value)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


class Record:
    """``to_dict`` / ``from_dict`` of every record dataclass (``coevo.rundir.records``,
    ``coevo.rundir.evolve_records``)."""

    def to_dict(self) -> dict[str, Any]:
        return {f.name: plain(getattr(self, f.name)) for f in fields(self)}  # type: ignore[arg-type]

    @classmethod
    def from_dict(cls, data: object, where: str | None = None) -> Self:
        """Validate ``data`` (a parsed JSON object) into this record; errors start with ``where``."""
        name = re.sub(r"(?<!^)(?=[A-Z][a-z])", " ", cls.__name__).lower()
        return validate(cls, data, where or name, f"a {name}")
