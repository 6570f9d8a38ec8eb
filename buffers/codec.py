"""Trace <-> bytes for one stored payload.

Token ids and log-probs dominate a trace's size, and as JSON they are slow to write and ~3x
larger than packed binary; so the four per-call arrays (prompt ids, completion ids, sampler and
behaviour log-probs) are stored as little-endian packed arrays after a JSON header holding
everything else. float64 keeps log-probs bit-exact, so a decoded trace compares equal to the
one that was stored.

Layout of one payload::

    u32 meta_len | meta (UTF-8 JSON: Trace.to_dict() minus the arrays, plus their shapes) | arrays
"""

from __future__ import annotations

import json
import struct
import sys
from array import array
from collections.abc import Sequence
from dataclasses import asdict, fields, is_dataclass
from typing import TYPE_CHECKING, Any

from coevo.agent.trace import Trace

if TYPE_CHECKING:
    from coevo.agent.trace import ModelCall

_META_LEN = struct.Struct("<I")
_INT32 = range(-(2**31), 2**31)
_CALL_ARRAYS = ("prompt_ids", "completion_ids", "sampler_logprobs")
_SWAP = sys.byteorder != "little"

Spec = list[str | int] | None  # [typecode, length], or None for a field that is None


def _pack(values: Sequence[float] | Sequence[int] | None, *, floats: bool, out: list[bytes]) -> Spec:
    """Append the packed array to ``out`` and return its spec (None stays None)."""
    if values is None:
        return None
    if floats:
        code = "d"
    else:
        code = "i" if not values or (min(values) in _INT32 and max(values) in _INT32) else "q"
    packed = array(code, values)
    if _SWAP:
        packed.byteswap()
    out.append(packed.tobytes())
    return [code, len(packed)]


def _unpack(spec: Spec, view: memoryview, pos: int) -> tuple[list[int] | list[float] | None, int]:
    """Decode one array starting at ``pos``; returns (values, next position)."""
    if spec is None:
        return None, pos
    code, n = spec
    packed = array(code)
    end = pos + n * packed.itemsize
    if end > len(view):
        raise ValueError("payload shorter than its array layout")
    packed.frombytes(view[pos:end])
    if _SWAP:
        packed.byteswap()
    return packed.tolist(), end


def _fields(obj: Trace | ModelCall) -> dict[str, Any]:
    """A dataclass's fields as a dict, without the deep copy ``asdict`` makes (the arrays are big)."""
    return {f.name: getattr(obj, f.name) for f in fields(obj)}


def _json_default(obj: Any) -> dict[str, Any]:
    """Nested dataclasses (e.g. inside events or metrics) serialise as ``Trace.to_dict`` would."""
    if is_dataclass(obj) and not isinstance(obj, type):
        return asdict(obj)
    raise TypeError(f"a trace field holds a {type(obj).__name__}, which is not JSON-serialisable")


def encode_trace(trace: Trace) -> bytes:
    """Serialise a trace (including ``behaviour_logprobs``) to one payload.

    The metadata is what ``Trace.to_dict`` gives, built without its deep copy: ``asdict`` of a
    realistic trace costs more than everything else here together.
    """
    meta = _fields(trace)
    meta["model_calls"] = [_fields(call) for call in trace.model_calls]
    meta["tool_calls"] = [asdict(call) for call in trace.tool_calls]
    blobs: list[bytes] = []
    call_specs = []
    for call in meta["model_calls"]:
        specs = [_pack(call.pop(name), floats=name.endswith("logprobs"), out=blobs) for name in _CALL_ARRAYS]
        call_specs.append(specs)
    behaviour = meta.pop("behaviour_logprobs")
    meta["_calls"] = call_specs
    meta["_behaviour"] = None if behaviour is None else [_pack(row, floats=True, out=blobs) for row in behaviour]
    head = json.dumps(meta, ensure_ascii=False, separators=(",", ":"), default=_json_default).encode()
    return b"".join([_META_LEN.pack(len(head)), head, *blobs])


def decode_trace(payload: bytes | memoryview) -> Trace:
    """Inverse of :func:`encode_trace`; raises ValueError on a malformed payload."""
    view = memoryview(payload)
    if len(view) < _META_LEN.size:
        raise ValueError("payload too short")
    (meta_len,) = _META_LEN.unpack_from(view)
    pos = _META_LEN.size + meta_len
    meta = json.loads(bytes(view[_META_LEN.size : pos]))
    call_specs = meta.pop("_calls")
    behaviour_specs = meta.pop("_behaviour")
    if len(call_specs) != len(meta["model_calls"]):
        raise ValueError("payload array layout does not match its model calls")
    for call, specs in zip(meta["model_calls"], call_specs, strict=True):
        for name, spec in zip(_CALL_ARRAYS, specs, strict=True):
            call[name], pos = _unpack(spec, view, pos)
    if behaviour_specs is None:
        meta["behaviour_logprobs"] = None
    else:
        rows = []
        for spec in behaviour_specs:
            row, pos = _unpack(spec, view, pos)
            rows.append(row)
        meta["behaviour_logprobs"] = rows
    if pos != len(view):
        raise ValueError("payload longer than its array layout")
    return Trace.from_dict(meta)
