"""Evaluate a harness and policy on one split of an environment: pass@1, pass@k, mean reward."""

from __future__ import annotations

import inspect
import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coevo.agent.rollouts import Rollout, RolloutService
from coevo.agent.trace import Trace
from coevo.envs.base import check_split
from coevo.harness.harness import Harness
from coevo.safety.secrets import redact, redact_text, secret_env_values
from coevo.safety.traces import redact_trace

if TYPE_CHECKING:
    from coevo.envs.base import Env, Task


@dataclass
class EvalReport:
    env: str
    split: str
    harness_id: str
    model_version: str
    attempts: int
    n_tasks: int
    pass_at_1: float
    pass_at_k: float
    mean_reward: float
    errors: int
    seconds: float
    prompt_tokens: int
    completion_tokens: int
    outcomes: dict[str, list[bool]]
    partial: bool = False  # stopped before every episode ended: the figures are those of the episodes that did


def evaluate(
    harness: Harness,
    rollouts: RolloutService,
    split: str = "test",
    *,
    attempts: int = 1,
    limit: int | None = None,
    on_trace: Callable[[Trace], None] | None = None,
    on_partial: Callable[[EvalReport, list[Trace]], None] | None = None,
) -> tuple[EvalReport, list[Trace]]:
    """Run every task of ``split`` (the first ``limit``) ``attempts`` times on ``harness``, through
    ``rollouts`` (its policy, env, batching, step limit and progress display); ``on_trace`` gets each
    trace as its episode ends (``TraceLog.append`` keeps them on disk as they come). Stopped
    (Ctrl-C, or SIGTERM where the caller raises on it) after some episodes ended, ``on_partial``
    gets the report of those episodes (``partial=True``) before the stop propagates.

    ``limit`` is passed on to the env when its ``tasks`` takes a ``limit`` keyword
    (``tasks(split, limit=None)``), so an env whose tasks are expensive to list (a benchmark that
    loads or generates each one) builds only those; otherwise the whole split is listed and cut."""
    check_split(split)
    if attempts < 1:
        raise ValueError("attempts must be >= 1")
    env, policy = rollouts.env, rollouts.policy
    tasks = first_tasks(env, split, limit)
    if not tasks:
        raise ValueError(f"env {env.name!r} has no tasks in split {split!r}")
    start = time.perf_counter()
    ended: list[Trace] = []

    def keep(trace: Trace) -> None:
        ended.append(trace)
        if on_trace is not None:
            on_trace(trace)

    def report_of(done: Rollout, partial: bool) -> EvalReport:
        traces = done.traces
        return EvalReport(
            env=env.name, split=split, harness_id=harness.id, model_version=policy.model_version,
            attempts=attempts, n_tasks=len(done.task_ids), pass_at_1=done.pass_at_1, pass_at_k=done.pass_at_k,
            mean_reward=sum(t.reward for t in traces) / len(traces), errors=sum(t.error is not None for t in traces),
            seconds=round(time.perf_counter() - start, 3),
            prompt_tokens=int(sum(t.cost.get("prompt_tokens", 0) for t in traces)),
            completion_tokens=int(sum(t.cost.get("completion_tokens", 0) for t in traces)),
            outcomes=done.outcomes(), partial=partial)

    try:
        done = rollouts.run(harness, tasks, attempts=attempts, phase=None, label=f"{env.name}/{split} episodes",
                            on_trace=keep)
    except (KeyboardInterrupt, SystemExit):
        if ended and on_partial is not None:  # the tasks with an ended episode, in the split's order
            seen = {t.task_id for t in ended}
            order = [t.task_id for t in tasks if t.task_id in seen]
            rank = {task_id: i for i, task_id in enumerate(order)}
            ended.sort(key=lambda t: rank[t.task_id])
            on_partial(report_of(Rollout(list(ended), order, attempts), partial=True), list(ended))
        raise
    return report_of(done, partial=False), done.traces


class TraceLog:
    """``traces.jsonl`` appended (redacted, flushed) as episodes end, so an evaluation that is
    stopped keeps every episode it finished; ``write_eval`` rewrites it in task order at the end."""

    def __init__(self, path: Path, tokenizer: Any | None = None) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path, self.tokenizer, self.secrets = path, tokenizer, secret_env_values()
        self.lock = threading.Lock()
        path.write_text("")

    def append(self, trace: Trace) -> None:
        if self.secrets:
            trace = redact_trace(trace, self.tokenizer, self.secrets)
        line = json.dumps(trace.to_dict()) + "\n"
        with self.lock, open(self.path, "a") as f:
            f.write(line)


def first_tasks(env: Env, split: str, limit: int | None) -> list[Task]:
    """The first ``limit`` tasks of ``split`` (all when None), asking the env for only those when
    its ``tasks`` accepts a ``limit`` keyword."""
    if limit is None:
        return list(env.tasks(split))
    try:
        takes_limit = "limit" in inspect.signature(env.tasks).parameters
    except (TypeError, ValueError):  # no signature to read (a builtin or C callable)
        takes_limit = False
    tasks = env.tasks(split, limit=limit) if takes_limit else env.tasks(split)
    return list(tasks)[:limit]  # an env may ignore the keyword


def markdown_report(report: EvalReport, traces: Sequence[Trace]) -> str:
    """Aggregate and per-task tables of an evaluation, for people (a pass@k column only when
    there were several attempts: with one, pass@k is pass@1)."""
    k = report.attempts
    pass_k_head, pass_k = (f"pass@{k} | ", f"{report.pass_at_k:.3f} | ") if k > 1 else ("", "")
    lines = [
        f"# Evaluation: {report.env} / {report.split}",
        "",
        f"harness `{report.harness_id}`, policy `{report.model_version}`, {report.n_tasks} tasks x {k} attempts",
        "",
        *(["**Partial**: the evaluation was stopped; these are the episodes that ended.", ""]
          if report.partial else []),
        f"| pass@1 | {pass_k_head}mean reward | errors | prompt tokens | completion tokens | seconds |",
        "|---|---|---|---|---|---|" + ("---|" if k > 1 else ""),
        f"| {report.pass_at_1:.3f} | {pass_k}{report.mean_reward:.3f} | {report.errors} | "
        f"{report.prompt_tokens} | {report.completion_tokens} | {report.seconds:.1f} |",
        "",
        "## Per task",
        "",
        "| task | passed | mean reward | completion tokens | seconds | stop reasons | error |",
        "|---|---|---|---|---|---|---|",
    ]
    by_task: dict[str, list[Trace]] = {}
    for t in traces:
        by_task.setdefault(t.task_id, []).append(t)
    for task_id, ts in by_task.items():
        errors = "; ".join(sorted({t.error for t in ts if t.error}))[:120]
        lines.append(
            f"| {task_id} | {sum(t.passed for t in ts)}/{len(ts)} | {sum(t.reward for t in ts) / len(ts):.2f} | "
            f"{sum(t.cost.get('completion_tokens', 0) for t in ts)} | "
            f"{sum(t.cost.get('seconds', 0) for t in ts):.1f} | "
            f"{', '.join(sorted({str(t.stop_reason) for t in ts}))} | {errors.replace('|', '/')} |"
        )
    return "\n".join(lines) + "\n"


def write_eval(out_dir: str | Path, harness: Harness, report: EvalReport, traces: Sequence[Trace], *,
               tokenizer: Any | None = None) -> Path:
    """Write harness.yaml, traces.jsonl, summary.json and report.md into ``out_dir``.

    Redacted as a run directory is: a task or a tool output may quote a secret environment value, so
    traces go through ``redact_trace`` (with the policy's ``tokenizer``, the token ids that spell a
    key are re-encoded; without one, a call that showed it loses its ids), the other files through
    ``redact``; the harness YAML redacts itself (``Harness.to_yaml``)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    secrets = secret_env_values()
    harness.save(out / "harness.yaml")
    traces = [redact_trace(t, tokenizer, secrets) for t in traces] if secrets else list(traces)
    with open(out / "traces.jsonl", "w") as f:
        for t in traces:
            f.write(json.dumps(t.to_dict()) + "\n")
    (out / "summary.json").write_text(json.dumps(redact(asdict(report), secrets), indent=2))
    (out / "report.md").write_text(redact_text(markdown_report(report, traces), secrets))
    return out
