"""Per-task outcomes of episodes, and pass@1 / pass@k over them: the one place both are computed.

Outcomes map a task id to the pass/fail of its attempts, in attempt order. Every caller runs the
same number k of attempts on each task and asks whether *any* of them passed, so pass@k here is
that empirical share (no caller samples n > k attempts, which the unbiased estimator of Chen et al.
2021, 1 - C(n-c, k) / C(n, k), would need; with n = k the two agree). pass@1 is the mean over tasks
of each task's share of passing attempts.

An infrastructure failure (``Trace.infra_failure``: the policy, the environment or a tool crashed)
is no evidence about the policy or the harness. ``task_outcomes`` counts it the way its caller
needs: as a failed attempt (``"fail"``, what an evaluation reports; the runtime already marks such
a trace not passed), as None (``"none"``, the Critic's re-runs, whose gates leave it out), or not
at all (``"drop"``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from coevo.agent.trace import Trace

INFRA = ("fail", "none", "drop")
"""How ``task_outcomes`` counts an infrastructure failure (see the module docstring)."""


def task_outcomes(traces: Iterable[Trace], task_ids: Iterable[str] | None = None, *,
                  infra: str = "fail") -> dict[str, list[bool | None]]:
    """task id → the outcome of each of its traces, in trace order.

    ``task_ids``: the keys, in this order, each present even with no trace; a trace of another task
    raises KeyError. Without them the keys are the tasks the traces hold, in order of first trace.
    ``infra``: how an infrastructure failure counts, one of ``INFRA``.
    """
    if infra not in INFRA:
        raise ValueError(f"infra must be one of {INFRA}, got {infra!r}")
    named = task_ids is not None
    out: dict[str, list[bool | None]] = {tid: [] for tid in task_ids} if named else {}
    for trace in traces:
        if infra != "fail" and trace.infra_failure:
            if infra == "drop":
                continue
            outcome = None
        else:
            outcome = bool(trace.passed)
        if named:
            if trace.task_id not in out:
                raise KeyError(f"trace {trace.trace_id!r} is of task {trace.task_id!r}, not one of the tasks named")
            out[trace.task_id].append(outcome)
        else:
            out.setdefault(trace.task_id, []).append(outcome)
    return out


def _check(outcomes: Mapping[str, Sequence[bool]]) -> None:
    for task, attempts in outcomes.items():
        if len(attempts) == 0:
            raise ValueError(f"outcomes[{task!r}] is empty; pass@k needs at least one attempt")


def task_pass_at_k(outcomes: Mapping[str, Sequence[bool]]) -> dict[str, bool]:
    """task id → whether any of its attempts passed (the per-task pass@k the seesaw gate and the
    drift monitor compare); every task needs at least one attempt."""
    _check(outcomes)
    return {task: any(bool(a) for a in attempts) for task, attempts in outcomes.items()}


def pass_at_1(outcomes: Mapping[str, Sequence[bool]]) -> float:
    """The mean over tasks of each task's share of passing attempts; 0.0 without tasks."""
    _check(outcomes)
    return sum(sum(o) / len(o) for o in outcomes.values()) / len(outcomes) if outcomes else 0.0


def pass_at_k(outcomes: Mapping[str, Sequence[bool]]) -> float:
    """The share of tasks with at least one passing attempt (k = their attempts); 0.0 without tasks."""
    _check(outcomes)
    return sum(any(o) for o in outcomes.values()) / len(outcomes) if outcomes else 0.0


def pass_rates(outcomes: Mapping[str, Sequence[bool]]) -> tuple[float, float]:
    """(pass@1, pass@k) of ``outcomes``."""
    return pass_at_1(outcomes), pass_at_k(outcomes)
