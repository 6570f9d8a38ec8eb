"""What a run did to the agent, in the terms a reader came for: pass@1 of the starting agent against
the final one on the same held-out tasks (with paired 95% intervals), the harness edits that
shipped, train pass and tool use by round, and the reward GRPO climbed.

The start row is ``start.json`` (the starting harness and weights, evaluated before round 0), the
end row the last round's evaluation; both on the sealed test split when the run tests, else on
validation. The interval of the change resamples tasks and keeps each task paired with itself
(``coevo.report.stats.bootstrap``), which is what makes 50 tasks enough to see a 25-point change.
``result_lines`` is what the terminal prints last and ``summary.md`` opens with.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from coevo.report.stats import bootstrap
from coevo.rundir.records import Evaluation, RoundRecord, StartRecord, Verdict

Interval = tuple[float, float, float]
"""(estimate, 2.5th percentile, 97.5th percentile)."""


@dataclass
class Result:
    split: str | None  # "test" | "val" | None (the run evaluated neither at both ends)
    tasks: int
    start: Interval | None  # pass@1 of the starting agent
    end: Interval | None  # pass@1 of the final agent
    change: Interval | None  # end - start, paired over tasks
    start_tool_use: float = 0.0  # share of the held-out episodes that called a tool, at each end
    end_tool_use: float = 0.0
    shipped: list[tuple[int, str]] = field(default_factory=list)  # (round, the edits in words)
    rounds: list[int] = field(default_factory=list)
    train_pass: list[float] = field(default_factory=list)  # per round
    tool_use: list[float] = field(default_factory=list)  # per round
    reward: list[float] = field(default_factory=list)  # mean reward of the round's rollouts (GRPO's objective)
    step_rewards: list[float] = field(default_factory=list)  # every GRPO step's mean reward, in order


def per_task_pass(outcomes: Mapping[str, Sequence[bool]], task_ids: Sequence[str]) -> np.ndarray:
    """pass@1 of each task in ``task_ids`` (the mean over its attempts): [tasks]."""
    return np.array([float(np.mean(outcomes[t])) if outcomes[t] else 0.0 for t in task_ids])


def in_words(verdict: Verdict, width: int = 110) -> str:
    """A shipped edit as its operations and the meta-agent's intent: the last clause of its
    hypothesis (the rule agent's and the LLM prompt's hypotheses end with what the edit does)."""
    intent = verdict.proposal.hypothesis.rsplit("; ", 1)[-1].strip()
    text = verdict.describe_edits() + (f": {intent}" if intent else "")
    return text if len(text) <= width else text[: width - 1] + "…"


def compare(before: Evaluation, after: Evaluation, seed: int = 0) -> tuple[int, Interval, Interval, Interval]:
    """(tasks, start, end, change) over the tasks both evaluations ran, each with its 95% interval."""
    tasks = sorted(set(before.outcomes) & set(after.outcomes))
    b = per_task_pass(before.outcomes, tasks)[None, :]  # [1 seed, tasks]
    a = per_task_pass(after.outcomes, tasks)[None, :]
    draws = [np.random.default_rng(seed) for _ in range(3)]  # the same task draws for all three
    return len(tasks), bootstrap(b, draws[0]), bootstrap(a, draws[1]), bootstrap(a - b, draws[2])


def run_result(records: Sequence[RoundRecord], start: StartRecord | None) -> Result:
    """The ``Result`` of a run's round records and its start record."""
    split, pair = None, None
    for name in ("test", "val"):
        before = getattr(start, name) if start is not None else None
        after = next((getattr(r, name) for r in reversed(records) if getattr(r, name) is not None), None)
        if before is not None and after is not None:
            split, pair = name, (before, after)
            break
    tasks, begin, end, change = compare(*pair) if pair else (0, None, None, None)
    tools = (pair[0].tool_use_rate, pair[1].tool_use_rate) if pair else (0.0, 0.0)
    steps = [s for r in records if r.grpo is not None for s in r.grpo.steps]
    return Result(
        split=split, tasks=tasks, start=begin, end=end, change=change, start_tool_use=tools[0], end_tool_use=tools[1],
        shipped=[(r.round, in_words(v)) for r in records for v in r.verdicts if v.ship],
        rounds=[r.round for r in records],
        train_pass=[r.train.pass_rate for r in records],
        tool_use=[r.train.tool_use_rate for r in records],
        reward=[r.train.mean_reward for r in records],
        step_rewards=[s.reward_mean for s in steps],
    )


def _pct(x: Interval) -> str:
    return f"{100 * x[0]:.1f}% [{100 * x[1]:.1f}, {100 * x[2]:.1f}]"


def _points(x: Interval) -> str:
    return f"{100 * x[0]:+.1f} points [{100 * x[1]:+.1f}, {100 * x[2]:+.1f}]"


def _series(values: Sequence[float], percent: bool = True) -> str:
    return " → ".join(f"{100 * v:.0f}%" if percent else f"{v:.2f}" for v in values)


def result_lines(result: Result) -> list[str]:
    """The result in a few plain lines (the terminal's last, ``summary.md``'s first)."""
    if result.change is None:
        lines = ["agent pass@1: not evaluated at both ends (set test=true, or val_limit > 0)"]
    else:
        assert result.start is not None and result.end is not None
        lines = [f"agent pass@1 on {result.tasks} held-out {result.split} tasks (95% CI): "
                 f"start {_pct(result.start)} → end {_pct(result.end)}",
                 f"change: {_points(result.change)} (paired over tasks); "
                 f"tool use {100 * result.start_tool_use:.0f}% → "
                 f"{100 * result.end_tool_use:.0f}%"]
    if result.shipped:
        lines += [f"shipped in round {r}: {edits}" for r, edits in result.shipped]
    else:
        lines.append("shipped: no harness edit")
    lines += [f"train pass by round: {_series(result.train_pass)}",
              f"tool use by round: {_series(result.tool_use)}",
              f"mean reward by round: {_series(result.reward, percent=False)}"]
    if result.step_rewards:
        lines.append(f"GRPO steps: {len(result.step_rewards)}, reward per step "
                     f"{' '.join(f'{v:.2f}' for v in result.step_rewards)}")
    return lines
