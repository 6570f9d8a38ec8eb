"""The checks a ``TrainConfig`` passes before any work: values no component accepts, named by their
field and what is allowed; the train split against ``batch_tasks``; optional dependencies the
config needs; the accelerate launch and the Triton kernel's device. ``coevo.loop.build.run`` calls them
first, and so do the scripts and examples that compose a config (``examples/gpu_cluster.py``).

Each value is checked once. What one field allows (choices, ranges) is stated in the schema's field
metadata and checked for every field by ``coevo.config.schema.violations``; this module adds only
what no field's metadata can say: names resolved by import (``check_names``) and the rules that
relate one field to another (``check_cross_fields``). Components keep their own invariants for
callers that build them directly (``Critic``, ``LossParams``, ``GRPOTrainer``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from coevo.config.mode import Mode
from coevo.config.schema import TrainConfig, violations
from coevo.errors import UsageError

if TYPE_CHECKING:
    from accelerate.utils import DistributedType

    from coevo.agent.policy import Policy
    from coevo.envs.base import Env, Task
    from coevo.harness.harness import Harness

SCRIPTED_MODELS = ("scripted", "gold")
"""``model.name`` values that run without weights (``coevo.loop.builders.scripted_policy``)."""


MAX_LR = {"adamw": 1e-2, "sgd": 1.0}
"""The largest ``trainer.lr`` per optimizer. AdamW moves every weight by about ``lr`` per step whatever
the gradient's scale, and a pretrained LLM's weights are of order 1e-2: a larger rate overwrites them
in a few steps (RL fine-tuning uses 1e-7..1e-5, LoRA up to about 1e-3; the smoke run's random tiny
model 1e-3). SGD's step scales with the gradient, so its bound is looser. ``lr=0`` (a run that never
moves the weights) is ``mode=harness_only``'s job."""


def device_of(name: str) -> str:
    """The torch device ``model.device`` names (auto: cuda when available, else cpu)."""
    import torch

    return ("cuda" if torch.cuda.is_available() else "cpu") if name == "auto" else name


def check(cfg: TrainConfig) -> None:
    """Reject values no component accepts, naming the field and what it allows. Secrets go first, so
    no later message quotes a key; then every field against the values its schema metadata allows
    (``coevo.config.schema.violations``: choices and ranges, one place for all of them); then the
    names resolved by import (``check_names``); then the rules that relate one field to another."""
    from dataclasses import asdict

    from coevo.safety.refusal import refuse_secrets

    refuse_secrets(asdict(cfg))
    for problem in violations(cfg):
        raise UsageError(problem)
    check_names(cfg)
    check_cross_fields(cfg)


def check_names(cfg: TrainConfig) -> None:
    """The fields whose values name code, a built-in or a ``package.module:Name`` of the user's own,
    so no fixed table holds them: ``env.name`` (and ``env.args``, the constructor's keywords) and
    ``meta_agent.backend``."""
    from coevo.envs.load import check_env_args, env_class
    from coevo.meta import BACKENDS, meta_agent_factory

    if cfg.meta_agent.backend not in BACKENDS:
        if ":" not in cfg.meta_agent.backend:
            raise UsageError(f"config meta_agent.backend={cfg.meta_agent.backend!r} is not allowed; choose one of "
                             f"{list(BACKENDS)} or the import path 'package.module:factory' of your own")
        try:
            meta_agent_factory(cfg.meta_agent.backend)
        except ValueError as err:
            raise UsageError(f"config meta_agent.backend: {err}") from None
    try:
        env_class(cfg.env.name)
    except ValueError as err:
        raise UsageError(f"config env.name={cfg.env.name!r}: {err}") from None
    try:
        check_env_args(cfg.env.name, cfg.env.args)
    except ValueError as err:
        raise UsageError(f"config env.args: {err}") from None


def check_cross_fields(cfg: TrainConfig) -> None:
    """The rules that relate one field to another (each field alone already passed ``violations``)."""
    e, t = cfg.evolution, cfg.trainer
    if not 0 < t.lr <= MAX_LR[t.optimizer]:
        raise UsageError(f"config trainer.lr={t.lr} is not allowed; it must be in (0, {MAX_LR[t.optimizer]:g}] for "
                         f"{t.optimizer}: fine-tuning rates are 1e-7..1e-3, and larger steps destroy the weights")
    if e.stat_budget < 2 * e.critic_attempts:
        raise UsageError(f"config evolution.stat_budget={e.stat_budget} must be >= 2 * evolution.critic_attempts "
                         f"({2 * e.critic_attempts}): one paired attempt of parent and candidate")
    urls = {"meta_agent.url": cfg.meta_agent.url if cfg.meta_agent.backend == "openai" else None,
            "rollout.vllm_server_url": cfg.rollout.vllm_server_url
            if cfg.rollout.backend == "vllm" and cfg.rollout.vllm_mode == "server" else None}
    for key, url in urls.items():
        if url is not None and not url.startswith(("http://", "https://")):
            raise UsageError(f"config {key}={url!r} is not a URL; write it as http://HOST:PORT"
                             + ("/v1" if key == "meta_agent.url" else ""))
    if cfg.meta_agent.backend == "openai" and not (cfg.meta_agent.url and cfg.meta_agent.model):
        raise UsageError("meta_agent=openai needs meta_agent.url and meta_agent.model "
                         "(e.g. meta_agent.model=gpt-4o-mini)")
    if cfg.buffer.sampler_logprobs and cfg.rollout.backend == "vllm":
        raise UsageError("config buffer.sampler_logprobs=true needs rollout.backend=transformers: vLLM's probabilities "
                         "differ from the trainer's, so its log-probs are no behaviour log-probs (leave it false)")
    if cfg.trainer.sharding != "none" and cfg.rollout.backend == "vllm":
        raise UsageError(f"config trainer.sharding={cfg.trainer.sharding} with rollout.backend=vllm is not supported: "
                         "the weight sync to vLLM reads whole (merged) parameters from the trainer, which "
                         f"{'FSDP2' if cfg.trainer.sharding == 'fsdp2' else 'ZeRO-3'} holds sharded; use "
                         "rollout.backend=transformers (rank 0 generates from a gathered copy) or DDP + LoRA with vLLM")
    if cfg.model.name in SCRIPTED_MODELS and Mode(cfg.mode).trains:
        raise UsageError(f"config model.name={cfg.model.name!r} has no weights to train in mode={cfg.mode!r}; use "
                         "mode=harness_only or mode=static, or name a model")
    if cfg.model.name in SCRIPTED_MODELS and cfg.rollout.backend != "transformers":
        raise UsageError(f"config model.name={cfg.model.name!r} runs without a serving backend; leave "
                         "rollout=transformers")
    if cfg.evolution.router and cfg.meta_agent.backend == "rule":
        raise UsageError("evolution.router=true needs an LLM meta-agent (meta_agent=openai or hf); rule cannot route")
    if cfg.trainer.beta > 0 and not cfg.model.lora and Mode(cfg.mode).trains:
        raise UsageError(f"config trainer.beta={cfg.trainer.beta} needs model.lora=true: the KL reference is the base "
                         "model with the adapter disabled, and full fine-tuning has no reference model here; "
                         "set trainer.beta=0 or model.lora=true")
    attempts, capacity = cfg.rollout.attempts, cfg.buffer.capacity
    extra = cfg.rollout.max_extra_tasks if cfg.rollout.signal_groups else 0
    bare = cfg.rollout.unscaffolded_attempts
    per_round = (cfg.batch_tasks + extra) * attempts + cfg.batch_tasks * bare
    if Mode(cfg.mode).trains and capacity < per_round:
        # a round's traces must all fit in the buffer, whose capacity then bounds batch_tasks
        most = (capacity - extra * attempts) // (attempts + bare)
        raise UsageError(f"config batch_tasks={cfg.batch_tasks} must be <= {most}:"
                         f" a round adds (batch_tasks + rollout.max_extra_tasks={extra} with dynamic sampling) x "
                         f"rollout.attempts={attempts}"
                         + (f" + batch_tasks x rollout.unscaffolded_attempts={bare}" if bare else "")
                         + f" = {per_round} traces, which must fit in buffer.capacity={capacity}; lower batch_tasks "
                         f"or raise buffer.capacity to >= {per_round}")


def check_train_split(cfg: TrainConfig, n_train: int) -> None:
    """``batch_tasks`` against the train tasks the env holds (known only once it is built): a larger
    value would silently train on the whole split every round, not on the batches asked for."""
    if not n_train:
        raise UsageError(f"config env.name={cfg.env.name!r} with env.args={cfg.env.args} has no train tasks")
    if cfg.batch_tasks > n_train:
        pool = cfg.evolution.reference_pool
        left = f" left after evolution.reference_pool={pool}" if pool else ""
        raise UsageError(f"config batch_tasks={cfg.batch_tasks} must be <= {n_train}, the train tasks of env "
                         f"{cfg.env.name!r}{left}")


def check_dependencies(cfg: TrainConfig) -> None:
    """Import the optional packages the config's choices need, before any model is loaded, so a
    missing one stops the run at once with its install command (``coevo.config.optional``)."""
    from coevo.config.optional import require

    if cfg.rollout.backend == "vllm" and cfg.rollout.vllm_mode == "colocate":  # a server is reached over HTTP
        require("vllm", "rollout.backend=vllm")
    if cfg.logger.kind == "wandb":
        require("wandb", "logger.kind=wandb")
    if cfg.meta_agent.backend == "openai":
        require("openai", "meta_agent.backend=openai")
    if cfg.trainer.kernel == "triton":
        check_triton_device(cfg)
        require("triton", "trainer.kernel=triton")


def launch_request(environ: Mapping[str, str]) -> tuple[str | None, int]:
    """What the launcher asked of this process, from the variables it sets: (strategy, processes).
    ``accelerate launch`` exports ACCELERATE_USE_DEEPSPEED=true for a DeepSpeed config or
    ``--use_deepspeed`` ("deepspeed"), ACCELERATE_USE_FSDP=true for an FSDP one ("fsdp"), nothing for
    DDP (None); it and torchrun export WORLD_SIZE, the number of processes started. (``--cpu
    --num_processes N`` starts one process and exports nothing that says N: not detectable here.)"""
    def flag(name: str) -> bool:
        return environ.get(name, "false").strip().lower() in ("true", "1", "yes")

    strategy = "deepspeed" if flag("ACCELERATE_USE_DEEPSPEED") else "fsdp" if flag("ACCELERATE_USE_FSDP") else None
    return strategy, int(environ.get("WORLD_SIZE", "1") or 1)


def check_distributed(distributed_type: DistributedType, fsdp_version: int | None = None, *,
                      requested: str | None = None, world_size: int = 1, processes: int = 1,
                      zero_stage: int | None = None) -> str | None:
    """The launch against what accelerate set up, before any work: a launch gets the strategy it asked
    for or a ValueError saying why not, never another one. Returns the trainer's sharding: ``"fsdp2"``
    for FSDP version 2 (the trainer shards itself, ``coevo.trainers.sharding``; on CPU, where accelerate
    sets up no FSDP, too), ``"zero3"`` for DeepSpeed ZeRO stage 3 (``coevo.trainers.zero``), else None.

    ``requested`` and ``world_size``: ``launch_request``'s; ``processes``: the processes accelerate
    set up; ``fsdp_version`` and ``zero_stage``: the launch config's. Refused: a DeepSpeed launch that
    accelerate set up as anything else, fewer processes than were started, FSDP version 1, ZeRO stages
    0-2 (docs/gpu-cluster.md, "Sharded training")."""
    from accelerate.utils import DistributedType

    if requested == "deepspeed" and distributed_type != DistributedType.DEEPSPEED:
        raise UsageError(f"the launch asks for DeepSpeed (ACCELERATE_USE_DEEPSPEED=true) but accelerate set up "
                         f"{distributed_type}: coevo does not run another strategy in its place")
    if processes < world_size:
        raise UsageError(f"the launch started {world_size} processes (WORLD_SIZE) but accelerate set up {processes}: "
                         "coevo does not train on fewer ranks than were launched")
    if distributed_type == DistributedType.DEEPSPEED:
        if zero_stage != 3:
            raise UsageError(f"DeepSpeed ZeRO stage {zero_stage} is not supported: coevo runs DeepSpeed at stage 3 "
                             "(configs/accelerate/zero3.yaml); without sharding launch DDP")
        return "zero3"
    if distributed_type == DistributedType.FSDP or requested == "fsdp":
        if fsdp_version == 2:
            return "fsdp2"
        raise UsageError(f"accelerate's FSDP version {fsdp_version} is not supported: coevo shards with FSDP2; set "
                         "fsdp_config.fsdp_version: 2 (configs/accelerate/fsdp2.yaml)")
    return None


def check_triton_device(cfg: TrainConfig) -> None:
    """The Triton loss runs on CUDA tensors only (or under TRITON_INTERPRET=1); without this check a
    CPU run would find out in its first GRPO step, after the round's rollouts."""
    import torch

    from coevo.kernels import IMPLS
    from coevo.kernels.triton_grpo import INTERPRETED

    device = device_of(cfg.model.device)
    if torch.device(device).type != "cuda" and not INTERPRETED:
        others = [impl for impl in IMPLS if impl != "triton"]
        raise UsageError(f"config trainer.kernel=triton needs a CUDA device, and model.device={cfg.model.device!r} "
                         f"is {device} here; choose one of {others} (auto picks triton on CUDA when installed, "
                         "chunked elsewhere)")


def check_context_window(policy: Policy, harness: Harness, env: Env, task: Task, max_steps: int,
                         field: str = "config rollout.max_new_tokens") -> str | None:
    """The completion budget plus the prompt of ``task``'s first model call (under ``harness``, as the
    first rollout renders it) against the model's context window, before any rollout: past it the
    policy refuses every request, and each trace would end as an infrastructure failure. Returns a
    line with the prompt's size for the user (a large tool listing shows here first); None for
    policies without a context window (scripted, vLLM), which are not checked. ``field``: the
    setting to name in the error (``--max-new-tokens`` on the command line)."""
    from coevo.agent.episode import Job
    from coevo.agent.runtime import start_episode

    limit = policy.context_window
    if limit is None:
        return None
    episode = start_episode(Job(task, harness), env, "context-check", max_steps)
    try:
        request = next(episode)  # the first ChatRequest; no model is called
    except StopIteration:
        return None  # the episode ended before asking the model (an env or processor error the rollout will report)
    finally:
        episode.close()  # closes the env session it opened (a program it started is stopped)
    ids = policy.prompt_ids(request.messages, request.reply_prefix)
    if ids is None:  # a policy that renders no prompt has no tokens to count
        return None
    prompt = len(ids)
    budget = request.sampling.max_new_tokens
    if prompt + budget > limit:
        raise UsageError(f"{field}={budget} does not fit the model's context window: the first "
                         f"prompt (task {task.task_id!r} under the starting harness) has {prompt} tokens, "
                         f"{prompt + budget} in all, over the {limit} tokens of model.name's config "
                         f"(max_position_embeddings); set {field.removeprefix('config ')} <= {max(limit - prompt, 0)}, "
                         "or shorten the harness's prompt (a large tool set: tool_schema_hint.compact=true)")
    return (f"first prompt: {prompt} tokens before the first reply (task {task.task_id!r}), + {budget} completion "
            f"tokens, of the model's {limit}-token context window")
