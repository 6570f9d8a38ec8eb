"""The components of a run, each built from the config by one function: the recipe in
``coevo.loop.build.run_on_env`` calls them top to bottom.

Each builder unpacks its part of the config into a component's flat arguments (the components
never see the config). ``coevo.loop.config_check`` has refused the values a user can get wrong
before any of them runs.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coevo.agent.policy import Policy
from coevo.config.mode import Mode
from coevo.config.schema import EvolutionConfig, RolloutConfig, TrainConfig
from coevo.errors import UsageError
from coevo.loop.config_check import SCRIPTED_MODELS
from coevo.loop.schedule import Processes, Schedule, Training

if TYPE_CHECKING:
    import torch
    from accelerate import Accelerator
    from peft import PeftModel
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from coevo.agent.rollouts import RolloutService
    from coevo.agent.trace import Trace
    from coevo.envs.base import Env, Task
    from coevo.evolution.critic import Critic
    from coevo.evolution.critic import Rollout as CriticRollout
    from coevo.evolution.engine import AEGIS
    from coevo.evolution.meta_agent import MetaAgent
    from coevo.harness.harness import Harness
    from coevo.report.progress import ProgressDisplay
    from coevo.trainers.grpo import GRPOTrainer


@dataclass(frozen=True)
class Models:
    """A run's weights. ``generating``: the model the rollout policy samples from (rank 0's whole copy
    in a sharded run; None for a scripted policy); ``trainer``: GRPO over the trained model (None
    in a mode that does not train); ``sharded``: FSDP2 or ZeRO-3, so ``generating`` is a copy that
    the gathered weights refresh."""

    generating: Any | None
    tokenizer: Any | None
    trainer: GRPOTrainer | None
    sharded: bool


def build_models(cfg: TrainConfig, mode: Mode, accelerator: Accelerator, reshard_after_forward: bool | None) -> Models:
    """Load the model (LoRA when it trains), wrap it in the trainer, and keep the copy rollouts use."""
    from coevo.policy.load import load_model
    from coevo.trainers.grpo import GRPOTrainer, apply_lora

    if cfg.model.name in SCRIPTED_MODELS:
        return Models(None, None, None, sharded=False)
    try:
        model, tok = load_model(cfg.model.name, device=str(accelerator.device), dtype=cfg.model.dtype)
    except ValueError as err:  # the loader names the allowed values; the field is named here
        raise UsageError(f"config model.name={cfg.model.name!r}: {err}") from err
    if not mode.trains:
        return Models(model, tok, None, sharded=False)
    if cfg.model.lora:
        model = apply_lora(model, r=cfg.model.lora_r, alpha=cfg.model.lora_alpha, dropout=cfg.model.lora_dropout)
    sharded = cfg.trainer.sharding != "none"  # fsdp2 | zero3
    # Sharded, no rank holds whole weights to generate with: rank 0 keeps a whole copy for rollouts
    # and behaviour log-probs, refreshed from the gathered weights after every round's steps.
    rollout_copy = copy.deepcopy(model) if sharded and accelerator.is_main_process else None
    resharding = {} if reshard_after_forward is None else {"reshard_after_forward": reshard_after_forward}
    trainer = GRPOTrainer(model, cfg.trainer, pad_id=tok.pad_token_id, accelerator=accelerator,
                          total_steps=cfg.rounds * cfg.trainer.steps_per_round,
                          loss_horizon=cfg.rollout.max_new_tokens, **resharding)
    return Models(rollout_copy or trainer.unwrapped, tok, trainer, sharded)


def build_rollout_policy(cfg: TrainConfig, env: Env, models: Models, *,
                         generates: bool) -> tuple[Policy, Callable[[], None] | None]:
    """(policy, sync): the model's policy, or a scripted one without weights; ``sync()`` pushes the
    trained weights to it (None where generation uses the trained model object itself)."""
    if models.generating is None:
        try:
            return scripted_policy(cfg.model.name, env, cfg.env.name), None
        except ValueError as err:
            raise UsageError(f"config model.name={cfg.model.name!r}: {err}") from None
    policy, sync = build_policy(cfg, models.generating, models.tokenizer, generates=generates)
    if models.sharded:
        sync = gathered_sync(models.trainer.model, models.generating if generates else None)
    return policy, sync


def build_policy(cfg: TrainConfig, model: PreTrainedModel | PeftModel, tok: PreTrainedTokenizerBase, *,
                 generates: bool = True) -> tuple[Policy, Callable[[], None] | None]:
    """(policy, sync) where ``sync()`` pushes the trained weights to the rollout engine. A rank that
    does not generate (``generates=False``: rank > 0) gets an idle vLLM engine, not one of its own."""
    from coevo.policy.hf import TransformersPolicy

    if cfg.rollout.backend == "transformers":
        policy = TransformersPolicy(model, tok, model_version="0", max_batch_size=cfg.rollout.batch_size, seed=cfg.seed,
                                    kv_mib=cfg.rollout.kv_mib)
        return policy, None  # generation uses the trained model object itself
    from coevo.policy.smollm2 import converted_dir
    from coevo.policy.vllm import ColocatedEngine, IdleEngine, ServerEngine, VLLMPolicy

    path = str(converted_dir()) if cfg.model.name == "smollm2" else cfg.model.name
    if not generates:
        engine = IdleEngine()
    elif cfg.rollout.vllm_mode == "colocate":
        # the engine samples in the trainer's dtype, so behaviour and trained log-probs differ only by the backends
        engine = ColocatedEngine(path, sleep_level=cfg.rollout.vllm_sleep_level, seed=cfg.seed,
                                 dtype=str(model.dtype).removeprefix("torch."),
                                 gpu_memory_utilization=cfg.rollout.vllm_gpu_memory_utilization)
    elif cfg.rollout.vllm_mode == "server":
        if cfg.rollout.vllm_sleep_level is not None:
            raise UsageError("rollout.vllm_sleep_level applies to the colocated engine; a vllm-serve server holds "
                             "its own GPUs (set it to null with rollout.vllm_mode=server)")
        engine = ServerEngine(cfg.rollout.vllm_server_url, sync_dir=Path(cfg.run_dir) / "vllm_sync")
    policy = VLLMPolicy(engine, tok, model_version="0")
    return policy, (lambda: policy.sync_weights(model, policy.model_version)) if generates else None


def gathered_sync(sharded_model: torch.nn.Module, rollout_model: torch.nn.Module | None) -> Callable[[], None]:
    """The weight sync of a sharded run: every rank gathers the trained weights (a collective), rank 0
    loads them into its rollout copy (``rollout_model``; None on the other ranks)."""

    from coevo.trainers.sharding import full_model_state

    def sync() -> None:
        state = full_model_state(sharded_model)
        if rollout_model is not None:
            _, unexpected = rollout_model.load_state_dict(state, strict=False)
            if unexpected:
                raise RuntimeError(f"the gathered weights do not fit the rollout copy: {unexpected[:5]}")

    return sync


def scripted_policy(name: str, env: Env, env_name: str, *, delegate: bool = False) -> Policy:
    """A policy without weights (``SCRIPTED_MODELS``) for ``env`` (``env_name``: as the config or
    ``--env`` names it): ``scripted``, the env's scripted solver, or ``gold``, its tasks' own gold
    actions (``coevo.agent.gold``; with ``delegate``, as a lead handing them to specialists by
    ``env.tool_owners``). No training (``check`` allows them only in the harness_only and static
    modes): for plumbing checks and tests. An env without a scripted solver is a ValueError."""
    from coevo.agent.policy import ScriptedPolicy
    from coevo.envs.load import scripted_solver

    if name == "gold":
        from coevo.agent.gold import GoldPolicy

        tasks = [t for split in ("train", "val", "test") for t in env.tasks(split)]
        return GoldPolicy(tasks, answer=env.gold_answer, owner=env.tool_owners if delegate else None,
                          model_version=f"gold-{env.name}")
    solver = scripted_solver(env_name)
    if solver is None:
        raise UsageError(f"env {env_name!r} has no scripted solver; use a model")
    return ScriptedPolicy(solver, model_version=f"scripted-{env.name}")


def start_harness(cfg: TrainConfig) -> Harness:
    """The starting harness with the rollout's sampling settings written into it."""
    from coevo.harness.defaults import BUILTIN_HARNESSES, with_step_cap
    from coevo.harness.harness import Harness

    spec = cfg.harness.start
    if spec in BUILTIN_HARNESSES:
        h = BUILTIN_HARNESSES[spec]()
    elif Path(spec).is_file():
        try:
            h = Harness.load(spec)
        except ValueError as err:  # a processor names its parameter and what it allows; the field is named here
            # Harness.load names the file; here the field names it
            raise UsageError(f"config harness.start={spec!r}: {str(err).removeprefix(f'{spec}: ')}") from err
    else:
        raise UsageError(f"config harness.start={spec!r} is neither a built-in harness {sorted(BUILTIN_HARNESSES)} "
                         "nor a harness YAML file")
    if "sampling" not in h:
        raise UsageError(f"harness {spec!r} has no 'sampling' processor to take rollout.temperature/max_new_tokens")
    h = h.set_param("sampling", "temperature", float(cfg.rollout.temperature))
    h = h.set_param("sampling", "max_new_tokens", int(cfg.rollout.max_new_tokens))
    h = with_step_cap(h, cfg.rollout.max_steps)  # the harness's step budget never ends episodes sooner
    if cfg.rollout.keep_truncated:
        if "token_annotation" not in h:
            raise UsageError(f"rollout.keep_truncated=true needs a 'token_annotation' processor in harness {spec!r}")
        h = h.set_param("token_annotation", "exclude_truncated", False)
    return h


def build_rollouts(r: RolloutConfig, policy: Policy, env: Env, *, seed: int, progress: ProgressDisplay | None,
                   tokenizer: PreTrainedTokenizerBase | None = None) -> RolloutService:
    """The service every episode of a run goes through, from ``rollout.*``."""
    from coevo.agent.rollouts import RolloutService

    return RolloutService(policy, env, batch_size=r.batch_size, max_steps=r.max_steps, workers=r.workers, seed=seed,
                          progress=progress, tokenizer=tokenizer)


def build_aegis(e: EvolutionConfig, start: Harness, rollouts: RolloutService, meta: MetaAgent, *,
                tasks: dict[str, Task], references: dict[str, Trace], tools: list[str],
                inert: frozenset[str] = frozenset(), critic: Critic | None = None) -> AEGIS:
    """AEGIS over the train tasks: the meta-agent proposes, the Critic of ``evolution.*`` judges (or
    ``critic``, one built elsewhere), and ``evolution.patience`` rounds without a shipped edit end the
    search. ``inert``: processor kinds that change nothing on this agent (``Env.inert_processors``: a
    program's own tools and answers)."""
    from coevo.evolution.engine import AEGIS
    from coevo.evolution.pool import Patience

    critic = critic or make_critic(e, rollouts.critic_rollout())
    return AEGIS(start, meta, critic, tasks=tasks, critic_pool=tasks, references=references, tools=tools,
                 max_variants=e.max_variants, max_proposals=e.max_proposals, router=meta.route if e.router else None,
                 patience=Patience(rounds=e.patience) if e.patience is not None else None, inert=inert)


def make_critic(e: EvolutionConfig, rollout: CriticRollout) -> Critic:
    """The Critic of ``evolution.*`` over ``rollout`` (also used by scripts/gate_quality.py)."""
    from coevo.evolution.critic import Critic

    return Critic(rollout, k=e.critic_attempts, gate=e.gate, delta=e.delta, n_tasks=e.stat_tasks, budget=e.stat_budget)


def build_meta(cfg: TrainConfig, run_dir: Path) -> MetaAgent:
    from coevo.meta import make_meta_agent

    m = cfg.meta_agent
    return make_meta_agent(m.backend, url=m.url, model=m.model, cache_dir=run_dir / "meta_cache",
                           api_key_env=m.api_key_env)


def build_schedule(cfg: TrainConfig, mode: Mode) -> Schedule:
    """What each round does: batches, attempts, steps, evaluations, and the rounds that evolve."""
    e = cfg.evolution

    def evolve_rounds(r: int) -> bool:
        return r < e.early_rounds or (e.every > 0 and (r - e.early_rounds + 1) % e.every == 0)

    return Schedule(
        rounds=cfg.rounds, batch_tasks=cfg.batch_tasks, attempts=cfg.rollout.attempts, seed=cfg.seed,
        steps_per_round=cfg.trainer.steps_per_round, val_every=cfg.val_every, eval_attempts=cfg.eval_attempts,
        step_traces=cfg.trainer.step_traces, signal_groups=cfg.rollout.signal_groups,
        max_extra_tasks=cfg.rollout.max_extra_tasks,
        unscaffolded_attempts=cfg.rollout.unscaffolded_attempts if mode.unscaffolds else 0,
        evolve_rounds=evolve_rounds,
        critic_episodes=(e.stat_budget if e.gate == "stat" else cfg.batch_tasks * e.critic_attempts)
        * e.max_proposals,  # for the time estimate: one variant's proposals, each judged to the gate's budget
    )


def build_training(cfg: TrainConfig, models: Models, run_dir: Path, *, is_main: bool) -> Training:
    """The weights' half of a round: the trainer everywhere, the replay buffer and the behaviour
    log-probs of what enters it on rank 0."""
    from coevo.buffers import ReplayBuffer
    from coevo.trainers.logprobs import LOGPROB_BATCH_SIZE, logprob_fn

    temperature = cfg.rollout.temperature if cfg.rollout.temperature > 0 else 1.0
    buffer = ReplayBuffer(run_dir / "buffer", capacity=cfg.buffer.capacity) if is_main else None
    behaviour = logprob_fn(models.generating, models.tokenizer.pad_token_id, temperature=temperature,
                           batch_size=LOGPROB_BATCH_SIZE, share_prefix=True)
    return Training(models.trainer, buffer, sampler_logprobs=cfg.buffer.sampler_logprobs,
                    critic_traces=cfg.buffer.critic_traces, logprob_fn=behaviour)


def build_processes(accelerator: Accelerator, policy: Policy, sync: Callable[[], None] | None) -> Processes:
    """How the launch's processes share the loop: rank 0's objects broadcast, the weight sync, and the
    rollout engine's release before each step (a vLLM engine sleeps, the transformers policy drops its
    prefix cache)."""
    from accelerate.utils import broadcast_object_list

    several = accelerator.num_processes > 1
    given = {"sync_weights": sync, "release_rollout": policy.release,
             "share": (lambda obj: broadcast_object_list([obj], from_process=0)[0]) if several else None}
    return Processes(is_main=accelerator.is_main_process, **{k: v for k, v in given.items() if v is not None})


def tracker_kwargs(cfg: TrainConfig, run_dir: Path) -> dict[str, Any]:
    if cfg.logger.kind == "none":
        return {}
    from omegaconf import OmegaConf

    return {"project": cfg.logger.project, "run_dir": run_dir, "entity": cfg.logger.entity, "name": cfg.name,
            "group": cfg.logger.group, "tags": tuple(cfg.logger.tags), "mode": cfg.logger.mode,
            "config": OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)}
