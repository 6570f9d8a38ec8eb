"""What one GRPO step and the buffer's behaviour log-probs cost on real multi-turn traces, with and
without packing a trace's chained calls into one row and reading a micro-batch's shared prompt
prefix once, and with recomputed vs sampler log-probs.

    python scripts/bench_grpo_step.py BUFFER_DIR [--traces 16] [--repeats 2] [--micro-batch-size 8]

BUFFER_DIR is a run's replay buffer (copied: the bench opens it for writing its lock), e.g. the
tool-path harness's ``runs/learn2/s0/buffer``. The model is the embedded SmolLM2-135M with the run's
LoRA shape (r 16 on q/k/v/o), the traces the buffer's first ``--traces`` whose group has a reward
spread (what a step trains on). Steps alternate between the variants (one row per call; packed;
packed with the shared prefix read once) on the same weights (lr 0), so all time the same work;
docs/PERF.md records the figures.
"""

from __future__ import annotations

import argparse
import time

import torch


def spread_traces(buffer_dir: str, n: int) -> list:
    """The first ``n`` traces of ``buffer_dir`` in groups with a reward spread (what a step trains on)."""
    from coevo.buffers import ReplayBuffer

    with ReplayBuffer(buffer_dir, capacity=4096) as buf:
        traces = buf.load(buf.entries())
    by_task: dict[str, list] = {}
    for t in traces:
        by_task.setdefault(t.task_id, []).append(t)
    chosen = [t for group in by_task.values() if len({t.reward for t in group}) > 1 for t in group][:n]
    if not chosen:
        raise SystemExit("no group with a reward spread in that buffer")
    return chosen


def main() -> None:
    from coevo.buffers.logprobs import behaviour_logprobs, sampler_first
    from coevo.config.schema import TrainerConfig
    from coevo.policy.load import load_model
    from coevo.trainers.batch import pack_calls, training_sequences
    from coevo.trainers.grpo import GRPOTrainer, apply_lora
    from coevo.trainers.logprobs import logprob_fn

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("buffer", help="a replay buffer directory (a copy)")
    ap.add_argument("--traces", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--micro-batch-size", type=int, default=8)
    args = ap.parse_args()

    chosen = spread_traces(args.buffer, args.traces)
    model, tok = load_model("smollm2", dtype="float32")
    model = apply_lora(model, r=16, alpha=32, dropout=0.0)
    seqs = training_sequences(chosen, torch.zeros(len(chosen)))
    rows = pack_calls(seqs)
    tokens = lambda items: sum(len(s.prompt_ids) + len(s.completion_ids) for s in items)  # noqa: E731
    print(f"{len(chosen)} traces, {len(seqs)} calls -> {len(rows)} packed rows; "
          f"tokens read per step: {tokens(seqs)} one row per call")

    fn = logprob_fn(model, tok.pad_token_id, temperature=0.7, batch_size=8)
    start = time.perf_counter()
    behaviour_logprobs(chosen, fn)
    recompute = time.perf_counter() - start
    start = time.perf_counter()
    behaviour_logprobs(chosen, logprob_fn(model, tok.pad_token_id, temperature=0.7, batch_size=8, share_prefix=True))
    recompute_shared = time.perf_counter() - start
    start = time.perf_counter()
    behaviour_logprobs(chosen, sampler_first(chosen, fn))
    sampler = time.perf_counter() - start
    print(f"behaviour log-probs: recomputed {recompute:.1f} s, recomputed with the shared prefix read once "
          f"{recompute_shared:.1f} s, from the sampler {sampler:.3f} s")

    variants = {"one row per call": (False, False), "packed rows": (True, False),
                "packed rows, shared prefix read once": (True, True)}
    figures: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.repeats):
        for name, (pack, share) in variants.items():
            cfg = TrainerConfig(lr=0.0, micro_batch_size=args.micro_batch_size)
            trainer = GRPOTrainer(model, cfg, pad_id=tok.pad_token_id, total_steps=10, loss_horizon=None,
                                  pack_calls=pack, share_prefix=share)
            start = time.perf_counter()
            trainer.step(chosen)
            figures[name].append(time.perf_counter() - start)
    for name, values in figures.items():
        times = ", ".join(f"{v:.1f} s" for v in values)
        print(f"GRPO step ({args.micro_batch_size} rows a micro-batch), {name}: {times}")


if __name__ == "__main__":
    main()
