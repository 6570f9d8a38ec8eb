"""Where one GRPO step's memory goes: the tensors autograd keeps for the backward, part by part.

    python scripts/step_memory_parts.py runs/db_s0/buffer --distill-demos both

Runs one step of ``GRPOTrainer`` on a run's buffered traces (as scripts/grpo_step_memory.py does:
its ``step_trainer``: the embedded SmolLM2-135M, LoRA r16, fp32) with a
``saved_tensors_hooks`` pair that records every tensor saved for the backward by storage (a storage
counts once, parameters never), labelled by the pass that saved it (the shared prompt's pass, the
rows' own pass, or the loss) and the innermost module that ran (attention, MLP, norms, LoRA, the
decoder's own tensors). The table is the largest micro-batch's: what is alive just before its
backward, beside the process's resident memory before the step and its peak (``VmHWM``).
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections import defaultdict
from functools import partial

import torch

PARTS = (("lora_", "LoRA"), ("self_attn", "attention"), ("mlp", "MLP"), ("norm", "norms"), ("embed", "embedding"))
"""Module-name fragment → the part its saved tensors count under (the first fragment that matches)."""


def part_of(module_name: str) -> str:
    return next((label for frag, label in PARTS if frag in module_name), "decoder (residual, rotary, masks)")


class SavedTensors:
    """Records the storages autograd saves, per micro-batch, by (pass, part)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self.stack: list[str] = []
        self.pass_name = "loss"  # outside the decoder: the loss's own tensors
        self.last = ""  # the decoder pass before this one
        self.micro: list[dict[int, tuple[str, str, int]]] = []
        for name, m in model.named_modules():
            m.register_forward_pre_hook(partial(self._push, name))
            m.register_forward_hook(self._pop)
        decoder = next(m for m in model.modules() if hasattr(m, "layers") and hasattr(m, "embed_tokens"))
        decoder.register_forward_pre_hook(self._enter, with_kwargs=True)
        decoder.register_forward_hook(lambda *_: setattr(self, "pass_name", "loss"))

    def _push(self, name: str, _m: torch.nn.Module, _args: tuple) -> None:
        self.stack.append(name)

    def _pop(self, _m: torch.nn.Module, _args: tuple, _out: object) -> None:  # None: the output stays
        self.stack.pop()

    def _enter(self, _m: torch.nn.Module, _args: tuple, kwargs: dict) -> None:
        """A decoder forward opens a micro-batch, except the rows' pass after its shared prompt's."""
        prefix = bool(kwargs.get("use_cache"))
        if prefix or self.last != "shared prompt":
            self.micro.append({})
        self.pass_name = self.last = "shared prompt" if prefix else "rows"

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in self.params and self.micro and ptr not in self.micro[-1]:
            module = self.stack[-1] if self.stack else ""
            self.micro[-1][ptr] = (self.pass_name, part_of(module), storage.nbytes())
        return t

    def largest(self) -> dict[tuple[str, str], int]:
        big = max(self.micro, key=lambda m: sum(n for _, _, n in m.values()))
        out: dict[tuple[str, str], int] = defaultdict(int)
        for pass_name, part, n in big.values():
            out[(pass_name, part)] += n
        return dict(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("buffer", help="a run's replay buffer directory (it is copied first)")
    ap.add_argument("--traces", type=int, default=48)
    ap.add_argument("--micro-batch-tokens", type=int, default=2048)
    ap.add_argument("--distill-demos", nargs="?", const="all", choices=("all", "nearest", "both"))
    ap.add_argument("--mmap-threshold", type=int, default=None,
                    help="run the step inside coevo.policy.heap.blocks_mapped(BYTES), as the loop does (the default: "
                         "glibc's own, adjusting threshold)")
    args = ap.parse_args()

    from grpo_step_memory import step_trainer  # scripts/ is on the path of a script run from it

    from coevo.policy.heap import blocks_mapped, reset_high_water, status_kib

    trainer, chosen = step_trainer(args.buffer, traces=args.traces, micro_batch_tokens=args.micro_batch_tokens,
                                   distill=args.distill_demos)
    saved = SavedTensors(trainer.unwrapped)
    before = status_kib("VmRSS")
    reset_high_water()
    start = time.perf_counter()
    mapped = blocks_mapped(args.mmap_threshold) if args.mmap_threshold is not None else contextlib.nullcontext()
    with mapped, torch.autograd.graph.saved_tensors_hooks(saved.pack, lambda t: t):
        trainer.step(chosen)
    seconds = time.perf_counter() - start
    peak = status_kib("VmHWM")
    parts = saved.largest()
    mb = 2**20
    print(f"mmap threshold {args.mmap_threshold or 'glibc default'}: step {seconds:.1f} s")
    print(f"{len(chosen)} traces, {len(saved.micro)} micro-batches; resident before the step "
          f"{(before or 0) / 1024:.0f} MB, peak {(peak or 0) / 1024:.0f} MB (MB = 2^20 bytes)")
    print("| pass | part | saved for the backward (MB) |\n|---|---|---|")
    for (pass_name, part), n in sorted(parts.items(), key=lambda kv: -kv[1]):
        print(f"| {pass_name} | {part} | {n / mb:.0f} |")
    print(f"| all | | {sum(parts.values()) / mb:.0f} |")


if __name__ == "__main__":
    main()
