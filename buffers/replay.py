"""The disk-backed FIFO replay buffer that cross-harness GRPO trains from.

Each co-evolution round inserts its traces together with the behaviour log-probs of the model
that is current at insertion, so training never has to run rollouts or old-model passes of its
own. Payloads live on disk in append-only segments (``segments.py``: format; ``store.py``:
recovery); memory holds only the small ``BufferEntry`` index, so the buffer can outgrow RAM and
training batches are read lazily.

Crash-safety guarantee (one writer; a local filesystem with atomic rename and honest fsync):

* Atomicity: one ``add`` call is one segment file published by one rename. Killed at any
  point (SIGKILL, OOM, power loss), the reopened buffer holds that batch wholly (every trace,
  each with its behaviour log-probs) or not at all; an unpublished ``.tmp`` file is deleted.
* Durability and order: when ``add`` returns, file and directory are fsynced, so the batch
  survives power loss; committed adds are always a prefix of the adds issued.
* Eviction: the watermark (first live seq) is written in the same commit, so after reopening
  the live set is exactly the last ``min(C, N)`` traces, in seq order, of the committed adds
  (``N`` their total). Eviction is never half applied, no trace that should remain is lost, and
  an evicted trace never comes back (not even when reopened with a larger capacity).
* Disk: fully evicted segments are deleted after each commit (a crash before that leaves files
  the next open deletes). With ``s`` traces per add, at most ``ceil(C/s) + 1`` segment files
  remain: the live traces plus the evicted head of the oldest live segment.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Iterator, Sequence
from pathlib import Path

from coevo.agent.trace import Trace

from .codec import decode_trace, encode_trace
from .entry import BufferEntry, LogprobFn
from .logprobs import behaviour_logprobs
from .segments import RecordRef
from .store import SegmentStore


class ReplayBuffer:
    """FIFO buffer of at most ``capacity`` traces, persisted under the directory ``path``.

    Opening an existing directory recovers it after a crash (an uncommitted add is discarded).
    Reopening with a smaller capacity evicts the oldest traces at once (committed atomically);
    with a larger one, traces evicted earlier stay evicted. One process (and one object) may
    hold a directory at a time. ``read_only`` opens it for reading without changing any file
    (exports; see ``SegmentStore``); ``add`` then raises.
    """

    def __init__(self, path: str | Path, capacity: int, *, read_only: bool = False) -> None:
        if not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity must be a positive integer, got {capacity!r}")
        self.capacity = capacity
        self.path = Path(path)
        self._store: SegmentStore | None = SegmentStore(self.path, read_only=read_only)
        self._entries: deque[BufferEntry] = deque()  # seq order
        self._records: dict[int, tuple[BufferEntry, RecordRef]] = {}  # seq -> (entry, payload location)
        self._seq_of: dict[str, int] = {}  # trace id -> seq
        for entry, ref in self._store.live_records():
            self._index(entry, ref)
        if len(self._entries) > capacity and not read_only:
            watermark = self._entries[len(self._entries) - capacity].seq
            try:
                self._store.commit([], [], live_from_seq=watermark, capacity=capacity)
            except BaseException:
                self.close()
                raise
            self._evict_below(watermark)

    # -- writing -------------------------------------------------------------------------------

    def add(
        self, traces: Sequence[Trace], *, round: int, model_version: int, logprob_fn: LogprobFn
    ) -> list[BufferEntry]:
        """Store ``traces`` with behaviour log-probs from one ``logprob_fn`` call; atomic.

        Sets ``trace.behaviour_logprobs`` on the given traces (``sampler_logprobs`` are kept as
        they are), appends them in order and evicts the oldest traces beyond capacity. An empty
        batch stores nothing and does not call ``logprob_fn``.

        Validation errors (ids, capacity, log-prob shapes, unserialisable fields) leave the buffer
        and the traces unchanged. If the write itself fails (an OSError, an interrupt), the buffer
        closes itself: the batch is then either wholly committed or wholly absent, and reopening
        the directory says which.
        """
        store = self._open_store()
        if len(traces) > self.capacity:
            raise ValueError(f"a batch of {len(traces)} traces exceeds the capacity {self.capacity}")
        seen: set[str] = set()
        for trace in traces:
            if trace.trace_id in self._seq_of:
                raise ValueError(f"trace id {trace.trace_id!r} is already in the buffer")
            if trace.trace_id in seen:
                raise ValueError(f"trace id {trace.trace_id!r} appears twice in the batch")
            seen.add(trace.trace_id)
        if not traces:
            return []
        rows = behaviour_logprobs(traces, logprob_fn)
        first = store.next_seq
        entries = [_entry(first + k, trace, round=round, model_version=model_version) for k, trace in enumerate(traces)]
        previous = [trace.behaviour_logprobs for trace in traces]
        try:
            for trace, row in zip(traces, rows, strict=True):
                trace.behaviour_logprobs = row
            payloads = [encode_trace(trace) for trace in traces]
        except BaseException:
            for trace, old in zip(traces, previous, strict=True):
                trace.behaviour_logprobs = old  # nothing was written: leave the caller's traces as given
            raise
        live_from = max(store.live_from_seq, first + len(traces) - self.capacity)
        try:
            header = store.commit(entries, payloads, live_from_seq=live_from, capacity=self.capacity)
        except BaseException:
            # Whether the commit reached the disk is unknown here (e.g. the directory fsync failed
            # after the rename); only reopening can tell, so this object refuses further use.
            self.close()
            raise
        for entry, ref in zip(header.entries, header.refs, strict=True):
            self._index(entry, ref)
        self._evict_below(live_from)
        return entries

    # -- index queries -------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._entries)

    def entries(self) -> list[BufferEntry]:
        """All stored entries in seq (insertion) order."""
        return list(self._entries)

    def query(
        self,
        *,
        task_id: str | None = None,
        round: int | None = None,
        harness_id: str | None = None,
        model_version: int | None = None,
    ) -> list[BufferEntry]:
        """Entries matching every given filter, in seq order."""
        return [
            e
            for e in self._entries
            if (task_id is None or e.task_id == task_id)
            and (round is None or e.round == round)
            and (harness_id is None or e.harness_id == harness_id)
            and (model_version is None or e.model_version == model_version)
        ]

    def groups(self, *, round: int | None = None, harness_id: str | None = None) -> dict[str, list[BufferEntry]]:
        """GRPO groups: entries by task id, each in seq order, tasks in order of first appearance."""
        out: dict[str, list[BufferEntry]] = {}
        for entry in self.query(round=round, harness_id=harness_id):
            out.setdefault(entry.task_id, []).append(entry)
        return out

    def lag(self, current_version: int) -> int:
        """Largest ``current_version - model_version`` over stored traces (0 when empty).

        With ``s`` traces added per round at the current version and one update per round, this
        is ``floor((C - 1) / s)`` (<= ``floor(C / s)``) when asked before the round's update and
        ``ceil(C / s)`` after it. Raises ValueError if a stored trace is newer than
        ``current_version`` (a trainer restarted from an older checkpoint than the buffer).
        """
        if not self._entries:
            return 0
        versions = [e.model_version for e in self._entries]
        if max(versions) > current_version:
            raise ValueError(f"current_version {current_version} is older than a stored trace's {max(versions)}")
        return current_version - min(versions)

    # -- payloads ------------------------------------------------------------------------------

    def load(self, entries: Sequence[BufferEntry]) -> list[Trace]:
        """Read the traces of ``entries`` from disk, in the given order.

        Raises KeyError for an entry that is not (or no longer) in the buffer.
        """
        store = self._open_store()
        traces = []
        for entry in entries:
            stored, ref = self._records.get(entry.seq, (None, None))
            if stored is None or ref is None or stored.trace_id != entry.trace_id:
                raise KeyError(f"trace {entry.trace_id!r} (seq {entry.seq}) is not in the buffer; evicted?")
            traces.append(decode_trace(store.read(ref)))
        return traces

    @property
    def damaged_segments(self) -> list[str]:
        """What is wrong with a damaged newest segment this opening left out (set aside as ``.corrupt``,
        or skipped when read-only), naming its file; empty when every segment file was intact."""
        return list(self._open_store().damaged)

    def verify(self) -> list[str]:
        """Check the CRC of every stored trace's payload (``SegmentStore.verify``): one line per damaged
        trace, naming its segment file; empty when all are intact."""
        return self._open_store().verify()

    def iter_batches(
        self, batch_size: int, *, entries: Sequence[BufferEntry] | None = None, shuffle_seed: int | None = None
    ) -> Iterator[list[Trace]]:
        """Training batches of ``batch_size`` traces (the last may be smaller), read batch by batch.

        Covers ``entries`` (default: the whole buffer) once each, in the given order, or, with
        ``shuffle_seed``, in a permutation of their seq order that depends only on the seed and
        the set of entries. Only the current batch is ever read into memory by the buffer.
        """
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        order = list(self._entries if entries is None else entries)
        if len({e.seq for e in order}) != len(order):
            raise ValueError("entries contain the same trace more than once")
        if shuffle_seed is not None:
            order.sort(key=lambda e: e.seq)
            random.Random(shuffle_seed).shuffle(order)
        return self._batches(order, batch_size)

    def _batches(self, order: list[BufferEntry], batch_size: int) -> Iterator[list[Trace]]:
        for start in range(0, len(order), batch_size):
            yield self.load(order[start : start + batch_size])

    # -- lifecycle -----------------------------------------------------------------------------

    def close(self) -> None:
        """Release the directory (files and lock); idempotent. Every add is already durable."""
        if self._store is not None:
            self._store.close()
            self._store = None

    def __enter__(self) -> ReplayBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ReplayBuffer({str(self.path)!r}, capacity={self.capacity}, size={len(self)})"

    # -- internals -----------------------------------------------------------------------------

    def _open_store(self) -> SegmentStore:
        if self._store is None:
            raise ValueError(f"replay buffer {self.path} is closed")
        return self._store

    def _index(self, entry: BufferEntry, ref: RecordRef) -> None:
        self._entries.append(entry)
        self._records[entry.seq] = (entry, ref)
        self._seq_of[entry.trace_id] = entry.seq

    def _evict_below(self, watermark: int) -> None:
        while self._entries and self._entries[0].seq < watermark:
            gone = self._entries.popleft()
            del self._records[gone.seq]
            del self._seq_of[gone.trace_id]


def _entry(seq: int, trace: Trace, *, round: int, model_version: int) -> BufferEntry:
    return BufferEntry(
        seq=seq,
        trace_id=trace.trace_id,
        task_id=trace.task_id,
        harness_id=trace.harness_id,
        variant=trace.variant,
        model_version=int(model_version),
        round=int(round),
        reward=float(trace.reward),
        passed=bool(trace.passed),
        trainable=bool(trace.trainable),
        n_tokens=sum(len(c.completion_ids) for c in trace.model_calls if c.trainable),
    )
