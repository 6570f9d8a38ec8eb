"""GRPO steps on a tiny model, whole or sharded by FSDP2, saving the full weights after each step;
launched by test_fsdp.py as one process and as two gloo ranks (``accelerate launch --multi_gpu
--num_processes 2``).

    python -m tests.trainers.fsdp_worker OUT MICRO_BATCH [--sharded] [--lora] [--adamw] [--save DIR] [--resume DIR]

``--save DIR`` checkpoints the trainer after step 1 into DIR; ``--resume DIR`` loads it and runs
step 2 only, which must equal step 2 of the run that saved it."""

import argparse

import torch
from accelerate import Accelerator

from coevo.loop.launch import end_rank, torn_down_on_exit
from coevo.policy.tiny import tiny_model, tiny_tokenizer
from coevo.trainers import sharding
from tests.trainers.helpers import synthetic_traces, worker_trainer

STEPS = 3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("micro_batch_size", type=int)
    ap.add_argument("--sharded", action="store_true")
    ap.add_argument("--lora", action="store_true")
    ap.add_argument("--adamw", action="store_true", help="AdamW (optimizer state to save and resume) instead of SGD")
    ap.add_argument("--save")
    ap.add_argument("--resume")
    args = ap.parse_args()
    accelerator = Accelerator(cpu=True)
    with torn_down_on_exit(accelerator):  # as train.py: the process group is destroyed before the interpreter goes
        steps(accelerator, args)


def steps(accelerator, args: argparse.Namespace) -> None:
    tok = tiny_tokenizer()
    trainer = worker_trainer(tok, accelerator, lora=args.lora, adamw=args.adamw, micro_batch_size=args.micro_batch_size,
                             sharding="fsdp2" if args.sharded else "none", total_steps=STEPS)
    first = 0
    if args.resume:
        trainer.load(args.resume)
        first = 2
    # step k's traces are the same in every launch: the step's seed and the initial model's log-probs,
    # shifted (nothing depends on how far the weights have moved, so a resumed run sees them too)
    reference = tiny_model(tok, seed=0, arch="llama")
    states = {}
    for step in range(first, STEPS):
        trainer.step(synthetic_traces(reference, tok, n_tasks=3, per_task=3, seed=step, stale=0.1, system=40))
        full = sharding.full_model_state(trainer.model) if args.sharded else trainer.unwrapped.state_dict()
        states[step] = {k: v.detach().cpu().clone() for k, v in full.items()}
        if args.save and step == 1:
            trainer.save(args.save)
    if accelerator.is_main_process:
        torch.save(states, args.out)
    print(f"rank {accelerator.process_index} of {accelerator.num_processes} done", flush=True)


if __name__ == "__main__":
    main()
    end_rank()  # as train.py
