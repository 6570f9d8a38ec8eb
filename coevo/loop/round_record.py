"""The record of one round (a line of ``rounds.jsonl``), from what the round produced: its train
traces, the evaluations, AEGIS's report and the GRPO update (``coevo.loop.coevolution`` calls it)."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from coevo.agent.outcomes import task_outcomes
from coevo.agent.rollouts import infra_failures, tool_use_rate, trace_tokens
from coevo.agent.trace import Trace
from coevo.policy.heap import high_water_mb, reset_high_water
from coevo.rundir.evolve_records import EvolveReport
from coevo.rundir.records import (
    BufferStats,
    Evaluation,
    GRPOMetrics,
    RoundRecord,
    TrainStats,
    VariantStats,
)


class PhaseClock:
    """Wall seconds and peak resident memory per phase of one round: ``with clock("grpo"):`` adds the
    block's time to its phase (a phase timed twice, e.g. snapshot selection then validation under
    "eval", sums), and ``close`` adds "total" and "other" (the time in no phase), so the phases sum
    to the total. ``with clock("evolve", timed=False):`` tracks only the memory of a block whose
    time other phases already count. ``peak_mb``: the highest resident memory (MB) seen inside
    each phase, phases nested in it included, and in "other" between phases; empty where the
    kernel does not keep a resettable peak (``coevo.policy.heap``)."""

    def __init__(self) -> None:
        self.began = time.perf_counter()
        self.seconds: dict[str, float] = defaultdict(float)
        self.peak_mb: dict[str, float] = {}
        self._open: list[str] = []  # the phases the current block is inside, outermost first
        self._tracks = reset_high_water()

    def _fold_peak(self) -> None:
        """The peak since the last reset, credited to every open phase (or "other"), then reset."""
        if not self._tracks:
            return
        peak = high_water_mb()
        if peak is not None:
            for phase in self._open or ["other"]:
                self.peak_mb[phase] = round(max(self.peak_mb.get(phase, 0.0), peak), 1)
        reset_high_water()

    @contextmanager
    def __call__(self, phase: str, *, timed: bool = True) -> Iterator[None]:
        self._fold_peak()
        self._open.append(phase)
        tick = time.perf_counter()
        try:
            yield
        finally:
            if timed:
                self.seconds[phase] += time.perf_counter() - tick
            self._fold_peak()
            self._open.remove(phase)

    def close(self) -> dict[str, float]:
        """The phases with "total" and "other" added."""
        self._fold_peak()
        total = time.perf_counter() - self.began
        return {**self.seconds, "total": total, "other": max(0.0, total - sum(self.seconds.values()))}


def train_stats(traces: Sequence[Trace]) -> TrainStats:
    """Pass rate, mean reward, tool use, tokens and outcomes per task of a round's episodes."""
    return TrainStats(pass_rate=sum(t.passed for t in traces) / len(traces),
                      mean_reward=sum(t.reward for t in traces) / len(traces),
                      n_traces=len(traces), tool_use_rate=tool_use_rate(traces), tokens=trace_tokens(traces),
                      prompt_tokens=int(sum(t.cost.get("prompt_tokens", 0) for t in traces)),
                      outcomes=task_outcomes(traces))


def round_record(r: int, mode: str, version: int, traces: Sequence[Trace], seconds: dict[str, float], *,
                 unscaffolded: Sequence[Trace] = (), val: Evaluation | None, test: Evaluation | None,
                 evolved: EvolveReport | None,
                 grpo: GRPOMetrics | None, variants: dict[str, str], meta_tokens: dict[str, Any],
                 buffer: BufferStats | None) -> RoundRecord:
    """Round ``r``'s record: the train batch's pass rate, reward, tool use, tokens and outcomes per
    task and per harness variant, its infrastructure failures, the same for the episodes without
    the scaffolding (``unscaffolded``, when the round ran any), and the parts given."""
    by_variant: dict[str, list[Trace]] = defaultdict(list)
    for t in traces:
        by_variant[t.variant].append(t)
    return RoundRecord(
        round=r,
        mode=mode,
        model_version=version,
        seconds=dict(seconds),
        train=train_stats(traces),
        val=val,
        test=test,
        infra_failures=infra_failures(traces),
        variants=variants,
        by_variant={v: VariantStats(sum(t.passed for t in ts) / len(ts), len(ts)) for v, ts in by_variant.items()},
        evolve=evolved,
        grpo=grpo,
        meta_tokens=meta_tokens,
        buffer=buffer,
        unscaffolded=train_stats(unscaffolded) if unscaffolded else None,
    )
