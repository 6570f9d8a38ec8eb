"""Run a few GRPO steps on a tiny model and save the parameters after each step; launched once with one process
and once with ``accelerate launch --multi_gpu --num_processes 2`` by test_distributed.py."""

import sys

import torch
from accelerate import Accelerator

from coevo.loop.launch import end_rank, torn_down_on_exit
from coevo.policy.tiny import tiny_model, tiny_tokenizer
from tests.trainers.helpers import make_trainer, synthetic_traces


def main(out: str, micro_batch_size: int) -> None:
    accelerator = Accelerator(cpu=True)
    with torn_down_on_exit(accelerator):  # as train.py: the process group is destroyed before the interpreter goes
        steps(accelerator, out, micro_batch_size)


def steps(accelerator, out: str, micro_batch_size: int) -> None:
    tok = tiny_tokenizer()
    model = tiny_model(tok, seed=0)
    trainer = make_trainer(model, tok, accelerator=accelerator, lr=0.5, optimizer="sgd", max_grad_norm=1e9,
                           micro_batch_size=micro_batch_size, aggregation="sequence_mean", kernel="chunked")
    states = []
    for step in range(3):
        traces = synthetic_traces(trainer.unwrapped, tok, n_tasks=3, per_task=3, seed=step, stale=0.1,
                                  system=40)  # the shared-prefix path (GRPOTrainer's share_prefix)
        trainer.step(traces)
        states.append({k: v.detach().cpu().clone() for k, v in trainer.unwrapped.state_dict().items()})
    if accelerator.is_main_process:
        torch.save(states, out)
    print(f"rank {accelerator.process_index} of {accelerator.num_processes} done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
    end_rank()  # as train.py
