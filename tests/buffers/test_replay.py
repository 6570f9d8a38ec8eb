"""The replay buffer: round trips, log-prob batching, FIFO/lag, queries, lazy batches, crash safety."""

from __future__ import annotations

import copy
import gc
import math
import os
import random
import signal
import subprocess
import sys
import time
import weakref
from pathlib import Path

import pytest

import coevo.buffers.replay as replay_module
import coevo.buffers.segments as segments_module
from coevo.buffers import (
    BufferEntry,
    CorruptBufferError,
    CorruptSegmentError,
    LogprobQuery,
    ReplayBuffer,
    decode_trace,
    encode_trace,
)
from tests.buffers.factories import batch_traces, fake_logprobs, make_trace

ROOT = Path(__file__).resolve().parents[2]


def small(trace_id: str, **kw) -> object:
    return make_trace(trace_id, n_calls=kw.pop("n_calls", 1), prompt_len=3, completion_len=2, **kw)


def segment_files(path: Path) -> list[Path]:
    return sorted(path.glob("*.seg"))


# -- round trip --------------------------------------------------------------------------------


def test_round_trip_keeps_traces_equal_and_in_order(tmp_path):
    batches = [
        [make_trace(f"r{r}-{k}", task_id=f"task-{k % 2}", reward=float(k % 2)) for k in range(3)] for r in range(2)
    ]
    sampler_before = [copy.deepcopy([c.sampler_logprobs for c in t.model_calls]) for b in batches for t in b]
    with ReplayBuffer(tmp_path / "buf", capacity=10) as buf:
        returned = [buf.add(b, round=r, model_version=7 + r, logprob_fn=fake_logprobs) for r, b in enumerate(batches)]
        originals = [t for b in batches for t in b]
        assert [e.seq for e in buf.entries()] == list(range(6))
        assert buf.entries() == returned[0] + returned[1]
        loaded = buf.load(buf.entries())
    assert loaded == originals
    for trace, sampler in zip(loaded, sampler_before, strict=True):
        assert [c.sampler_logprobs for c in trace.model_calls] == sampler  # untouched by the buffer
        assert trace.behaviour_logprobs == fake_logprobs(
            [LogprobQuery(c.prompt_ids, c.completion_ids, c.logprob_temperature()) for c in trace.model_calls])
    first = returned[1][0]
    assert (first.trace_id, first.round, first.model_version, first.task_id) == ("r1-0", 1, 8, "task-0")
    trainable_tokens = sum(len(c.completion_ids) for c in batches[1][0].model_calls if c.trainable)
    assert first.n_tokens == trainable_tokens < sum(len(c.completion_ids) for c in batches[1][0].model_calls)


def test_codec_keeps_none_logprobs_and_wide_token_ids():
    trace = make_trace("wide", n_calls=2)
    trace.model_calls[0].sampler_logprobs = None
    trace.model_calls[1].prompt_ids = [2**40, -(2**33), 0]
    assert trace.behaviour_logprobs is None
    assert decode_trace(encode_trace(trace)) == trace
    trace.behaviour_logprobs = [[], [-0.25, float("-inf")] + [0.0] * (len(trace.model_calls[1].completion_ids) - 2)]
    assert decode_trace(encode_trace(trace)) == trace
    trace.metrics["nested"] = trace.tool_calls[0]  # a dataclass inside a plain field: stored as to_dict stores it
    assert decode_trace(encode_trace(trace)).to_dict() == trace.to_dict()


def test_codec_keeps_reply_prefixes_and_reads_payloads_written_before_them():
    import json
    import struct

    trace = make_trace("forced", n_calls=2)
    trace.model_calls[0].reply_prefix = '<tool_call>{"name": "calculator", "arguments": {'
    back = decode_trace(encode_trace(trace))
    assert back == trace and back.model_calls[0].reply == trace.model_calls[0].reply_prefix + "answer 0"
    # a payload stored before model calls had a reply_prefix: the same layout without the key
    plain = make_trace("old", n_calls=2)
    payload = encode_trace(plain)
    (n,) = struct.unpack_from("<I", payload)
    meta = json.loads(payload[4 : 4 + n])
    for call in meta["model_calls"]:
        del call["reply_prefix"]
    head = json.dumps(meta).encode()
    old = decode_trace(struct.pack("<I", len(head)) + head + payload[4 + n :])
    assert old == plain and [c.reply_prefix for c in old.model_calls] == ["", ""]


# -- log-prob batching and validation ----------------------------------------------------------


def test_logprob_fn_called_once_per_add_with_every_pair(tmp_path):
    calls = []

    def spy(pairs):
        calls.append(list(pairs))
        return fake_logprobs(pairs)

    traces = [make_trace(f"t{k}", n_calls=k + 1) for k in range(3)]
    with ReplayBuffer(tmp_path, capacity=8) as buf:
        buf.add(traces, round=0, model_version=0, logprob_fn=spy)
        assert len(calls) == 1
        # each call with the temperature its log-probs refer to (1.0 for greedy, None when not recorded)
        assert calls[0] == [(c.prompt_ids, c.completion_ids, c.logprob_temperature())
                            for t in traces for c in t.model_calls]
        assert {q.temperature for q in calls[0]} == {0.7, 1.0, None}
        no_calls = make_trace("empty", n_calls=0)
        buf.add([no_calls], round=1, model_version=1, logprob_fn=spy)
        assert len(calls) == 1 and no_calls.behaviour_logprobs == []
        assert buf.add([], round=2, model_version=2, logprob_fn=spy) == [] and len(calls) == 1


@pytest.mark.parametrize(
    "bad_fn, match",
    [
        (lambda pairs: fake_logprobs(pairs)[:-1], r"3 rows for 4 model calls; no row for trace 'b' call 1"),
        (lambda pairs: fake_logprobs(pairs) + [[0.0]], r"5 rows for 4 model calls; extra rows after trace 'b' call 1"),
        (lambda pairs: [r[:-1] if i == 2 else r for i, r in enumerate(fake_logprobs(pairs))], r"trace 'b' call 0 has"),
    ],
)
def test_logprob_shape_errors_name_trace_and_call(tmp_path, bad_fn, match):
    traces = [make_trace("a"), make_trace("b")]
    with ReplayBuffer(tmp_path, capacity=8) as buf:
        with pytest.raises(ValueError, match=match):
            buf.add(traces, round=0, model_version=0, logprob_fn=bad_fn)
        assert len(buf) == 0 and all(t.behaviour_logprobs is None for t in traces)
    assert segment_files(tmp_path) == []


def test_validation_errors(tmp_path):
    for bad in (0, -3):
        with pytest.raises(ValueError, match="capacity"):
            ReplayBuffer(tmp_path / "x", capacity=bad)
    with ReplayBuffer(tmp_path / "buf", capacity=3) as buf:
        buf.add([small("a")], round=0, model_version=0, logprob_fn=fake_logprobs)
        with pytest.raises(ValueError, match="'a' is already in the buffer"):
            buf.add([small("b"), small("a")], round=1, model_version=1, logprob_fn=fake_logprobs)
        with pytest.raises(ValueError, match="'c' appears twice"):
            buf.add([small("c"), small("c")], round=1, model_version=1, logprob_fn=fake_logprobs)
        with pytest.raises(ValueError, match="exceeds the capacity 3"):
            buf.add([small(f"d{k}") for k in range(4)], round=1, model_version=1, logprob_fn=fake_logprobs)
        with pytest.raises(ValueError, match="batch_size"):
            buf.iter_batches(0)
        assert [e.trace_id for e in buf.entries()] == ["a"]
        with pytest.raises(RuntimeError, match="already open"):
            ReplayBuffer(tmp_path / "buf", capacity=3)
    with pytest.raises(ValueError, match="closed"):
        buf.load([])


def test_unserialisable_trace_leaves_buffer_and_trace_unchanged(tmp_path):
    with ReplayBuffer(tmp_path, capacity=4) as buf:
        bad = small("bad")
        bad.metrics["handle"] = object()
        with pytest.raises(TypeError, match="not JSON-serialisable"):
            buf.add([small("ok"), bad], round=0, model_version=0, logprob_fn=fake_logprobs)
        assert bad.behaviour_logprobs is None and len(buf) == 0
        buf.add([small("ok")], round=0, model_version=0, logprob_fn=fake_logprobs)
        assert len(buf) == 1


def test_failed_write_closes_the_buffer_and_leaves_no_partial_batch(tmp_path, monkeypatch):
    buf = ReplayBuffer(tmp_path, capacity=4)
    buf.add([small("a")], round=0, model_version=0, logprob_fn=fake_logprobs)

    def disk_full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(segments_module.os, "fsync", disk_full)
    with pytest.raises(OSError, match="No space"):
        buf.add([small("b"), small("c")], round=1, model_version=1, logprob_fn=fake_logprobs)
    monkeypatch.undo()
    with pytest.raises(ValueError, match="closed"):
        buf.add([small("d")], round=2, model_version=2, logprob_fn=fake_logprobs)
    assert not list(tmp_path.glob("*.tmp"))
    with ReplayBuffer(tmp_path, capacity=4) as buf:
        assert [e.trace_id for e in buf.entries()] == ["a"]
        buf.add([small("b")], round=1, model_version=1, logprob_fn=fake_logprobs)
        assert [e.seq for e in buf.entries()] == [0, 1]


# -- FIFO and lag ------------------------------------------------------------------------------


@pytest.mark.parametrize("capacity, per_round", [(10, 4), (7, 3), (9, 2), (13, 5), (8, 4)])
def test_fifo_and_lag_over_many_rounds(tmp_path, capacity, per_round):
    rounds = 30
    seen_lag = []
    with ReplayBuffer(tmp_path, capacity=capacity) as buf:
        for r in range(rounds):  # round r rolls out with the model after r updates
            traces = [small(f"r{r}-{k}") for k in range(per_round)]
            buf.add(traces, round=r, model_version=r, logprob_fn=fake_logprobs)
            inserted = per_round * (r + 1)
            assert len(buf) == min(capacity, inserted)
            assert [e.seq for e in buf.entries()] == list(range(inserted - len(buf), inserted))  # FIFO by seq
            lag = buf.lag(r)  # GRPO trains on the buffer before this round's update
            assert lag <= capacity // per_round
            assert lag == min(r, (capacity - 1) // per_round)
            assert buf.lag(r + 1) == min(r + 1, math.ceil(capacity / per_round))  # after the update
            seen_lag.append(lag)
    if capacity % per_round:
        assert max(seen_lag) == capacity // per_round  # the bound floor(C/s) is reached
    else:
        assert max(seen_lag) == capacity // per_round - 1


def test_lag_edge_cases(tmp_path):
    with ReplayBuffer(tmp_path, capacity=4) as buf:
        assert buf.lag(5) == 0
        buf.add([small("a")], round=0, model_version=3, logprob_fn=fake_logprobs)
        with pytest.raises(ValueError, match="older"):
            buf.lag(2)


# -- queries -----------------------------------------------------------------------------------


def test_groups_and_query_with_tied_rewards(tmp_path):
    with ReplayBuffer(tmp_path, capacity=50) as buf:
        for r in range(3):
            traces = [
                small(f"r{r}-{h}-{k}", task_id=f"task-{k % 3}", harness_id=f"h{h}", reward=1.0)
                for h in range(2)
                for k in range(4)
            ]
            buf.add(traces, round=r, model_version=r, logprob_fn=fake_logprobs)
        groups = buf.groups()
        assert list(groups) == ["task-0", "task-1", "task-2"]
        assert sum(len(g) for g in groups.values()) == 24
        for task, members in groups.items():
            assert all(e.task_id == task for e in members)
            assert [e.seq for e in members] == sorted(e.seq for e in members)
        by_round = buf.groups(round=1, harness_id="h0")
        assert {t: [e.trace_id for e in g] for t, g in by_round.items()} == {
            "task-0": ["r1-0-0", "r1-0-3"],
            "task-1": ["r1-0-1"],
            "task-2": ["r1-0-2"],
        }
        assert [e.trace_id for e in buf.query(task_id="task-1", harness_id="h1")] == ["r0-1-1", "r1-1-1", "r2-1-1"]
        assert buf.query(round=2, model_version=1) == []
        assert len(buf.query(model_version=2)) == 8
        assert buf.query() == buf.entries()


# -- batches -----------------------------------------------------------------------------------


def _filled(tmp_path, n=23, capacity=40) -> ReplayBuffer:
    buf = ReplayBuffer(tmp_path, capacity=capacity)
    for start in range(0, n, 5):
        traces = [small(f"t{i}", task_id=f"task-{i % 4}", reward=0.0) for i in range(start, min(n, start + 5))]
        buf.add(traces, round=start // 5, model_version=0, logprob_fn=fake_logprobs)
    return buf


def test_iter_batches_covers_each_entry_once(tmp_path):
    with _filled(tmp_path) as buf:
        batches = list(buf.iter_batches(5))
        assert [len(b) for b in batches] == [5, 5, 5, 5, 3]
        assert [t.trace_id for b in batches for t in b] == [e.trace_id for e in buf.entries()]
        shuffled = [t.trace_id for b in buf.iter_batches(4, shuffle_seed=3) for t in b]
        assert sorted(shuffled) == sorted(e.trace_id for e in buf.entries()) and len(set(shuffled)) == 23
        assert shuffled != [e.trace_id for e in buf.entries()]
        again = [t.trace_id for b in buf.iter_batches(4, shuffle_seed=3, entries=buf.entries()[::-1]) for t in b]
        assert again == shuffled  # depends on the seed and the set of entries only
        assert [t.trace_id for b in buf.iter_batches(4, shuffle_seed=4) for t in b] != shuffled
        group = buf.groups()["task-1"]
        assert [t.trace_id for b in buf.iter_batches(2, entries=group) for t in b] == [e.trace_id for e in group]
        with pytest.raises(ValueError, match="more than once"):
            buf.iter_batches(2, entries=group + group[:1])


def test_iter_batches_reads_lazily_batch_by_batch(tmp_path, monkeypatch):
    decoded = []
    refs: list[weakref.ref] = []

    def counting_decode(payload):
        trace = decode_trace(payload)
        decoded.append(trace.trace_id)
        refs.append(weakref.ref(trace))
        return trace

    monkeypatch.setattr(replay_module, "decode_trace", counting_decode)
    with _filled(tmp_path) as buf:
        iterator = buf.iter_batches(4, shuffle_seed=0)
        assert decoded == []  # nothing is read before the first batch is asked for
        handed_out = 0
        for batch in iterator:  # (not enumerate: its reused result tuple would keep the batch alive)
            handed_out += len(batch)
            assert len(decoded) == handed_out  # exactly the batches handed out so far
            del batch
            gc.collect()
            assert sum(r() is not None for r in refs) == 0  # the buffer keeps no decoded trace alive
        assert len(decoded) == 23


def test_load_rejects_evicted_entries(tmp_path):
    with ReplayBuffer(tmp_path, capacity=2) as buf:
        buf.add([small("a"), small("b")], round=0, model_version=0, logprob_fn=fake_logprobs)
        old = buf.entries()[0]
        buf.add([small("c")], round=1, model_version=1, logprob_fn=fake_logprobs)
        with pytest.raises(KeyError, match="'a'"):
            buf.load([old])
        fake = BufferEntry(**{**old.__dict__, "seq": 2})
        with pytest.raises(KeyError):
            buf.load([fake])


# -- persistence -------------------------------------------------------------------------------


def test_reopen_after_close_and_capacity_changes(tmp_path):
    with _filled(tmp_path, n=23, capacity=10) as buf:
        before, traces = buf.entries(), buf.load(buf.entries())
    with ReplayBuffer(tmp_path, capacity=10) as buf:
        assert buf.entries() == before and buf.load(buf.entries()) == traces
    with ReplayBuffer(tmp_path, capacity=4) as buf:  # shrinking evicts the oldest, durably
        assert buf.entries() == before[-4:]
    with ReplayBuffer(tmp_path, capacity=100) as buf:  # growing does not resurrect anything
        assert buf.entries() == before[-4:]
        buf.add([small("new")], round=9, model_version=9, logprob_fn=fake_logprobs)
        assert [e.seq for e in buf.entries()] == [19, 20, 21, 22, 23]


def test_disk_usage_stays_bounded_under_fifo_churn(tmp_path):
    capacity, per_round = 20, 6
    sizes = []
    with ReplayBuffer(tmp_path, capacity=capacity) as buf:
        for r in range(60):
            buf.add(
                [make_trace(f"r{r}-{k}", n_calls=2) for k in range(per_round)],
                round=r,
                model_version=r,
                logprob_fn=fake_logprobs,
            )
            files = segment_files(tmp_path)
            assert len(files) <= math.ceil(capacity / per_round) + 1
            sizes.append(sum(f.stat().st_size for f in files))
    assert max(sizes[10:]) <= 1.15 * min(sizes[10:])
    assert not list(tmp_path.glob("*.tmp"))


def test_recovery_discards_torn_tail_and_refuses_interior_damage(tmp_path):
    with _filled(tmp_path, n=15, capacity=40) as buf:
        before = buf.entries()
    files = segment_files(tmp_path)
    assert [f.name for f in files] == ["000000000000.seg", "000000000001.seg", "000000000002.seg"]
    (tmp_path / "000000000003.seg.tmp").write_bytes(b"half a segm")  # an add that never committed
    newest = files[-1].read_bytes()
    files[-1].write_bytes(newest[: len(newest) // 2])  # damage only a broken filesystem could cause
    with pytest.warns(UserWarning, match="set aside"), ReplayBuffer(tmp_path, capacity=40) as buf:
        assert buf.entries() == before[:10]
    assert not list(tmp_path.glob("*.tmp"))
    first = segment_files(tmp_path)[0]
    data = bytearray(first.read_bytes())
    data[-3] ^= 0xFF  # flip a payload byte
    first.write_bytes(bytes(data))
    with ReplayBuffer(tmp_path, capacity=40) as buf, pytest.raises(CorruptSegmentError, match="CRC"):
        buf.load(buf.entries()[4:5])
    first.write_bytes(b"garbage")
    with pytest.raises(CorruptBufferError, match="not the newest"):
        ReplayBuffer(tmp_path, capacity=40)


# -- crash safety ------------------------------------------------------------------------------

CAPACITY = 14  # batches hold 3..6 traces, so the FIFO boundary cuts through batches
WRITER = """
import os, sys, time
sys.path.insert(0, {root!r})
from coevo.buffers import ReplayBuffer
from tests.buffers.factories import batch_traces, fake_logprobs

real_fsync = os.fsync
def slow_fsync(fd):  # a slow disk widens the window between writing a segment and publishing it
    time.sleep(0.02)
    real_fsync(fd)
os.fsync = slow_fsync

def slow_logprobs(pairs):
    time.sleep(0.02)
    return fake_logprobs(pairs)

with ReplayBuffer({path!r}, {capacity}) as buf:
    entries = buf.entries()
    batch = int(entries[-1].trace_id[1:].split("-")[0]) + 1 if entries else 0
    print("ready", batch, flush=True)
    while True:
        traces = batch_traces(batch)
        print("begin", batch, flush=True)
        buf.add(traces, round=batch, model_version=batch, logprob_fn=slow_logprobs)
        print("end", batch, flush=True)
        batch += 1
"""


def _ids(batch: int) -> list[str]:
    return [f"b{batch}-t{k}" for k in range(3 + batch % 4)]


def _check_recovered(buf: ReplayBuffer, newest_batch: int) -> None:
    """The buffer holds exactly the last CAPACITY traces of batches 0..newest_batch, complete."""
    all_ids = [i for b in range(newest_batch + 1) for i in _ids(b)]
    entries = buf.entries()
    live = all_ids[-CAPACITY:]
    assert [e.trace_id for e in entries] == live
    assert [e.seq for e in entries] == list(range(len(all_ids) - len(live), len(all_ids)))
    assert len({e.trace_id for e in entries}) == len(entries)
    batches = sorted({int(e.trace_id[1:].split("-")[0]) for e in entries})
    expected = {t.trace_id: t for b in batches for t in batch_traces(b)}
    for entry, trace in zip(entries, buf.load(entries), strict=True):
        want = expected[entry.trace_id]
        want.behaviour_logprobs = fake_logprobs(
            [LogprobQuery(c.prompt_ids, c.completion_ids, c.logprob_temperature()) for c in want.model_calls])
        assert [len(row) for row in trace.behaviour_logprobs] == [len(c.completion_ids) for c in trace.model_calls]
        assert trace == want
        assert entry.round == entry.model_version == int(entry.trace_id[1:].split("-")[0])


@pytest.mark.slow
def test_sigkill_at_random_moments_leaves_whole_batches(tmp_path):
    path = tmp_path / "buf"
    code = WRITER.format(root=str(ROOT), path=str(path), capacity=CAPACITY)
    rng = random.Random(1234)
    kills = mid_add = torn = 0
    newest = -1
    while kills < 12 or (mid_add < 3 or torn < 1) and kills < 30:
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            ready = proc.stdout.readline().split()
            assert ready and ready[0] == "ready", proc.stderr.read()
            assert int(ready[1]) == newest + 1  # the writer resumes after the newest recovered batch
            time.sleep(rng.uniform(0.0, 0.5))
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            # through the text wrapper: readline may have buffered the lines after "ready", and
            # communicate() reads the pipe beneath it, which would lose them
            out = proc.stdout.read()
            proc.stderr.read()
            proc.wait()
        assert proc.returncode == -signal.SIGKILL
        kills += 1
        markers = [line.split() for line in out.splitlines()]
        torn += bool(list(path.glob("*.tmp")))  # killed after writing a segment but before publishing it
        with ReplayBuffer(path, capacity=CAPACITY) as buf:
            entries = buf.entries()
            recovered = int(entries[-1].trace_id[1:].split("-")[0]) if entries else -1
            if markers and markers[-1][0] == "begin":  # killed inside add: that batch is all or nothing
                mid_add += 1
                assert recovered in (int(markers[-1][1]) - 1, int(markers[-1][1]))
            elif markers:  # killed between adds: the last finished add is there
                assert recovered == int(markers[-1][1])
            else:
                assert recovered == newest
            _check_recovered(buf, recovered)
            newest = recovered
            assert not list(path.glob("*.tmp"))
            assert len(segment_files(path)) <= CAPACITY // 3 + 2
    assert mid_add >= 3 and torn >= 1, (kills, mid_add, torn)
    with ReplayBuffer(path, capacity=CAPACITY) as buf:  # and the buffer goes on working
        buf.add(batch_traces(newest + 1), round=newest + 1, model_version=newest + 1, logprob_fn=fake_logprobs)
        _check_recovered(buf, newest + 1)
    with ReplayBuffer(path, capacity=CAPACITY) as buf:
        _check_recovered(buf, newest + 1)
