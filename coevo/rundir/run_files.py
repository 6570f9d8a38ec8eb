"""The run directory's JSON-lines files read into their records: ``rounds.jsonl`` and ``lineage.jsonl``.

A malformed line or a repeated round is named by file and line, so a damaged run says where.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeVar

from coevo.errors import DamagedFileError
from coevo.rundir.records import LineageRow, RoundRecord

R = TypeVar("R", RoundRecord, LineageRow)


def read_jsonl(path: Path) -> list[tuple[int, Any]]:
    """(1-based line number, parsed value) of every non-blank line; malformed JSON names the line."""
    out = []
    for number, text in enumerate(Path(path).read_text().splitlines(), start=1):
        if not text.strip():
            continue
        try:
            out.append((number, json.loads(text)))
        except json.JSONDecodeError as e:
            raise DamagedFileError(f"{path}:{number}: malformed JSON ({e.msg} at column {e.colno})") from None
    return out


def read_rounds(path: Path) -> list[RoundRecord]:
    """The records of a ``rounds.jsonl`` in file order (none when it is missing); a repeated
    round is refused with both lines."""
    path = Path(path)
    records, seen = [], {}
    for line, row in read_jsonl(path) if path.is_file() else []:
        record = _read(RoundRecord, row, f"{path}:{line}")
        if record.round in seen:
            raise DamagedFileError(f"{path}:{line}: round {record.round} repeats the record on line "
                                   f"{seen[record.round]}")
        seen[record.round] = line
        records.append(record)
    return records


def read_lineage(path: Path) -> list[LineageRow]:
    """The rows of a ``lineage.jsonl`` in file order (none when it is missing)."""
    path = Path(path)
    return [_read(LineageRow, row, f"{path}:{line}") for line, row in (read_jsonl(path) if path.is_file() else [])]


def _read(record: type[R], row: object, where: str) -> R:
    """``row`` as a ``record`` (its ``from_dict``), a ``DamagedFileError`` naming ``where`` when it is not one."""
    try:
        return record.from_dict(row, where)
    except ValueError as err:
        raise DamagedFileError(str(err)) from None
