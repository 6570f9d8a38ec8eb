"""GRPO steps on a tiny model, whole or partitioned by DeepSpeed ZeRO-3, recording the full weights after
each step; launched by test_zero3.py as one process and as two CPU ranks
(``DS_ACCELERATOR=cpu accelerate launch --config_file configs/accelerate/zero3.yaml --num_processes 2``).

    python -m tests.trainers.zero3_worker OUT MICRO_BATCH [--zero3] [--lora] [--adamw] [--beta B] [--save DIR]
        [--resume DIR]

``OUT`` (rank 0) holds {"steps": {step: weights}, "metrics": {step: (lr, grad_norm)}}; under
``--zero3`` each rank also writes ``OUT.rank{r}.json``: the accelerate state it ran under, each
parameter's local and whole sizes after ``prepare``, and what the fused loss received as the LM head
(shape, whether a ZeRO-3 parameter, kernel). ``--save DIR`` checkpoints the trainer after step 1;
``--resume DIR`` loads it and runs step 2 only, which must equal step 2 of the run that saved it."""

import argparse
import json

import torch

from coevo.loop.launch import end_rank, launch_accelerator, torn_down_on_exit
from coevo.policy.tiny import tiny_model, tiny_tokenizer
from coevo.trainers import grpo, sharding, zero
from tests.trainers.helpers import synthetic_traces, worker_trainer

STEPS = 3
CALLS = (2, 1, 2)  # model calls per trace at each step: step 1's 9 sequences leave rank 1 a zero-weight filler forward


def record_loss_inputs(calls: list) -> None:
    """Wrap the trainer's fused loss to note the LM head it is handed."""
    original = grpo.grpo_loss

    def spy(hidden, weight, *args, impl, **kwargs):
        calls.append({"hidden": list(hidden.shape), "weight": list(weight.shape), "impl": impl,
                      "zero_param": zero.is_partitioned(weight)})
        return original(hidden, weight, *args, impl=impl, **kwargs)

    grpo.grpo_loss = spy


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("micro_batch_size", type=int)
    ap.add_argument("--zero3", action="store_true")
    ap.add_argument("--lora", action="store_true")
    ap.add_argument("--adamw", action="store_true", help="AdamW (optimizer state to save and resume) instead of SGD")
    ap.add_argument("--beta", type=float, default=0.0, help="KL weight (LoRA: the reference is the adapter-less base)")
    ap.add_argument("--save")
    ap.add_argument("--resume")
    args = ap.parse_args()
    if args.zero3:
        accelerator, strategy, _ = launch_accelerator("cpu", "no")  # train.py's path
    else:
        from accelerate import Accelerator

        accelerator, strategy = Accelerator(cpu=True), None
    with torn_down_on_exit(accelerator):  # as train.py: the process group is destroyed before the interpreter goes
        steps(accelerator, strategy, args)


def steps(accelerator, strategy: str | None, args: argparse.Namespace) -> None:
    tok = tiny_tokenizer()
    trainer = worker_trainer(tok, accelerator, lora=args.lora, adamw=args.adamw, micro_batch_size=args.micro_batch_size,
                             sharding=strategy or "none", total_steps=STEPS, beta=args.beta)
    calls: list = []
    record_loss_inputs(calls)
    sizes = {name: {"local": p.numel(), "shard": p.ds_tensor.numel() if zero.is_partitioned(p) else None,
                    "whole": getattr(p, "ds_numel", p.numel())}
             for name, p in trainer.unwrapped.named_parameters()}
    first = 0
    if args.resume:
        trainer.load(args.resume)
        first = 2
    # step k's traces are the same in every launch: the step's seed and the initial model's log-probs,
    # shifted (nothing depends on how far the weights have moved, so a resumed run sees them too)
    reference = tiny_model(tok, seed=0, arch="llama")
    steps, metrics = {}, {}
    for step in range(first, STEPS):
        traces = synthetic_traces(reference, tok, n_tasks=3, per_task=3, calls=CALLS[step], seed=step, stale=0.1,
                                  system=40)  # a 40-token common prefix: the shared-prefix forward
        m = trainer.step(traces)
        full = sharding.full_model_state(trainer.model) if args.zero3 else trainer.unwrapped.state_dict()
        steps[step] = {k: v.detach().cpu().clone() for k, v in full.items()}
        metrics[step] = (m.lr, m.grad_norm)
        if args.save and step == 1:
            trainer.save(args.save)
    if accelerator.is_main_process:
        torch.save({"steps": steps, "metrics": metrics}, args.out)
    if args.zero3:
        ds_config = accelerator.state.deepspeed_plugin.deepspeed_config
        state = {"distributed_type": str(accelerator.distributed_type), "processes": accelerator.num_processes,
                 "rank": accelerator.process_index, "bf16": ds_config.get("bf16", {}).get("enabled"),
                 "sizes": sizes, "loss_calls": calls}
        with open(f"{args.out}.rank{accelerator.process_index}.json", "w") as f:
            json.dump(state, f)
    print(f"rank {accelerator.process_index} of {accelerator.num_processes} done", flush=True)


if __name__ == "__main__":
    main()
    end_rank()  # as train.py
