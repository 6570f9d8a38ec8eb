"""The buffer directory: a single-writer lock, crash recovery, atomic commits and segment cleanup.

State lives only in the segment files. The newest segment's header holds the eviction watermark
(``live_from_seq``) and, through its seq range, the next seq; so committing an add and the FIFO
eviction it causes is one atomic rename, and nothing else needs to be kept consistent with it.
Fully evicted segments are then deleted; a crash before or during that deletion only leaves
files that the next open deletes, because the watermark already excludes them.
"""

from __future__ import annotations

import fcntl
import itertools
import os
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path

from .entry import BufferEntry
from .segments import (
    SUFFIX,
    TMP_SUFFIX,
    CorruptSegmentError,
    RecordRef,
    SegmentHeader,
    read_header,
    read_payload,
    segment_name,
    segment_number,
    write_segment,
)

LOCK_NAME = "LOCK"


class CorruptBufferError(RuntimeError):
    """The buffer directory is inconsistent in a way recovery must not paper over."""


class SegmentStore:
    """Append-only segments in one directory, opened by one process at a time.

    ``read_only`` opens an existing directory without changing a byte of it (what exports need): no
    lock file is created (a shared lock on an existing one keeps a writer out while reading), an
    interrupted add's temporary file is left alone, a damaged newest segment is skipped with a
    warning instead of set aside, and nothing is evicted or deleted."""

    def __init__(self, directory: Path, *, read_only: bool = False) -> None:
        if directory.exists() and not directory.is_dir():
            raise NotADirectoryError(f"replay buffer path {directory} is not a directory")
        self.read_only = read_only
        if read_only and not directory.is_dir():
            raise FileNotFoundError(f"replay buffer {directory} does not exist")
        if not read_only:
            directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self._lock_fd: int | None = _lock(directory, shared=read_only)
        self._fds: dict[int, int] = {}
        self._segments: dict[int, SegmentHeader] = {}  # by number, oldest first
        self.damaged: list[str] = []  # what is wrong with a damaged newest segment left out, naming its file
        try:
            self._recover()
        except BaseException:
            self.close()
            raise

    # -- state ---------------------------------------------------------------------------------

    @property
    def next_seq(self) -> int:
        newest = self._newest()
        return newest.next_seq if newest else 0

    @property
    def live_from_seq(self) -> int:
        newest = self._newest()
        return newest.live_from_seq if newest else 0

    def live_records(self) -> Iterator[tuple[BufferEntry, RecordRef]]:
        """Every non-evicted record in seq order."""
        watermark = self.live_from_seq
        for header in self._segments.values():
            for entry, ref in zip(header.entries, header.refs, strict=True):
                if entry.seq >= watermark:
                    yield entry, ref

    def disk_bytes(self) -> int:
        """Bytes held by committed segments (what FIFO churn must keep bounded)."""
        return sum(h.size for h in self._segments.values())

    # -- writing -------------------------------------------------------------------------------

    def commit(
        self, entries: Sequence[BufferEntry], payloads: Sequence[bytes], *, live_from_seq: int, capacity: int
    ) -> SegmentHeader:
        """Atomically append ``entries`` and move the eviction watermark to ``live_from_seq``.

        An empty ``entries`` commits an eviction alone (used when a buffer is reopened with a
        smaller capacity). Fully evicted segments are deleted afterwards.
        """
        if self.read_only:
            raise PermissionError(f"replay buffer {self.directory} is open read-only")
        next_seq = self.next_seq
        if not self.live_from_seq <= live_from_seq <= next_seq + len(entries):
            raise ValueError(f"watermark {live_from_seq} outside [{self.live_from_seq}, {next_seq + len(entries)}]")
        newest = self._newest()
        header = write_segment(
            self.directory,
            number=newest.number + 1 if newest else 0,
            first_seq=next_seq,
            live_from_seq=live_from_seq,
            capacity=capacity,
            entries=entries,
            payloads=payloads,
        )
        self._segments[header.number] = header
        self._collect()
        return header

    def _collect(self) -> None:
        """Delete segments whose records are all evicted, oldest first; the newest always stays.

        The unlinks are not fsynced: one undone by a power loss is simply redone at the next open.
        A failed unlink only warns (the commit before it stands); it is retried after the next one.
        """
        watermark = self.live_from_seq
        newest = self._newest()
        for number, header in list(self._segments.items()):
            if header is newest or header.next_seq > watermark:
                break
            self._close_fd(number)
            try:
                (self.directory / segment_name(number)).unlink(missing_ok=True)
            except OSError as exc:
                warnings.warn(f"replay buffer: could not delete evicted segment {number}: {exc}", stacklevel=2)
                break
            del self._segments[number]

    # -- reading -------------------------------------------------------------------------------

    def read(self, ref: RecordRef) -> bytes:
        """One payload, CRC-checked (a failure names the segment file); segment files stay open for the
        next reads."""
        if ref.segment not in self._segments:
            raise KeyError(f"segment {ref.segment} no longer exists (its records were evicted)")
        fd = self._fds.get(ref.segment)
        path = self.directory / segment_name(ref.segment)
        if fd is None:
            fd = self._fds[ref.segment] = os.open(path, os.O_RDONLY)
        try:
            return read_payload(fd, ref)
        except CorruptSegmentError as exc:
            raise CorruptSegmentError(f"{path}: {exc}") from None

    def verify(self) -> list[str]:
        """Read every live payload and check its CRC (opening checks only the headers); returns one
        line per damaged record, naming its file and trace: what a resume or an export must refuse
        before it trusts the buffer. Reads sequentially, one segment after another."""
        damaged = []
        for entry, ref in self.live_records():
            try:
                self.read(ref)
            except CorruptSegmentError as exc:
                damaged.append(f"{exc} (trace {entry.trace_id!r}, seq {entry.seq})")
        return damaged

    # -- lifecycle -----------------------------------------------------------------------------

    def close(self) -> None:
        for number in list(self._fds):
            self._close_fd(number)
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None

    def _close_fd(self, number: int) -> None:
        fd = self._fds.pop(number, None)
        if fd is not None:
            os.close(fd)

    def _newest(self) -> SegmentHeader | None:
        return next(reversed(self._segments.values()), None)

    def _recover(self) -> None:
        """Drop what an interrupted add left behind, load the headers and check the chain of seqs."""
        for tmp in self.directory.glob(f"*{SUFFIX}{TMP_SUFFIX}"):
            if not self.read_only:
                tmp.unlink()  # an add that never committed
        paths = sorted((n, p) for p in self.directory.glob(f"*{SUFFIX}") if (n := segment_number(p)) is not None)
        for i, (number, path) in enumerate(paths):
            try:
                self._segments[number] = read_header(path)
            except CorruptSegmentError as exc:
                if i < len(paths) - 1:
                    raise CorruptBufferError(f"segment {path.name} is damaged and is not the newest: {exc}") from exc
                # Only a filesystem that broke fsync/rename ordering can leave this; the commit it
                # held never completed, so it is set aside (not deleted) and the buffer goes on.
                self.damaged.append(str(exc))
                if self.read_only:
                    warnings.warn(f"replay buffer: skipped damaged newest segment {path.name} (left as it is): {exc}",
                                  stacklevel=3)
                    continue
                path.rename(path.with_name(path.name + ".corrupt"))
                warnings.warn(f"replay buffer: set aside damaged newest segment {path.name}: {exc}", stacklevel=3)
        headers = list(self._segments.values())
        if not headers:
            return
        newest = headers[-1]
        watermark = newest.live_from_seq
        if not 0 <= watermark <= newest.next_seq:
            raise CorruptBufferError(f"watermark {watermark} outside the stored seqs (next seq {newest.next_seq})")
        start = next(i for i, h in enumerate(headers) if h.next_seq > watermark or h is newest)
        chain = headers[start:]
        if chain[0].first_seq > watermark:
            raise CorruptBufferError(f"records {watermark}..{chain[0].first_seq - 1} are missing")
        for older, newer in itertools.pairwise(chain):
            if newer.first_seq != older.next_seq:
                raise CorruptBufferError(
                    f"segments {older.number} and {newer.number} leave a gap: "
                    f"seq {older.next_seq} then {newer.first_seq}"
                )
        if not self.read_only:
            self._collect()


def _lock(directory: Path, *, shared: bool = False) -> int | None:
    """Hold an flock for the life of the store (exclusive for a writer, shared for a reader); the
    kernel drops it if the process dies. A reader never creates the lock file: without one no
    writer has ever opened the directory, and there is nothing to wait for."""
    if shared and not (directory / LOCK_NAME).exists():
        return None
    fd = os.open(directory / LOCK_NAME, os.O_RDONLY if shared else os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise RuntimeError(f"replay buffer {directory} is already open in another process or object") from None
    return fd
