"""Peak memory of one GRPO step on a run's buffered traces, for a ``trainer.micro_batch_tokens`` value.

    python scripts/grpo_step_memory.py runs/distill_s0/buffer --micro-batch-tokens none
    python scripts/grpo_step_memory.py runs/distill_s0/buffer --micro-batch-tokens 2048
    python scripts/grpo_step_memory.py runs/dn_s0/buffer --distill-demos nearest --gradient-checkpointing
    python scripts/grpo_step_memory.py runs/tl_s1/buffer --distill-demos both --blocks-mapped --micro-batch-tokens 1024

Run each value in its own process: the figure is the process's peak RSS (``ru_maxrss``). The model is
the embedded SmolLM2-135M with the runs' LoRA shape (r 16), fp32; the traces are the buffer's first
``--traces`` in groups with a reward spread (what a step trains on), read from a copy of the buffer.
docs/PERF.md records the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import resource
import shutil
import tempfile
import time

from coevo.policy import heap


def step_trainer(buffer: str, *, traces: int, micro_batch_tokens: int | None, distill: str | None,
                 checkpointing: bool = False) -> tuple:
    """(a GRPOTrainer as the distill runs train, the buffer's first ``traces`` traces in groups with a
    reward spread), read from a copy of ``buffer``: the embedded SmolLM2-135M with the runs' LoRA
    shape (r 16) in fp32, the prefill credited, the demonstrations distilled under ``distill``
    (``trainer.distill_prompt``; None: not distilled). Also scripts/step_memory_parts.py's."""
    from bench_grpo_step import spread_traces  # scripts/ is on the path of a script run from it

    from coevo.config.schema import TrainerConfig
    from coevo.policy.load import load_model
    from coevo.trainers.grpo import GRPOTrainer, apply_lora

    copy = tempfile.mkdtemp() + "/buffer"
    shutil.copytree(buffer, copy)
    chosen = spread_traces(copy, traces)
    model, tok = load_model("smollm2", dtype="float32")
    model = apply_lora(model, r=16, alpha=32, dropout=0.0)
    cfg = TrainerConfig(lr=1e-5, micro_batch_tokens=micro_batch_tokens, distill_demos=distill is not None,
                        distill_prompt=distill or "all", credit_prefill=True, gradient_checkpointing=checkpointing)
    return GRPOTrainer(model, cfg, pad_id=tok.pad_token_id, total_steps=10, loss_horizon=None), chosen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("buffer", help="a run's replay buffer directory (it is copied first)")
    ap.add_argument("--micro-batch-tokens", default="2048", help="an integer, or none (rows only)")
    ap.add_argument("--traces", type=int, default=48)
    ap.add_argument("--distill-demos", nargs="?", const="all", choices=("all", "nearest", "both"),
                    help="train the distilled copies as the run did (under the prompt without every "
                         "demonstration, without the nearest, or under both: trainer.distill_prompt)")
    ap.add_argument("--gradient-checkpointing", action="store_true", help="trainer.gradient_checkpointing=true")
    ap.add_argument("--blocks-mapped", action="store_true",
                    help="the step inside coevo.policy.heap.blocks_mapped, as the loop's GRPO phase runs it")
    args = ap.parse_args()

    tokens = None if args.micro_batch_tokens == "none" else int(args.micro_batch_tokens)
    trainer, chosen = step_trainer(args.buffer, traces=args.traces, micro_batch_tokens=tokens,
                                   distill=args.distill_demos, checkpointing=args.gradient_checkpointing)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    start = time.perf_counter()
    with heap.blocks_mapped() if args.blocks_mapped else contextlib.nullcontext():
        trainer.step(chosen)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"micro_batch_tokens={tokens}, gradient_checkpointing={args.gradient_checkpointing}, "
          f"blocks_mapped={args.blocks_mapped}: {len(chosen)} traces, "
          f"step {time.perf_counter() - start:.1f} s, "
          f"peak RSS {peak:.0f} MB (before the step {before:.0f} MB)", flush=True)


if __name__ == "__main__":
    main()
