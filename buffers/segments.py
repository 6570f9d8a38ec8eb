"""One segment file: the immutable on-disk unit that a single ``add`` commits atomically.

A segment is written to ``<name>.tmp``, fsynced, renamed to ``<name>`` and the directory fsynced;
POSIX rename is atomic, so under its final name a segment is either absent or complete. The
header carries a CRC and the file's exact length, so a segment damaged anyway (a filesystem
that lost writes, a truncated copy) is detected instead of being read as garbage; every payload
carries its own CRC, checked when it is read.

File layout (integers little-endian)::

    b"COEVOSG1" | u32 header_len | u32 crc32(header) | header (UTF-8 JSON) | payload_0 | payload_1 ...

Header JSON: ``number`` (segment counter), ``first_seq``, ``live_from_seq`` (the eviction
watermark after this commit: every seq below it is evicted), ``capacity``, ``payload_bytes``
and ``records`` (one per trace, in seq order: the BufferEntry fields plus ``offset``, ``length``
and ``crc`` of its payload, offsets counted from the end of the header).
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .entry import BufferEntry

MAGIC = b"COEVOSG1"
_PREFIX = struct.Struct("<8sII")  # magic, header length, header crc32
SUFFIX = ".seg"
TMP_SUFFIX = ".tmp"


class CorruptSegmentError(Exception):
    """A segment file under its final name fails its magic, CRC or length check."""


@dataclass(frozen=True)
class RecordRef:
    """Where one payload lives: segment number, absolute file offset, length and CRC32."""

    segment: int
    offset: int
    length: int
    crc: int


@dataclass(frozen=True)
class SegmentHeader:
    """A segment's header as read at open: enough to rebuild the index without touching payloads."""

    number: int
    first_seq: int
    live_from_seq: int
    capacity: int
    entries: tuple[BufferEntry, ...]
    refs: tuple[RecordRef, ...]
    size: int  # bytes of the whole file

    @property
    def next_seq(self) -> int:
        """The seq the next add after this segment starts at."""
        return self.first_seq + len(self.entries)


def segment_name(number: int) -> str:
    return f"{number:012d}{SUFFIX}"


def segment_number(path: Path) -> int | None:
    """The counter in a segment file's name, or None for any other file."""
    stem = path.name[: -len(SUFFIX)] if path.name.endswith(SUFFIX) else ""
    return int(stem) if stem.isdigit() else None


def fsync_directory(directory: Path) -> None:
    """Make a rename or create inside ``directory`` durable (the entry lives in the directory)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_segment(
    directory: Path,
    *,
    number: int,
    first_seq: int,
    live_from_seq: int,
    capacity: int,
    entries: Sequence[BufferEntry],
    payloads: Sequence[bytes],
) -> SegmentHeader:
    """Write and atomically publish one segment; returns its header (with absolute record offsets).

    When this returns, the segment is durable (file and directory entry fsynced). If the process
    dies earlier, at most a ``.tmp`` file is left, which the store deletes when it reopens.
    """
    if len(entries) != len(payloads):
        raise ValueError(f"{len(entries)} entries for {len(payloads)} payloads")
    records, offset = [], 0
    for i, (entry, payload) in enumerate(zip(entries, payloads, strict=True)):
        if entry.seq != first_seq + i:
            raise ValueError(f"entry seq {entry.seq} where {first_seq + i} was expected")
        records.append({**entry.to_json(), "offset": offset, "length": len(payload), "crc": zlib.crc32(payload)})
        offset += len(payload)
    header = json.dumps(
        {
            "number": number,
            "first_seq": first_seq,
            "live_from_seq": live_from_seq,
            "capacity": capacity,
            "payload_bytes": offset,
            "records": records,
        },
        separators=(",", ":"),
    ).encode()
    final = directory / segment_name(number)
    tmp = final.with_name(final.name + TMP_SUFFIX)
    try:
        with open(tmp, "wb") as f:
            f.write(_PREFIX.pack(MAGIC, len(header), zlib.crc32(header)))
            f.write(header)
            f.writelines(payloads)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)  # e.g. a full disk: leave no half file behind
        raise
    os.rename(tmp, final)
    fsync_directory(directory)
    return _parse_header(number, header, _PREFIX.size + len(header) + offset)


def read_header(path: Path) -> SegmentHeader:
    """Read and verify a segment's header (not its payloads); raises CorruptSegmentError."""
    number = segment_number(path)
    if number is None:
        raise CorruptSegmentError(f"{path}: not a segment file name")
    size = path.stat().st_size
    with open(path, "rb") as f:
        prefix = f.read(_PREFIX.size)
        if len(prefix) != _PREFIX.size:
            raise CorruptSegmentError(f"{path}: truncated before the header ({size} bytes)")
        magic, header_len, crc = _PREFIX.unpack(prefix)
        if magic != MAGIC:
            raise CorruptSegmentError(f"{path}: bad magic {magic!r}")
        header = f.read(header_len)
    if len(header) != header_len or zlib.crc32(header) != crc:
        raise CorruptSegmentError(f"{path}: header truncated or CRC mismatch")
    try:
        parsed = _parse_header(number, header, size)
        expected = _PREFIX.size + header_len + int(json.loads(header)["payload_bytes"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptSegmentError(f"{path}: malformed header ({exc!r})") from exc
    if size != expected:
        raise CorruptSegmentError(f"{path}: {size} bytes where the header promises {expected}")
    return parsed


def _parse_header(number: int, header: bytes, size: int) -> SegmentHeader:
    data = json.loads(header)
    if data["number"] != number:
        raise CorruptSegmentError(f"segment {number} claims number {data['number']}")
    base = _PREFIX.size + len(header)
    first = int(data["first_seq"])
    entries = tuple(BufferEntry.from_json(first + i, r) for i, r in enumerate(data["records"]))
    refs = tuple(RecordRef(number, base + r["offset"], r["length"], r["crc"]) for r in data["records"])
    return SegmentHeader(number, first, int(data["live_from_seq"]), int(data["capacity"]), entries, refs, size)


def read_payload(fd: int, ref: RecordRef) -> bytes:
    """Read one payload from an open segment file descriptor and check its CRC."""
    payload = os.pread(fd, ref.length, ref.offset)
    if len(payload) != ref.length or zlib.crc32(payload) != ref.crc:
        raise CorruptSegmentError(f"segment {ref.segment}: payload at offset {ref.offset} fails its CRC")
    return payload
