"""The agent runtime: Harness × Policy × Env → Trace, for many tasks at once.

Each episode is a generator (``coevo.agent.episode.EpisodeRun``) that runs the harness's hooks and
yields a ``ChatRequest`` whenever it needs the model. ``run_episodes`` drives all episodes
together: it gathers the pending requests into batches for the policy (one ``generate`` call serves
many episodes) and advances the episodes between model calls in a thread pool, so slow tools
overlap. ``run_attempts`` is the k-attempts-per-task form every caller uses through the rollout
service (``coevo.agent.rollouts``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from coevo.agent.demos import with_demo_spans
from coevo.agent.episode import RESET_TIMEOUT_S, TOOL_TIMEOUT_S, Episode, EpisodeRun, Job
from coevo.agent.policy import ChatRequest, Generation, Policy
from coevo.agent.program_episode import ProgramEpisodeRun
from coevo.agent.trace import Trace
from coevo.config.schema import RolloutConfig
from coevo.envs.base import Env, Task
from coevo.envs.program_env import ProgramEnv
from coevo.harness.harness import Harness


def start_episode(job: Job, env: Env, model_version: str, max_steps: int, *,
                  reset_timeout_s: float = RESET_TIMEOUT_S, tool_timeout_s: float = TOOL_TIMEOUT_S) -> Episode:
    """``job``'s episode, not yet advanced: a program-driven one when ``env`` runs programs (the
    program asks and the episode answers), else coevo's own loop over the env's session."""
    if isinstance(env, ProgramEnv):
        return ProgramEpisodeRun(job, env, model_version, max_steps).run()
    return EpisodeRun(job, env, model_version, max_steps, reset_timeout_s=reset_timeout_s,
                      tool_timeout_s=tool_timeout_s).run()


def run_episodes(
    jobs: Sequence[Job],
    policy: Policy,
    env: Env,
    *,
    batch_size: int = RolloutConfig.batch_size,  # the schema's defaults, stated there only
    workers: int = RolloutConfig.workers,
    max_steps: int = RolloutConfig.max_steps,
    on_trace: Callable[[Trace], None] | None = None,
    reset_timeout_s: float = RESET_TIMEOUT_S,
    tool_timeout_s: float = TOOL_TIMEOUT_S,
) -> list[Trace]:
    """Run every job to completion; traces come back in job order.

    ``batch_size`` bounds the requests per ``policy.generate`` call; ``workers`` the threads that
    run tools and processors between model calls; ``max_steps`` is a hard cap per episode on top
    of whatever budget the harness sets. ``on_trace`` is called as each episode finishes.
    ``reset_timeout_s`` bounds each ``env.reset`` and ``tool_timeout_s`` each tool call (on top of
    the harness's ``tool_timeout``; ``coevo.agent.episode`` says what ends at the limit).

    An env with an integer ``max_sessions`` (a simulator process per session, say) has at
    most that many sessions open at once: episodes start in job order as others finish. Without
    it every episode starts at once, so all their first model calls share batches.
    """
    if batch_size < 1 or workers < 1:
        raise ValueError("batch_size and workers must be >= 1")
    limit = env.max_sessions
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        raise ValueError(f"env {env.name!r}: max_sessions must be an integer >= 1, got {limit!r}")
    runs = [start_episode(job, env, policy.model_version, max_steps, reset_timeout_s=reset_timeout_s,
                          tool_timeout_s=tool_timeout_s) for job in jobs]
    traces: list[Trace | None] = [None] * len(runs)
    pending: dict[int, ChatRequest] = {}
    started = 0

    def advance(i: int, value: Generation | BaseException | None) -> None:
        gen = runs[i]
        try:
            if value is None:
                request = next(gen)
            elif isinstance(value, BaseException):
                request = gen.throw(value)
            else:
                request = gen.send(value)
        except StopIteration as stop:
            traces[i] = stop.value
            if on_trace is not None:
                on_trace(stop.value)
            return
        pending[i] = request

    def start_more() -> None:
        """Start the next episodes in job order while fewer than ``limit`` sessions are open."""
        nonlocal started
        live = started - sum(t is not None for t in traces[:started])
        room = len(runs) - started if limit is None else max(0, limit - live)
        new = range(started, min(len(runs), started + room))
        started = new.stop if len(new) else started
        list(pool.map(lambda i: advance(i, None), new))

    # a program-driven episode holds its thread while its program works (as a native one does during a
    # tool call); programs are separate processes, so every live one gets a thread and their requests
    # meet in the same batches instead of arriving ``workers`` at a time
    threads = max(workers, min(len(runs), batch_size)) if isinstance(env, ProgramEnv) else workers
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="coevo-episode") as pool:
        start_more()
        while pending or started < len(runs):
            if not pending:
                start_more()
                continue
            ids = sorted(pending)[:batch_size]
            requests = [pending.pop(i) for i in ids]
            try:
                generations: list[Generation | BaseException] = list(policy.generate(requests))
                if len(generations) != len(requests):
                    raise RuntimeError(f"policy returned {len(generations)} generations for {len(requests)} requests")
                generations = with_demo_spans(policy, requests, generations)
            except Exception as err:
                generations = [err] * len(ids)
            list(pool.map(lambda pair: advance(*pair), zip(ids, generations, strict=True)))
            start_more()
    return [t for t in traces if t is not None]


def run_attempts(
    tasks: Sequence[Task],
    harness: Harness | Sequence[Harness],
    policy: Policy,
    env: Env,
    *,
    attempts: int = 1,
    variant: str | Sequence[str] = "base",
    trace_id: Callable[[Task, int], str] | None = None,
    batch_size: int = RolloutConfig.batch_size,  # the schema's defaults, stated there only
    workers: int = RolloutConfig.workers,
    max_steps: int = RolloutConfig.max_steps,
    on_trace: Callable[[Trace], None] | None = None,
    reset_timeout_s: float = RESET_TIMEOUT_S,
    tool_timeout_s: float = TOOL_TIMEOUT_S,
) -> list[list[Trace]]:
    """``attempts`` episodes of every task in one ``run_episodes`` call; per task (in the order of
    ``tasks``, a task named twice counted twice) its traces in attempt order.

    ``harness`` and ``variant``: one for every task, or one per task (parallel to ``tasks``: the
    variant AEGIS routed it to, say). ``trace_id(task, attempt)`` names each trace (a random id
    without it). The jobs run task by task, attempt by attempt, which fixes the order in which a
    seeded policy samples: callers that reseed do so before this call. ``batch_size``, ``workers``,
    ``max_steps``, ``on_trace`` and the timeouts: as in ``run_episodes``.
    """
    if attempts < 1:
        raise ValueError(f"attempts must be >= 1, got {attempts}")
    harnesses = [harness] * len(tasks) if isinstance(harness, Harness) else list(harness)
    variants = [variant] * len(tasks) if isinstance(variant, str) else list(variant)
    if len(harnesses) != len(tasks) or len(variants) != len(tasks):
        raise ValueError(f"{len(tasks)} tasks, but {len(harnesses)} harnesses and {len(variants)} variants")
    jobs = [Job(task, h, variant=v, trace_id=None if trace_id is None else trace_id(task, a))
            for task, h, v in zip(tasks, harnesses, variants, strict=True) for a in range(attempts)]
    traces = run_episodes(jobs, policy, env, batch_size=batch_size, workers=workers, max_steps=max_steps,
                          on_trace=on_trace, reset_timeout_s=reset_timeout_s, tool_timeout_s=tool_timeout_s)
    return [traces[i * attempts : (i + 1) * attempts] for i in range(len(tasks))]


def run_episode(task: Task, harness: Harness, policy: Policy, env: Env, **kwargs: Any) -> Trace:
    return run_episodes([Job(task, harness)], policy, env, **kwargs)[0]
