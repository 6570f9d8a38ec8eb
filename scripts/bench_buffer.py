"""Replay-buffer throughput on this machine: insert and iterate, for realistic traces.

    python scripts/bench_buffer.py [--section buffer] [--traces 512] [--add-batch 64] [--calls 4]
                                   [--prompt-tokens 300] [--completion-tokens 150] [--repeats 3]

Prints Markdown tables (median over repeats, min-max alongside) headed by the command that made
them. Each ``Section`` is one named measurement with its own options; ``main()`` runs the ones
asked for (default: all), so further comparisons are added as sections next to ``buffer``.

Sections:

- ``buffer``: the log-prob function returns precomputed rows, so the figures are the buffer's own
  cost (encode, write, fsync, read, decode), not a model's forward pass. Reads hit a warm page
  cache (the files were just written): they measure decoding, not the disk.
- ``grpo_step``: why the buffer caches behaviour log-probs. One GRPO step on replayed traces with
  the cached log-probs, against the same step preceded by the forward pass an uncached trainer
  needs to recompute them (the old policy's log-probs must come from the checkpoint that sampled,
  so without the cache that checkpoint must also be kept and run). Interleaved, same process.
"""

from __future__ import annotations

import argparse
import random
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from coevo.agent.trace import ModelCall, Trace
from coevo.buffers import LogprobQuery, ReplayBuffer


@dataclass(frozen=True)
class Section:
    """One named benchmark: registers its options, then returns its Markdown given the parsed args."""

    name: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], str]


# -- buffer section ----------------------------------------------------------------------------


def realistic_trace(index: int, *, calls: int, prompt_tokens: int, completion_tokens: int) -> Trace:
    """A multi-turn episode: each call's prompt grows by the previous turn, text ~4 chars/token."""
    rng = random.Random(index)

    def text(tokens: int) -> str:
        return "".join(rng.choice("abcdefgh ij") for _ in range(4 * tokens))

    history = [{"role": "system", "content": text(60)}, {"role": "user", "content": text(prompt_tokens - 60)}]
    model_calls = []
    for step in range(calls):
        completion = text(completion_tokens)
        model_calls.append(
            ModelCall(
                step=step,
                messages=list(history),
                prompt_ids=[rng.randrange(49_152) for _ in range(prompt_tokens)],
                completion_ids=[rng.randrange(49_152) for _ in range(completion_tokens)],
                sampler_logprobs=[-rng.random() * 3 for _ in range(completion_tokens)],
                text=completion,
                finish_reason="stop",
            )
        )
        history = history + [{"role": "assistant", "content": completion}, {"role": "tool", "content": text(20)}]
    return Trace(
        trace_id=f"bench-{index}",
        task_id=f"task-{index % 16}",
        env="reasoning",
        split="train",
        harness_id=f"h{index % 3}",
        variant="base",
        model_version="bench",
        events=[{"hook": "model_output", "step": s} for s in range(calls)],
        model_calls=model_calls,
        messages=history,
        final_answer="42",
        reward=float(index % 2),
        passed=bool(index % 2),
        cost={"prompt_tokens": float(calls * prompt_tokens), "completion_tokens": float(calls * completion_tokens)},
    )


def _buffer_arguments(ap: argparse.ArgumentParser) -> None:
    group = ap.add_argument_group("buffer section")
    group.add_argument("--traces", type=int, default=512, help="traces inserted per repeat")
    group.add_argument("--add-batch", type=int, default=64, help="traces per add() call (one round)")
    group.add_argument("--read-batch", type=int, default=32, help="traces per iter_batches batch")
    group.add_argument("--calls", type=int, default=4, help="model calls per trace")
    group.add_argument("--prompt-tokens", type=int, default=300)
    group.add_argument("--completion-tokens", type=int, default=150)
    group.add_argument("--dir", default=None, help="where the buffers are written (default: the system temp dir)")


def _segment_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.glob("*.seg"))


def _run_buffer(args: argparse.Namespace) -> str:
    traces = [
        realistic_trace(i, calls=args.calls, prompt_tokens=args.prompt_tokens, completion_tokens=args.completion_tokens)
        for i in range(args.traces)
    ]
    rows = {id(c.completion_ids): [-0.5] * len(c.completion_ids) for t in traces for c in t.model_calls}

    def cached_logprobs(queries: Sequence[LogprobQuery]) -> list[list[float]]:
        return [rows[id(q.completion_ids)] for q in queries]

    batches = [traces[i : i + args.add_batch] for i in range(0, len(traces), args.add_batch)]
    results: dict[str, list[tuple[float, float | None]]] = {}  # label -> [(traces/s, MB/s or None)]

    def record(label: str, n: int, nbytes: int | None, seconds: float) -> None:
        results.setdefault(label, []).append((n / seconds, None if nbytes is None else nbytes / seconds / 1e6))

    bytes_per_trace = 0.0
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
            for t in traces:
                t.behaviour_logprobs = None
            path = Path(tmp) / "full"
            with ReplayBuffer(path, capacity=len(traces)) as buf:
                start = time.perf_counter()
                for r, batch in enumerate(batches):
                    buf.add(batch, round=r, model_version=r, logprob_fn=cached_logprobs)
                seconds = time.perf_counter() - start
                nbytes = _segment_bytes(path)
                bytes_per_trace = nbytes / len(traces)
                record(f"add, {args.add_batch} traces per call (fsync per call)", len(traces), nbytes, seconds)

                start = time.perf_counter()
                n = sum(len(b) for b in buf.iter_batches(args.read_batch))
                record(f"iter_batches({args.read_batch}), seq order", n, nbytes, time.perf_counter() - start)
                start = time.perf_counter()
                n = sum(len(b) for b in buf.iter_batches(args.read_batch, shuffle_seed=0))
                record(f"iter_batches({args.read_batch}), shuffled", n, nbytes, time.perf_counter() - start)

            start = time.perf_counter()
            with ReplayBuffer(path, capacity=len(traces)) as buf:
                assert len(buf) == len(traces)
            record("reopen (index rebuilt from segment headers)", len(traces), None, time.perf_counter() - start)
            start = time.perf_counter()
            with ReplayBuffer(path, capacity=len(traces)) as buf:
                assert not buf.verify()
            record("reopen + verify() (every payload's CRC: what a resume and an export check)", len(traces),
                   _segment_bytes(path), time.perf_counter() - start)

            for t in traces:
                t.behaviour_logprobs = None
            churn = Path(tmp) / "churn"
            with ReplayBuffer(churn, capacity=max(args.add_batch, len(traces) // 4)) as buf:
                start = time.perf_counter()
                for r, batch in enumerate(batches):
                    buf.add(batch, round=r, model_version=r, logprob_fn=cached_logprobs)
                seconds = time.perf_counter() - start
            record(
                f"add with FIFO eviction (capacity {max(args.add_batch, len(traces) // 4)})",
                len(traces),
                nbytes,
                seconds,
            )

    tokens = args.calls * (args.prompt_tokens + args.completion_tokens)
    lines = [
        (
            f"{args.traces} traces x {args.calls} model calls x ({args.prompt_tokens} prompt + "
            f"{args.completion_tokens} completion tokens) = {tokens} tokens/trace; "
            f"{bytes_per_trace / 1024:.1f} KiB/trace on disk; repeats={args.repeats}"
        ),
        "",
        "| operation | traces/s (median) | MB/s (median) | traces/s min-max |",
        "|---|---|---|---|",
    ]
    for label, values in results.items():
        rates = [v[0] for v in values]
        mbs = [v[1] for v in values if v[1] is not None]
        mb = f"{statistics.median(mbs):,.1f}" if mbs else "-"
        lines.append(f"| {label} | {statistics.median(rates):,.0f} | {mb} | {min(rates):,.0f}-{max(rates):,.0f} |")
    return "\n".join(lines)


# -- grpo_step section -------------------------------------------------------------------------


def _grpo_arguments(ap: argparse.ArgumentParser) -> None:
    group = ap.add_argument_group("grpo_step section")
    group.add_argument("--model", default="smollm2", help="smollm2, tiny, or a local model path")
    group.add_argument("--step-traces", type=int, default=8, help="traces per GRPO step (2 tasks x n/2)")
    group.add_argument("--step-prompt", type=int, default=256, help="prompt tokens per model call")
    group.add_argument("--step-completion", type=int, default=64, help="completion tokens per model call")
    group.add_argument("--lora", action="store_true", help="train a LoRA adapter instead of all weights")


def _run_grpo_step(args: argparse.Namespace) -> str:
    import torch

    from coevo.buffers.logprobs import behaviour_logprobs
    from coevo.config.schema import TrainerConfig
    from coevo.policy.load import load_model
    from coevo.trainers.grpo import GRPOTrainer, apply_lora
    from coevo.trainers.logprobs import logprob_fn

    torch.manual_seed(0)
    model, tok = load_model(args.model, device="cpu", dtype="float32")
    if args.lora:
        model = apply_lora(model)
    rng = random.Random(0)
    vocab = len(tok)
    traces = []
    for i in range(args.step_traces):
        call = ModelCall(0, [], [rng.randrange(3, vocab) for _ in range(args.step_prompt)],
                         [rng.randrange(3, vocab) for _ in range(args.step_completion)], None, "", "stop",
                         temperature=1.0)
        traces.append(Trace(f"t{i}", f"task-{i % 2}", "bench", "train", "h", "base", "0",
                            model_calls=[call], reward=float(i % 4 < 2), passed=i % 4 < 2))
    fn = logprob_fn(model, tok.pad_token_id, temperature=1.0, batch_size=args.step_traces)
    config = TrainerConfig(lr=1e-7, micro_batch_size=args.step_traces)
    trainer = GRPOTrainer(model, config, pad_id=tok.pad_token_id, total_steps=1000, loss_horizon=None,
                          drop_zero_variance=False)
    times: dict[str, list[float]] = {"cached": [], "recompute": [], "forward": []}

    def attach() -> float:
        start = time.perf_counter()
        for t, rows in zip(traces, behaviour_logprobs(traces, fn), strict=True):
            t.behaviour_logprobs = rows
        return time.perf_counter() - start

    attach()
    trainer.step(traces)  # warm-up: allocator, autograd graph, optimizer state
    for _ in range(args.repeats):
        start = time.perf_counter()
        trainer.step(traces)
        times["cached"].append(time.perf_counter() - start)
        start = time.perf_counter()
        forward = attach()
        trainer.step(traces)
        times["recompute"].append(time.perf_counter() - start)
        times["forward"].append(forward)
    med = {k: statistics.median(v) for k, v in times.items()}
    tokens = args.step_traces * (args.step_prompt + args.step_completion)
    return "\n".join([
        (f"model={args.model}{' + LoRA' if args.lora else ' (all weights)'}, {args.step_traces} traces x "
        f"({args.step_prompt} prompt + {args.step_completion} completion) = {tokens} tokens/step, fp32, "
        f"torch threads={torch.get_num_threads()}, repeats={args.repeats} (interleaved)"),
        "",
        "| step | median s | min-max s | ratio to cached |",
        "|---|---|---|---|",
        (f"| GRPO step, cached behaviour log-probs | {med['cached']:.2f} | "
        f"{min(times['cached']):.2f}-{max(times['cached']):.2f} | 1.00 |"),
        (f"| recompute log-probs (no-grad forward) + GRPO step | {med['recompute']:.2f} | "
        f"{min(times['recompute']):.2f}-{max(times['recompute']):.2f} | {med['recompute'] / med['cached']:.2f} |"),
        (f"| of which the recompute forward | {med['forward']:.2f} | "
        f"{min(times['forward']):.2f}-{max(times['forward']):.2f} | {med['forward'] / med['cached']:.2f} |"),
    ])


SECTIONS: dict[str, Section] = {
    s.name: s for s in [Section("buffer", _buffer_arguments, _run_buffer), Section("grpo_step", _grpo_arguments, _run_grpo_step)]
}


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--section", action="append", choices=sorted(SECTIONS), help="run only these (repeatable)")
    ap.add_argument("--repeats", type=int, default=3)
    for section in SECTIONS.values():
        section.add_arguments(ap)
    args = ap.parse_args(argv)
    command = shlex.join(["python", "scripts/bench_buffer.py", *(sys.argv[1:] if argv is None else argv)])
    print(f"`{command}`  (python {sys.version.split()[0]}, {sys.platform})")
    for name in args.section or list(SECTIONS):
        print(f"\n### {name}\n")
        print(SECTIONS[name].run(args), flush=True)


if __name__ == "__main__":
    main()
