"""Generation throughput of the embedded model on this machine: one request at a time vs batched.

    python scripts/bench_generation.py [--model smollm2] [--new-tokens 64] [--repeats 3]

Prints completion tokens per second for batch sizes 1 (sequential), 8 and 16, measured
interleaved (1, 8, 16, 1, 8, 16, ...) so that machine noise hits every setting alike; the
figures in docs/PERF.md come from this script.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from coevo.agent.policy import ChatRequest
from coevo.envs.arithmetic import ArithmeticEnv
from coevo.harness.events import SamplingParams
from coevo.policy.load import transformers_policy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--requests", type=int, default=16)
    args = ap.parse_args()

    policy = transformers_policy(args.model, max_batch_size=64)
    tasks = [t for split in ("train", "val", "test") for t in ArithmeticEnv(n_tasks=4 * args.requests).tasks(split)]
    system = {"role": "system", "content": "Solve the problem. Give the final answer as <answer>...</answer>."}
    sampling = SamplingParams(temperature=0.0, max_new_tokens=args.new_tokens)
    requests = [ChatRequest([system, {"role": "user", "content": t.instruction}], sampling) for t in tasks[: args.requests]]
    policy.generate(requests[:2])  # warm-up
    rates: dict[int, list[float]] = {1: [], 8: [], 16: []}
    for _ in range(args.repeats):
        for batch in rates:
            start = time.perf_counter()
            if batch == 1:
                gens = [policy.generate([r])[0] for r in requests[:8]]
            else:
                gens = policy.generate(requests[:batch])
            seconds = time.perf_counter() - start
            rates[batch].append(sum(len(g.completion_ids) for g in gens) / seconds)
    print(f"model={args.model} torch={torch.__version__} threads={torch.get_num_threads()} "
          f"max_new_tokens={args.new_tokens} repeats={args.repeats}")
    print("| batch | completion tokens/s (median) | min | max |")
    print("|---|---|---|---|")
    for batch, values in rates.items():
        label = "1 (sequential, 8 requests)" if batch == 1 else str(batch)
        print(f"| {label} | {statistics.median(values):.1f} | {min(values):.1f} | {max(values):.1f} |")


if __name__ == "__main__":
    main()
