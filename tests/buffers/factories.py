"""Deterministic traces and log-prob functions for the buffer tests (also used by the crash writer).

Everything is a pure function of its arguments so a test can rebuild the exact trace a
subprocess stored and compare it field by field.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from coevo.agent.trace import ModelCall, ToolCallRecord, Trace
from coevo.buffers import LogprobQuery


def make_trace(
    trace_id: str,
    *,
    task_id: str = "task-0",
    harness_id: str = "h0",
    variant: str = "base",
    reward: float = 0.0,
    n_calls: int = 2,
    prompt_len: int = 12,
    completion_len: int = 5,
    seed: int = 0,
) -> Trace:
    """A trace with ``n_calls`` model calls of varying length; the last call is not trainable."""
    rng = random.Random(f"{trace_id}/{seed}")
    calls = []
    for step in range(n_calls):
        n_prompt = prompt_len + rng.randrange(4)
        n_completion = completion_len + rng.randrange(4)
        calls.append(
            ModelCall(
                step=step,
                messages=[{"role": "user", "content": f"step {step} of {trace_id}"}],
                prompt_ids=[rng.randrange(50_000) for _ in range(n_prompt)],
                completion_ids=[rng.randrange(50_000) for _ in range(n_completion)],
                sampler_logprobs=[-rng.random() * 5 for _ in range(n_completion)],
                text=f"answer {step}",
                finish_reason="stop",
                trainable=step < n_calls - 1 or n_calls == 1,
                loss_weight=1.0 if step % 2 == 0 else 0.5,
                # sampled, greedy, and a call recorded before calls kept their sampling parameters
                temperature=(0.7, 0.0, None)[step % 3],
                top_p=(0.95, 1.0, None)[step % 3],
                max_new_tokens=(256, 64, None)[step % 3],
            )
        )
    return Trace(
        trace_id=trace_id,
        task_id=task_id,
        env="arithmetic",
        split="train",
        harness_id=harness_id,
        variant=variant,
        model_version="m0",
        events=[{"hook": "task_start", "step": 0}],
        model_calls=calls,
        tool_calls=[
            ToolCallRecord(step=0, name="python", arguments={"code": "1+1"}, output="2", error=None, seconds=0.01)
        ],
        messages=[{"role": "user", "content": "what is 1+1?"}],
        final_answer="2",
        reward=reward,
        passed=reward > 0,
        cost={"prompt_tokens": 10.0},
        metrics={"steps": n_calls},
    )


def fake_logprobs(queries: Sequence[LogprobQuery]) -> list[list[float]]:
    """A deterministic stand-in for the model's forward pass: depends on prompt length and token."""
    return [[-((len(q.prompt_ids) + j + tok) % 97) / 10 - 0.01 for j, tok in enumerate(q.completion_ids)]
            for q in queries]


def batch_traces(batch: int) -> list[Trace]:
    """Batch ``batch`` of the crash test's writer: 3..6 traces, ids that name the batch."""
    size = 3 + batch % 4
    return [
        make_trace(
            f"b{batch}-t{k}",
            task_id=f"task-{(batch + k) % 5}",
            reward=float(k % 2),
            n_calls=3,
            prompt_len=300,
            completion_len=150,
            seed=batch,
        )
        for k in range(size)
    ]
