"""FSDP2 for the GRPO trainer: parameters, gradients and optimizer state sharded over the ranks.

coevo applies ``torch.distributed.fsdp.fully_shard`` itself (each decoder layer a unit, then the
root) instead of handing the model to ``accelerator.prepare``: accelerate turns FSDP on only for
GPU process groups, and one wrapping path for CPU (gloo, where the tests run it) and GPU (NCCL,
``accelerate launch --config_file configs/accelerate/fsdp2.yaml``) means the tested path is the
one a cluster runs.

Why the trainer's loss still works sharded: FSDP2 keeps the root unit's parameters (embeddings,
final norm, the LM head tied to or beside them) gathered between the root's forward and its
backward, so ``lm_head_weight`` read after the forward is the whole [V, H] matrix and the fused
loss can apply it to the hidden states outside the module; its gradient is reduce-scattered like
every other. Checkpoints gather full state dicts on rank 0 (``torch.distributed.checkpoint``), so a
sharded run saves the same files as one process and resumes from them on any number of ranks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

import torch

if TYPE_CHECKING:
    from torch.distributed.checkpoint.state_dict import StateDictOptions
    from torch.distributed.fsdp import FSDPModule

ModuleT = TypeVar("ModuleT", bound=torch.nn.Module)


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks of a causal LM (under a PEFT wrapper): the modules named by the
    model's ``_no_split_modules``, which transformers sets to its decoder-layer classes."""
    from transformers import PreTrainedModel

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    names = set(base._no_split_modules or ()) if isinstance(base, PreTrainedModel) else set()
    layers = [m for m in base.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(f"{type(base).__name__} names no decoder-layer class (_no_split_modules); FSDP2 needs one "
                         "to shard layer by layer")
    return layers


def shard_model(model: ModuleT, *, reshard_after_forward: bool = True) -> ModuleT:
    """``fully_shard`` every decoder layer (``reshard_after_forward`` applies to them), then the root,
    which FSDP2 does not reshard after its forward (in place; returns ``model``). The process group
    must be initialised (accelerate's launcher does it)."""
    from torch.distributed.fsdp import fully_shard

    for layer in decoder_layers(model):
        fully_shard(layer, reshard_after_forward=reshard_after_forward)
    fully_shard(model)  # the root keeps its parameters gathered from forward to backward: the LM head for the loss
    return model


def is_sharded(model: torch.nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def set_gradient_sync(model: FSDPModule, sync: bool) -> None:
    """FSDP2's ``no_sync``: without sync a micro-batch's gradients stay unsharded and are
    reduce-scattered with the last micro-batch's (one collective per step)."""
    model.set_requires_gradient_sync(sync)


def _options(**kw: bool) -> StateDictOptions:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=True, **kw)


def full_model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer gathered whole on rank 0 (CPU tensors; an empty dict on the other
    ranks). A collective: every rank calls it. A DeepSpeed ZeRO-3 engine is gathered by
    ``coevo.trainers.zero`` (the run's weight sync calls this for either)."""
    from coevo.trainers import zero

    if zero.is_engine(model):
        return zero.full_model_state(model)
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(model, options=_options())


def model_keys(model: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A checkpoint's tensors under the model's own state-dict names: a PEFT adapter is saved without
    its adapter name (``...lora_A.weight``) and lives in the model as ``...lora_A.<adapter>.weight``.
    A name that matches neither is a ValueError (a checkpoint of another model)."""
    keys = set(model.state_dict())
    adapter = model.active_adapter if hasattr(model, "peft_config") else None
    out = {}
    for name, tensor in tensors.items():
        head, _, leaf = name.rpartition(".")
        named = f"{head}.{adapter}.{leaf}" if adapter else name
        if named in keys:
            out[named] = tensor
        elif name in keys:
            out[name] = tensor
        else:
            raise ValueError(f"checkpoint tensor {name!r} matches no parameter of the model")
    return out


def load_full_model_state(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load a whole (not sharded) state dict into the sharded model; every rank passes the same
    ``state`` (missing keys, e.g. a tied head or the frozen base under LoRA, keep their values)."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    set_model_state_dict(model, state, options=_options(strict=False))


def full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's state gathered whole on rank 0, keyed by parameter name (a collective)."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer, options=_options())


def load_full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    set_optimizer_state_dict(model, optimizer, state, options=_options())


def clip_grad_norm(parameters: list[torch.nn.Parameter], max_norm: float) -> float:
    """``clip_grad_norm_`` over sharded gradients: the norm of the whole gradient (DTensor ops
    reduce the shards' partial norms), the same number on every rank."""
    norm = torch.nn.utils.clip_grad_norm_(parameters, max_norm)
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
