"""How the trained weights are held across ranks: one object per ``trainer.sharding``.

The GRPO step is the same algorithm whatever holds the weights; what differs is where gradients
are reduced, who clips and steps, and how a checkpoint gathers or scatters the state. Each
strategy owns the wrapped model and its optimizer and answers those questions, so the trainer's
step reads as the algorithm with one delegate:

- ``Whole``: whole weights on every rank: one process, or DDP through accelerate;
- ``FSDP2``: parameters sharded by FSDP2 (``coevo.trainers.sharding``) before the optimizer exists;
- ``ZeRO3``: DeepSpeed's engine partitions parameters, gradients and optimizer state
  (``coevo.trainers.zero``), and clips and steps itself.
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import torch

from coevo.trainers import sharding, zero

if TYPE_CHECKING:
    from accelerate import Accelerator
    from accelerate.utils import DeepSpeedPlugin

Module = torch.nn.Module


def trainable(model: Module) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


class Whole:
    """Whole weights on every rank. A rank with no sequence of its own takes part in DDP's gradient
    reduction with a zero loss and no forward."""

    name = "none"
    every_rank_forwards = False
    """Whether a rank without sequences must still run a forward (sharded: each gathers parameters
    with every rank)."""
    reads_shared_prefix = True
    """Whether a micro-batch may read its rows' common prefix once, then the rows (two forwards
    through a layer before its backward)."""

    def __init__(self, accelerator: Accelerator) -> None:
        self.accelerator = accelerator
        self.model: Module | None = None  # the wrapped model: DDP's module, FSDP2's, or DeepSpeed's engine
        self.optimizer: torch.optim.Optimizer | None = None

    def prepare_model(self, model: Module, *, reshard_after_forward: bool) -> None:
        """Before the optimizer is made over the model's parameters (FSDP2 shards them here)."""

    def wrap(self, model: Module, optimizer: torch.optim.Optimizer) -> None:
        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)

    def accumulating(self, last: bool) -> AbstractContextManager[object]:
        """The context of one micro-batch's forward and backward: gradients are reduced across ranks
        once, at the step's ``last`` micro-batch (DDP's ``no_sync`` before it)."""
        return contextlib.nullcontext() if last else self.accelerator.no_sync(self.model)

    def backward(self, loss: torch.Tensor) -> None:
        self.accelerator.backward(loss)

    def gathered(self, param: torch.nn.Parameter) -> AbstractContextManager[torch.nn.Parameter]:
        """``param`` whole for the body (the LM head the fused loss reads): as it is, unsharded."""
        return contextlib.nullcontext(param)

    def step(self, max_grad_norm: float) -> float:
        """Clip to ``max_grad_norm``, step, zero the gradients; the gradient norm before clipping
        (over every rank's gradients)."""
        grad_norm = self._clip(trainable(self.model), max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm

    def _clip(self, params: list[torch.nn.Parameter], max_norm: float) -> float:
        return float(self.accelerator.clip_grad_norm_(params, max_norm))

    def full_state(self) -> tuple[dict[str, torch.Tensor] | None, dict[str, Any]]:
        """(whole weights, or None for the model's own ``state_dict``; the optimizer's state) on rank 0.
        Sharded, a collective: every rank calls it."""
        return None, self.optimizer.state_dict()

    def load_weights(self, unwrapped: Module, tensors: dict[str, torch.Tensor]) -> None:
        """Whole ``tensors`` (a checkpoint's, in ``save_pretrained`` names) into the model."""
        if hasattr(unwrapped, "peft_config"):
            from peft import set_peft_model_state_dict

            set_peft_model_state_dict(unwrapped, tensors)
            return
        missing, unexpected = unwrapped.load_state_dict(tensors, strict=False)
        tied = {k for k in missing if "lm_head" in k}  # tied heads are not saved twice
        if set(missing) - tied or unexpected:
            raise ValueError(f"checkpoint does not match the model: missing {missing}, unexpected {unexpected}")

    def load_optimizer(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state)


class FSDP2(Whole):
    """Parameters sharded by FSDP2 over the process group; gradients reduced at the last micro-batch
    by its sync flag. Not the shared-prefix read: FSDP2 frees a layer's gathered parameters after
    each forward, and two forwards before one backward leave the first one's freed (measured:
    torch 2.13 fails the backward)."""

    name = "fsdp2"
    every_rank_forwards = True
    reads_shared_prefix = False

    def prepare_model(self, model: Module, *, reshard_after_forward: bool) -> None:
        if not torch.distributed.is_initialized():
            raise ValueError("trainer.sharding=fsdp2 needs a process group: launch with accelerate launch "
                             "(--multi_gpu --num_processes N, or --config_file configs/accelerate/fsdp2.yaml)")
        sharding.shard_model(model, reshard_after_forward=reshard_after_forward)

    def wrap(self, model: Module, optimizer: torch.optim.Optimizer) -> None:
        self.model, self.optimizer = model, optimizer  # already sharded; accelerate would add DDP on top

    def accumulating(self, last: bool) -> AbstractContextManager[object]:
        sharding.set_gradient_sync(self.model, last)
        return contextlib.nullcontext()

    def _clip(self, params: list[torch.nn.Parameter], max_norm: float) -> float:
        return sharding.clip_grad_norm(params, max_norm)

    def full_state(self) -> tuple[dict[str, torch.Tensor] | None, dict[str, Any]]:
        return sharding.full_model_state(self.model), sharding.full_optimizer_state(self.model, self.optimizer)

    def load_weights(self, unwrapped: Module, tensors: dict[str, torch.Tensor]) -> None:
        sharding.load_full_model_state(unwrapped, sharding.model_keys(unwrapped, tensors))

    def load_optimizer(self, state: dict[str, Any]) -> None:
        sharding.load_full_optimizer_state(self.model, self.optimizer, state)


class ZeRO3(Whole):
    """DeepSpeed ZeRO-3 (a DeepSpeed launch's plugin): the engine partitions the model in place,
    reduces every backward into each rank's slice (told where the step ends: its accumulation
    boundary), and clips (its ``gradient_clipping``) and steps itself. ZeRO-3 gathers a module's
    parameters again for each forward's backward, so the shared-prefix read works
    (tests/trainers/test_zero3.py)."""

    name = "zero3"
    every_rank_forwards = True

    def __init__(self, accelerator: Accelerator, plugin: DeepSpeedPlugin, *, max_grad_norm: float) -> None:
        super().__init__(accelerator)
        self.plugin, self.max_grad_norm = plugin, max_grad_norm
        self.dtypes: dict[str, torch.dtype] = {}  # the weights' dtypes, as a checkpoint writes them

    def wrap(self, model: Module, optimizer: torch.optim.Optimizer) -> None:
        zero.configure(self.plugin.deepspeed_config, max_grad_norm=self.max_grad_norm,
                       world=self.accelerator.num_processes)
        zero.plain_transformers(self.plugin)  # save_pretrained of the gathered weights as one process writes them
        self.dtypes = {name: t.dtype for name, t in model.state_dict().items()}
        super().wrap(model, optimizer)  # DeepSpeed's engine and its optimizer around ``optimizer``

    def accumulating(self, last: bool) -> AbstractContextManager[object]:
        zero.set_boundary(self.model, last)
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        zero.backward(self.model, loss)  # the engine's own: accelerate's would also step it

    def gathered(self, param: torch.nn.Parameter) -> AbstractContextManager[torch.nn.Parameter]:
        """Gathered from every rank's partition for the body (a collective), partitioned again after;
        a backward through it must run inside the body."""
        return zero.whole(param)

    def step(self, max_grad_norm: float) -> float:
        """DeepSpeed clips inside its own step, at the config's ``gradient_clipping``, set once from
        ``trainer.max_grad_norm`` (``wrap``); a step asking for another norm is refused rather than
        silently clipped at the configured one."""
        if max_grad_norm != self.max_grad_norm:
            raise ValueError(f"ZeRO-3 clips at gradient_clipping={self.max_grad_norm:g}, set when the model was "
                             f"wrapped; this step asked for max_grad_norm={max_grad_norm:g}")
        return zero.step(self.model)

    def full_state(self) -> tuple[dict[str, torch.Tensor] | None, dict[str, Any]]:
        return zero.full_model_state(self.model, self.dtypes), zero.full_optimizer_state(self.model)

    def load_weights(self, unwrapped: Module, tensors: dict[str, torch.Tensor]) -> None:
        zero.load_full_model_state(self.model, sharding.model_keys(unwrapped, tensors))

    def load_optimizer(self, state: dict[str, Any]) -> None:
        zero.load_full_optimizer_state(self.model, state)


SHARDINGS = ("none", "fsdp2", "zero3")
"""``trainer.sharding``: ``Whole``, ``FSDP2`` or ``ZeRO3``."""


def strategy_for(name: str, accelerator: Accelerator, *, max_grad_norm: float) -> Whole:
    """The strategy ``trainer.sharding=name`` names, checked against the launch: ZeRO-3 and a DeepSpeed
    launch go together."""
    if name not in SHARDINGS:
        raise ValueError(f"config trainer.sharding={name!r}; choose one of {sorted(SHARDINGS)}")
    plugin = accelerator.state.deepspeed_plugin  # a DeepSpeed launch's config; None under any other launch
    if (name == "zero3") != (plugin is not None):
        raise ValueError(f"trainer.sharding={name!r} under accelerate's {accelerator.distributed_type}: DeepSpeed "
                         "ZeRO-3 and trainer.sharding=zero3 go together (accelerate launch --config_file "
                         "configs/accelerate/zero3.yaml sets it)")
    if name == "zero3":
        return ZeRO3(accelerator, plugin, max_grad_norm=max_grad_norm)
    return FSDP2(accelerator) if name == "fsdp2" else Whole(accelerator)
