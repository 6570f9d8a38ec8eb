"""Behaviour log-probs for a batch of traces from one call of the caller's LogprobFn.

One call for the whole batch lets the caller run one batched (chunked) forward pass instead of
one per trace, and it pins every row to the model version the buffer records. The result is
checked row by row because a silent shape slip here would misalign importance ratios in GRPO.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from coevo.agent.trace import Trace

from .entry import LogprobFn, LogprobQuery


def behaviour_logprobs(traces: Sequence[Trace], logprob_fn: LogprobFn) -> list[list[list[float]]]:
    """Per trace, per model call: one float per completion token.

    ``logprob_fn`` gets a ``LogprobQuery`` (ids and the call's log-prob temperature) for every
    model call of the batch in trace order, then model-call order; it is not called when the
    batch has no model calls at all.
    Raises ValueError naming the trace id and call index when the rows do not match the calls.
    """
    owners = [(k, i) for k, trace in enumerate(traces) for i in range(len(trace.model_calls))]
    result: list[list[list[float]]] = [[] for _ in traces]
    if not owners:
        return result
    calls = [traces[k].model_calls[i] for k, i in owners]
    pairs = [LogprobQuery(c.prompt_ids, c.completion_ids, c.logprob_temperature()) for c in calls]
    rows = list(logprob_fn(pairs))
    if len(rows) != len(pairs):
        k, i = owners[min(len(rows), len(owners) - 1)]
        where = "no row for" if len(rows) < len(pairs) else "extra rows after"
        raise ValueError(
            f"logprob_fn returned {len(rows)} rows for {len(pairs)} model calls; "
            f"{where} trace {traces[k].trace_id!r} call {i}"
        )
    for (k, i), row in zip(owners, rows, strict=True):
        values = _floats(row)
        expected = len(traces[k].model_calls[i].completion_ids)
        if len(values) != expected:
            raise ValueError(
                f"logprob_fn row for trace {traces[k].trace_id!r} call {i} has {len(values)} log-probs "
                f"for {expected} completion tokens"
            )
        result[k].append(values)
    return result


def sampler_first(traces: Sequence[Trace], logprob_fn: LogprobFn) -> LogprobFn:
    """A LogprobFn for ``behaviour_logprobs(traces, ...)`` that answers each model call with the
    log-probs its sampler recorded and calls ``logprob_fn`` only for calls recorded without them.

    Only exact when the sampler is the model being trained, at the weights the buffer records (the
    transformers policy: its decode engine and the trainer's forward agree to ~1e-5 per token,
    docs/PERF.md); never for vLLM, whose probabilities differ from the trainer's by design. It
    saves the forward pass over every prompt and completion that recomputing them costs.
    """
    rows = [call.sampler_logprobs for trace in traces for call in trace.model_calls]

    def answer(queries: Sequence[LogprobQuery]) -> list[list[float]]:
        if len(queries) != len(rows):
            raise ValueError(f"sampler_first was built for {len(rows)} model calls, asked for {len(queries)}")
        missing = [q for q, row in zip(queries, rows, strict=True) if row is None]
        computed = iter(logprob_fn(missing) if missing else [])
        return [list(row) if row is not None else next(computed) for row in rows]

    return answer


def _floats(row: Any) -> list[float]:
    """A row as plain floats, accepting lists, tuples, numpy arrays or 1-D tensors."""
    if hasattr(row, "tolist"):
        row = row.tolist()
    if not isinstance(row, (list, tuple)):
        raise TypeError(f"logprob_fn returned a row of type {type(row).__name__}, expected a sequence of floats")
    return [float(x) for x in row]
