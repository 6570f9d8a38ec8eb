"""The Digester: a round's raw traces → failure clusters by root cause, for the Planner.

A Planner (rule or LLM) cannot read hundreds of transcripts, and it should not have to guess why
each one failed. The Digester assigns every failed trace one root cause from ``CAUSES``, groups
the failures by cause (a cause seen once is still a cluster: the long tail is where new edits come
from), points each cluster at the harness component ``IMPLICATED`` by its cause, and keeps a few
short excerpts from distinct tasks. It reports how many times smaller its text is than the traces.

Infrastructure failures (``Trace.infra_failure``: the policy call, the environment or a tool's
implementation crashed, out-of-memory included) are counted (``Digest.n_infra``) and left out of
everything else: no harness edit can fix the machine, and a cluster of them would send the Planner
after a cause that is not there.

Root cause without a reference trajectory: the first rule that matches wins.

1. ``env_error``: the episode crashed in a harness processor (``trace.error`` with
   ``error_source == "processor"``) or a tool call timed out: the harness's own machinery failed
   (a broken processor, a tool budget too short), not the model.
2. ``truncated`` / ``context_overflow``: the last model call was cut by length (``finish_reason ==
   "length"``), so the reply that should have ended the episode was cut: ``truncated`` when it
   holds its ``max_new_tokens`` (the completion budget ended it: raise the budget),
   ``context_overflow`` when it holds fewer (the context window ended it: shorten the history).
3. ``loop``: the loop detector stopped the episode (``stop_reason == "loop"``).
4. ``missing_tool`` / ``wrong_tool``: a call named a tool that is unknown or not allowed;
   ``missing_tool`` when the task needs that very tool (the reference used it, or it is in
   ``required_tools``), so the harness failed to enable it; ``wrong_tool`` otherwise.
5. ``tool_misuse``: any other tool error (bad arguments, a guard blocking the call).
6. ``format_error``: a tool-call block failed to parse, or the episode ended with a reply that was
   neither a tool call nor an answer (``stop_reason == "no_action"``).
7. ``step_budget``: the step budget or the runtime's step cap ended the episode.
8. ``premature_answer``: the trace answered without successfully calling a tool the reference
   used (or one in ``required_tools``).
9. ``wrong_answer``: everything else: a well-formed answer the verifier refused, or an episode the
   environment ended in failure (``stop_reason == "env_done"``, e.g. a lost game).

With a reference trajectory (a passing, genuine solution of the same task), the root cause is the
first divergence from it: the first step whose action differs (the tool calls with their normalised
arguments and whether they succeeded, or an answer and its normalised text, or no action). What the
trace did at that step decides, in the same order: a crash in that final step or a timeout →
``env_error``; a completion cut by length → ``truncated`` or ``context_overflow``; an unknown tool →
``missing_tool``
when the reference called it successfully, else ``wrong_tool``; another tool error →
``tool_misuse``; no action → ``format_error``; an answer before the tools the reference had used by
then → ``premature_answer``; any other answer → ``wrong_answer``. A divergent but working tool
call (another tool or other arguments), or a trace that stopped before that step, says nothing on
its own: the trace-level rules above decide the cause, and the step stays the divergence.

Token estimates are characters / 4 (rounded up) on both sides of the compression ratio: the raw
side is every message of every trace's final history (system, task, each completion as its
assistant turn, each tool result; completions are counted once, through their assistant turns),
the digest side is ``Digest.text()``. Real token ids exist only for model calls and would not cover
the digest text, so one estimator for both keeps the ratio honest.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from coevo.agent.rollouts import tool_use_rate
from coevo.agent.trace import Trace
from coevo.evolution.steps import Step, first_divergence, trace_steps
from coevo.evolution.types import CAUSES, IMPLICATED, Failure
from coevo.rundir.evolve_records import Cluster, Digest, ScaffoldEvidence

EXCERPT_CHARS = 240
CHARS_PER_TOKEN = 4
_UNKNOWN_TOOL_RE = re.compile(r"^(unknown tool\b|tool .* is not allowed)")
_TIMEOUT_RE = re.compile(r"\btimed out\b")
_WS_RE = re.compile(r"\s+")


def _is_unknown_tool(error: str | None) -> bool:
    return error is not None and _UNKNOWN_TOOL_RE.search(error) is not None


def _is_timeout(error: str | None) -> bool:
    return error is not None and _TIMEOUT_RE.search(error) is not None


def called_tools(traces: Iterable[Trace]) -> list[str]:
    """The tools the episodes called by a name that ran, sorted: a call that failed counts, one to
    an unknown name or one a processor answered instead does not."""
    return sorted({c.name for t in traces for c in t.tool_calls if not c.blocked and not _is_unknown_tool(c.error)})


def _used_tools(steps: Iterable[Step]) -> set[str]:
    used: set[str] = set()
    for st in steps:
        used |= st.succeeded_tools()
    return used


def _trace_cause(trace: Trace, steps: list[Step], required: set[str]) -> tuple[str, int | None, str]:
    """(cause, step, detail) by the trace-level precedence in the module docstring."""
    last = steps[-1].index if steps else None
    records = list(trace.tool_calls)
    if trace.error is not None:
        return "env_error", last, trace.error
    timeout = next((r for r in records if _is_timeout(r.error)), None)
    if timeout is not None:
        return "env_error", timeout.step, f"{timeout.name}: {timeout.error}"
    if steps and steps[-1].cut is not None:
        cause, detail = steps[-1].cut
        return cause, last, detail
    if trace.stop_reason == "loop":
        return "loop", last, "the loop detector stopped the episode"
    unknown = next((r for r in records if _is_unknown_tool(r.error)), None)
    if unknown is not None:
        cause = "missing_tool" if unknown.name in required else "wrong_tool"
        return cause, unknown.step, f"{unknown.name}: {unknown.error}"
    failed = next((r for r in records if r.error is not None), None)
    if failed is not None:
        return "tool_misuse", failed.step, f"{failed.name}: {failed.error}"
    bad = next((s for s in steps if s.parse_error is not None), None)
    if bad is not None:
        return "format_error", bad.index, bad.parse_error or ""
    if trace.stop_reason == "no_action":
        silent = next((s for s in steps if s.action() == ("none",)), steps[-1] if steps else None)
        return ("format_error", None if silent is None else silent.index,
                "a reply with neither a tool call nor an answer")
    if trace.stop_reason in ("step_budget", "step_cap"):
        return "step_budget", last, f"stopped by {trace.stop_reason}"
    missing = sorted(required - _used_tools(steps))
    if trace.final_answer is not None and missing:
        return "premature_answer", last, f"answered without calling {missing}"
    return "wrong_answer", last, f"answer {trace.final_answer!r} refused ({trace.stop_reason})"


def _step_cause(trace: Trace, steps: list[Step], s: int, ref_steps: list[Step]) -> tuple[str, str] | None:
    """(cause, detail) from what the trace did at divergence step ``s``; None when that step alone
    does not explain the failure (see the module docstring)."""
    if s >= len(steps):
        return None
    st = steps[s]
    if trace.error is not None and s == len(steps) - 1:
        return "env_error", trace.error
    for rec in st.records:
        if _is_timeout(rec.error):
            return "env_error", f"{rec.name}: {rec.error}"
    if st.cut is not None:
        return st.cut
    ref_used = _used_tools(ref_steps[: s + 1])
    for rec in st.records:
        if _is_unknown_tool(rec.error):
            cause = "missing_tool" if rec.name in _used_tools(ref_steps) else "wrong_tool"
            return cause, f"{rec.name}: {rec.error}"
    for rec in st.records:
        if rec.error is not None:
            return "tool_misuse", f"{rec.name}: {rec.error}"
    kind = st.action()[0]
    if kind == "none":
        return "format_error", st.parse_error or "neither a tool call nor an answer"
    if kind == "answer":
        missing = sorted(ref_used - _used_tools(steps[: s + 1]))
        if missing:
            return "premature_answer", f"answered where the reference called {missing}"
        return "wrong_answer", f"answer {st.answer!r} differs from the reference's"
    return None


def _clip(text: str, width: int) -> str:
    text = _WS_RE.sub(" ", text).strip()
    return text if len(text) <= width else text[: width - 1] + "…"


def excerpt(trace: Trace, step: int | None, steps: list[Step] | None = None) -> str:
    """At most ``EXCERPT_CHARS`` characters: the completion at ``step`` (or the last step the trace
    reached) and what its tool calls returned, plus the crash message if the episode ended there."""
    steps = trace_steps(trace) if steps is None else steps
    if not steps:
        return _clip(f"no model call: {trace.error or trace.stop_reason}", EXCERPT_CHARS)
    i = len(steps) - 1 if step is None else min(step, len(steps) - 1)
    st = steps[i]
    tail = [f"{r.name} → error: {r.error}" if r.error else f"{r.name} → {r.output}" for r in st.records]
    if trace.error is not None and i == len(steps) - 1:
        tail.append(f"crash: {trace.error}")
    tail_text = _clip(" | ".join(tail), EXCERPT_CHARS // 2) if tail else ""
    head = f"step {st.index}: "
    room = EXCERPT_CHARS - len(head) - (len(tail_text) + 4 if tail_text else 0)
    text = head + _clip(st.completion, max(room, 8))
    return _clip(text + (f" || {tail_text}" if tail_text else ""), EXCERPT_CHARS)


def classify(
    trace: Trace, reference: Trace | None = None, *, required_tools: Iterable[str] = ()
) -> Failure | None:
    """The root cause of a failed trace (None for a passing one); see the module docstring.

    ``required_tools`` names tools the task needs even without a reference (e.g. from its
    capabilities), for ``premature_answer`` and ``missing_tool``.
    """
    if trace.passed:
        return None
    steps = trace_steps(trace)
    required = set(required_tools)
    ref_steps: list[Step] = []
    if reference is not None:
        ref_steps = trace_steps(reference)
        required |= _used_tools(ref_steps)
        s = first_divergence(trace, reference)
        if s is not None:
            found = _step_cause(trace, steps, s, ref_steps)
            if found is None:  # the step alone does not explain it: the trace-level rules decide
                cause, _, detail = _trace_cause(trace, steps, required)
            else:
                cause, detail = found
            return Failure(trace.trace_id, trace.task_id, trace.variant, cause, s, excerpt(trace, s, steps),
                           detail=_clip(detail, EXCERPT_CHARS), diverged_from_reference=True)
    cause, step, detail = _trace_cause(trace, steps, required)
    return Failure(trace.trace_id, trace.task_id, trace.variant, cause, step, excerpt(trace, step, steps),
                   detail=_clip(detail, EXCERPT_CHARS))


def cluster_failures(failures: Sequence[Failure], *, max_excerpts: int = 3) -> list[Cluster]:
    """Group failures by cause: count, share of all failures, distinct tasks (first-seen order),
    trace ids, and up to ``max_excerpts`` excerpts from distinct tasks. Largest cluster first,
    ties by cause name."""
    if max_excerpts < 0:
        raise ValueError(f"max_excerpts must be >= 0, got {max_excerpts}")
    groups: dict[str, list[Failure]] = {}
    for f in failures:
        if f.cause not in IMPLICATED:
            raise ValueError(f"failure {f.trace_id!r} has cause {f.cause!r}; allowed causes: {CAUSES}")
        groups.setdefault(f.cause, []).append(f)
    total = len(failures)
    clusters = []
    for cause, members in groups.items():
        task_ids = list(dict.fromkeys(f.task_id for f in members))
        shown: dict[str, str] = {}
        for f in members:
            if len(shown) >= max_excerpts:
                break
            shown.setdefault(f.task_id, f.excerpt)
        clusters.append(
            Cluster(cause, IMPLICATED[cause], len(members), len(members) / total, task_ids,
                    [f.trace_id for f in members], list(shown.values()))
        )
    clusters.sort(key=lambda c: (-c.count, c.cause))
    return clusters


def estimate_tokens(text: str) -> int:
    """Characters / 4, rounded up: a model-free estimate usable on both sides of the ratio."""
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def raw_chars(trace: Trace) -> int:
    """Characters of the trace's transcript (its final message history; completions if it has none)."""
    if trace.messages:
        return sum(len(str(m.get("content") or "")) for m in trace.messages)
    return sum(len(c.reply) for c in trace.model_calls)


def digest(
    traces: Sequence[Trace],
    *,
    round: int,
    variant: str,
    references: Mapping[str, Trace] | None = None,
    max_excerpts: int = 3,
    scaffold: ScaffoldEvidence | None = None,
) -> Digest:
    """Compress one round's traces of one harness variant into a ``Digest``.

    Each failed trace is classified against the reference of its task when ``references`` holds
    one. Traces from several harness ids (a variant edited within the round) must all carry
    ``variant``; the digest reports the most common harness id (ties: the smallest id). A task is
    in ``passed_task_ids`` when any of its traces passed, else in ``failed_task_ids``.
    Infrastructure failures are only counted (``n_infra``): they are in no cluster, in neither
    task list, and outside ``n_failed`` and ``pass_rate``. ``scaffold``: the same tasks' episodes
    without the harness's scaffolding, summarised (``scaffold_evidence``), shown to the Planner.
    ``tools_called``: the tools the episodes called by a name that ran (an unknown name does not
    count), what a proposal to list only those rests on (``coevo.meta.retire``).
    """
    if not traces:
        raise ValueError("digest needs at least one trace")
    ids = Counter(t.harness_id for t in traces)
    if len(ids) > 1:
        others = sorted({t.variant for t in traces} - {variant})
        if others:
            raise ValueError(
                f"traces mix harness ids {sorted(ids)} and variants {others} besides {variant!r}; "
                "digest one variant at a time"
            )
    harness_id = min(ids, key=lambda h: (-ids[h], h))
    references = references or {}
    judged = [t for t in traces if not t.infra_failure]
    failures = [
        f for t in judged if not t.passed
        for f in [classify(t, references.get(t.task_id))] if f is not None
    ]
    clusters = cluster_failures(failures, max_excerpts=max_excerpts)
    passed = sorted({t.task_id for t in judged if t.passed})
    failed = sorted({t.task_id for t in judged} - set(passed))
    n_passed = sum(t.passed for t in judged)
    result = Digest(
        round=round,
        variant=variant,
        harness_id=harness_id,
        n_traces=len(traces),
        n_failed=len(judged) - n_passed,
        pass_rate=n_passed / len(judged) if judged else 0.0,
        clusters=clusters,
        raw_tokens=math.ceil(sum(raw_chars(t) for t in traces) / CHARS_PER_TOKEN),
        digest_tokens=0,
        passed_task_ids=passed,
        failed_task_ids=failed,
        n_infra=len(traces) - len(judged),
        scaffold=scaffold,
        tools_called=called_tools(judged),
    )
    result.digest_tokens = estimate_tokens(result.text())
    return result


def scaffold_evidence(scaffolded: Sequence[Trace], unscaffolded: Sequence[Trace],
                      scaffold: Sequence[str]) -> ScaffoldEvidence | None:
    """Tool use and pass rate of a variant's episodes with its scaffolding (``scaffolded``) and of
    the same tasks' episodes without it (``unscaffolded``); None when either side has no judged
    episode. Infrastructure failures say nothing about the model and are left out."""
    with_ = [t for t in scaffolded if not t.infra_failure]
    without = [t for t in unscaffolded if not t.infra_failure]
    if not with_ or not without or not scaffold:
        return None
    return ScaffoldEvidence(scaffold=list(scaffold), episodes=len(without), tool_use=tool_use_rate(without),
                            pass_rate=sum(t.passed for t in without) / len(without),
                            scaffolded_tool_use=tool_use_rate(with_),
                            scaffolded_pass_rate=sum(t.passed for t in with_) / len(with_))
