"""DeepSpeed ZeRO-3 for the GRPO trainer: parameters, gradients and optimizer state partitioned over the ranks.

``accelerate launch --config_file configs/accelerate/zero3.yaml`` gives a DeepSpeed accelerator;
``accelerator.prepare`` hands the model and the trainer's own optimizer to ``deepspeed.initialize``
(DeepSpeed wraps it: ZeRO-3 partitions the parameters in place, keeps each rank's fp32 slice of
them and of the optimizer state). Unlike DDP and FSDP2, DeepSpeed's engine owns the gradient
accumulation boundaries, the clipping and the optimizer step, so the trainer drives it through
the engine (``backward``, ``step``) rather than through the optimizer.

What the trainer needs from ZeRO-3 and how it gets it:

- The loss applies the LM head to hidden states outside the model's forward; ZeRO-3 frees every
  module's gathered parameters after its forward, so ``whole`` gathers the head's [V, H] weight
  for the loss and its backward (``GatheredParameters``, modifier_rank=None: nothing is written to
  it; its gradient goes through ZeRO-3's hooks like every other parameter's).
- Gradients are reduced (averaged over the ranks) at each backward and accumulated in each
  rank's slice; ``set_boundary`` marks the step's last micro-batch, and ``step`` clips by the
  config's ``gradient_clipping`` (set from ``trainer.max_grad_norm`` by ``configure``) and steps.
- Checkpoints are gathered whole on rank 0, by parameter name (fp32 master weights and AdamW
  state), so a ZeRO-3 run writes the same weight files as one process and resumes from them.

deepspeed is an optional dependency (``pip install -e '.[deepspeed]'``): only a DeepSpeed launch
imports it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, TypeGuard

import torch

if TYPE_CHECKING:
    from accelerate.utils import DeepSpeedPlugin
    from deepspeed import DeepSpeedEngine


def is_engine(model: torch.nn.Module) -> TypeGuard[DeepSpeedEngine]:
    """Whether ``model`` is a DeepSpeed engine (without importing deepspeed where it is not in use)."""
    return type(model).__name__ == "DeepSpeedEngine" and hasattr(model, "optimizer")


def configure(ds_config: dict[str, Any], *, max_grad_norm: float, world: int) -> None:
    """Fill the DeepSpeed config (accelerate's plugin dict, before ``prepare``) with what the trainer
    decides: one micro-batch per boundary as DeepSpeed counts them (the trainer sets the boundary
    itself, ``set_boundary``), clipping at ``trainer.max_grad_norm``. An optimizer or scheduler in
    the config is refused: the trainer's ``trainer.optimizer`` and linear schedule are the run's."""
    zero = ds_config.get("zero_optimization", {})
    if int(zero.get("stage", 0)) != 3:
        raise ValueError(f"DeepSpeed ZeRO stage {zero.get('stage')} is not supported: coevo runs DeepSpeed at stage 3 "
                         "(configs/accelerate/zero3.yaml); without sharding use DDP")
    for key in ("optimizer", "scheduler"):
        if key in ds_config:
            raise ValueError(f"the DeepSpeed config has a {key!r} section: coevo's trainer owns the optimizer and the "
                             "learning-rate schedule (trainer.optimizer, trainer.lr, trainer.warmup_steps); remove it")
    ds_config.update(train_micro_batch_size_per_gpu=1, gradient_accumulation_steps=1, train_batch_size=world,
                     gradient_clipping=float(max_grad_norm))


def plain_transformers(plugin: DeepSpeedPlugin) -> None:
    """Turn off transformers' ZeRO-3 mode, which accelerate's DeepSpeed plugin switches on for the whole
    process (a global weak reference, whatever ``zero3_init_flag`` says): under it ``from_pretrained``
    builds partitioned models (``deepspeed.zero.Init``) and ``generate`` waits for every rank at each
    token. coevo loads whole models (rank 0 keeps a whole copy for rollouts, ZeRO-3 partitions the
    trained one when the trainer prepares it) and rank 0 generates alone."""
    from transformers.integrations import unset_hf_deepspeed_config

    plugin.zero3_init_flag = False
    plugin.dschf = None  # the weak reference's only strong one
    unset_hf_deepspeed_config()


def is_partitioned(param: torch.nn.Parameter) -> bool:
    """A ZeRO-3 parameter: its data is a rank-local slice (``param.ds_tensor``) outside a gather."""
    return hasattr(param, "ds_id")


@contextlib.contextmanager
def whole(param: torch.nn.Parameter) -> Iterator[torch.nn.Parameter]:
    """``param`` gathered whole for the body (a collective: every rank enters), partitioned again on
    exit; the body may use it in autograd, provided its backward runs inside the body too. A
    parameter ZeRO-3 does not manage is yielded as it is."""
    if not is_partitioned(param):
        yield param
        return
    from deepspeed.runtime.zero.partition_parameters import GatheredParameters

    with GatheredParameters([param], modifier_rank=None):
        yield param


def set_boundary(engine: DeepSpeedEngine, last: bool) -> None:
    """Mark whether the coming backward is the step's last micro-batch (DeepSpeed's accumulation boundary)."""
    engine.set_gradient_accumulation_boundary(last)


def backward(engine: DeepSpeedEngine, loss: torch.Tensor) -> None:
    """The engine's backward: ZeRO-3's hooks reduce-scatter each gradient into the rank's slice."""
    engine.backward(loss)


def step(engine: DeepSpeedEngine) -> float:
    """Clip (the config's ``gradient_clipping``), step the optimizer, zero the gradients; returns the
    global gradient norm before clipping, the same number on every rank."""
    engine.step()
    norm = engine.get_global_grad_norm()
    return float(norm) if norm is not None else float("nan")


def _unique_params(module: torch.nn.Module) -> list[tuple[list[str], torch.nn.Parameter]]:
    """(state-dict names, parameter) for each distinct parameter, in the module's order (a tied head
    shares the embedding's parameter: one gather, two names). The same order on every rank."""
    names: dict[int, list[str]] = {}
    params: dict[int, torch.nn.Parameter] = {}
    for name, value in module.state_dict(keep_vars=True).items():
        if isinstance(value, torch.nn.Parameter):
            names.setdefault(id(value), []).append(name)
            params[id(value)] = value
    return [(names[k], params[k]) for k in params]


def full_model_state(engine: DeepSpeedEngine, dtypes: dict[str, torch.dtype] | None = None) -> dict[str, torch.Tensor]:
    """Every parameter and buffer of the engine's module gathered whole on rank 0, as CPU tensors
    named as in the module's state dict (an empty dict on the other ranks). Trainable parameters
    come from the optimizer's fp32 master weights, frozen ones from the module. ``dtypes``: the
    parameters' dtypes before DeepSpeed (bf16 training keeps bf16 module copies), by name. A
    collective: every rank calls it."""
    from deepspeed.utils import safe_get_full_fp32_param

    module = engine.module
    main = torch.distributed.get_rank() == 0
    out: dict[str, torch.Tensor] = {}
    for names, param in _unique_params(module):
        if param.requires_grad:
            value = safe_get_full_fp32_param(param)  # [*param.ds_shape] fp32
        else:
            with whole(param):
                value = param.data.clone() if main else None
        if main:  # one tensor for every name of a tied parameter: save_pretrained writes it once, as one process does
            whole_value = value.detach().to("cpu", (dtypes or {}).get(names[0], value.dtype)).clone()
            out.update({name: whole_value for name in names})
    if main:
        params = {n for names, _ in _unique_params(module) for n in names}
        for name, value in module.state_dict().items():
            if name not in params:  # buffers: never partitioned
                out[name] = value.detach().to("cpu").clone()
    return out


def load_full_model_state(engine: DeepSpeedEngine, state: dict[str, torch.Tensor]) -> None:
    """Load whole tensors (named as in the module's state dict; every rank passes the same ``state``)
    into the partitioned module and, for trainable parameters, the optimizer's fp32 master weights.
    Names absent from ``state`` (a tied head, the frozen base under LoRA) keep their values."""
    from deepspeed.runtime.zero.partition_parameters import GatheredParameters
    from deepspeed.utils import safe_set_full_fp32_param

    for names, param in _unique_params(engine.module):
        name = next((n for n in names if n in state), None)
        if name is None:
            continue
        value = state[name].to(device=param.ds_tensor.device if is_partitioned(param) else param.device)
        with GatheredParameters([param], modifier_rank=0):  # rank 0's copy is broadcast, then partitioned
            param.data.copy_(value.view_as(param.data))
        if param.requires_grad:
            safe_set_full_fp32_param(param, value.float().flatten())


def _inner_optimizer(engine: DeepSpeedEngine) -> tuple[torch.optim.Optimizer, list[torch.Tensor]]:
    """(the trainer's torch optimizer inside ZeRO-3, its fp32 flat slices: one per sub-group)."""
    zero = engine.optimizer
    return zero.optimizer, list(zero.fp32_partitioned_groups_flat)


def _state_keys(inner: torch.optim.Optimizer, flats: list[torch.Tensor]) -> list[str]:
    """The per-element state of the optimizer (AdamW: exp_avg, exp_avg_sq; SGD without momentum:
    none): tensors the size of a flat slice. Empty before the first step."""
    state = inner.state.get(flats[0], {}) if flats else {}
    return sorted(k for k, v in state.items() if k != "step" and torch.is_tensor(v) and v.shape == flats[0].shape)


def full_optimizer_state(engine: DeepSpeedEngine) -> dict[str, Any]:
    """The optimizer's state gathered whole on rank 0, keyed by parameter name as FSDP2's full state
    dicts are ({"state": {name: {"step", "exp_avg", ...}}, "param_groups": [{..., "params": [names]}]}),
    an empty dict on the other ranks. A collective."""
    from deepspeed.utils import safe_get_full_optimizer_state

    inner, flats = _inner_optimizer(engine)
    keys = _state_keys(inner, flats)
    main = torch.distributed.get_rank() == 0
    step_value = inner.state.get(flats[0], {}).get("step") if flats else None
    states: dict[str, dict[str, torch.Tensor]] = {}
    trainable = [(names, p) for names, p in _unique_params(engine.module) if p.requires_grad]
    for names, param in trainable:
        entry = {key: safe_get_full_optimizer_state(param, key) for key in keys}  # [*ds_shape] each
        if main and keys:
            entry = {k: v.detach().to("cpu").clone() for k, v in entry.items()}
            if step_value is not None:
                entry["step"] = torch.as_tensor(step_value).detach().to("cpu").clone()
            states[names[0]] = entry
    if not main:
        return {}
    groups = [{k: v for k, v in g.items() if k != "params"} for g in inner.param_groups]
    if groups:
        groups[0]["params"] = [names[0] for names, _ in trainable]  # the trainer's single group
    return {"state": states, "param_groups": groups}


def load_full_optimizer_state(engine: DeepSpeedEngine, saved: dict[str, Any]) -> None:
    """Restore ``full_optimizer_state``'s dict (every rank passes the same): the group settings (the
    learning rate a schedule reached among them) and, when it holds any, the per-parameter state
    written into each rank's slices (created first: a fresh optimizer has none before its first step)."""
    from deepspeed.utils import safe_set_full_optimizer_state

    inner, flats = _inner_optimizer(engine)
    for group, values in zip(inner.param_groups, saved.get("param_groups", []), strict=False):
        group.update({k: v for k, v in values.items() if k != "params"})
    states = saved.get("state", {})
    if not states:
        return
    first = next(iter(states.values()))
    keys = sorted(k for k in first if k != "step")
    for flat in flats:
        slot = inner.state[flat]
        for key in keys:
            slot[key] = torch.zeros_like(flat)
        if "step" in first:
            slot["step"] = first["step"].detach().clone().to(torch.float32)
    for names, param in _unique_params(engine.module):
        if not param.requires_grad:
            continue
        name = next((n for n in names if n in states), None)
        if name is None:
            raise ValueError(f"the optimizer state has no entry for parameter {names[0]!r}")
        for key in keys:
            safe_set_full_optimizer_state(param, states[name][key].to(flats[0].device).flatten(), key)
