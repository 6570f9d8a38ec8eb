"""From a ``TrainConfig`` to a running ``Coevolution`` loop: the only code that reads the config.

Every component below takes flat arguments; this module unpacks the config into them after
``coevo.loop.config_check`` has refused the values a user can get wrong (naming the field and the
allowed values), and owns the run directory's one-time files (the resolved config, with secrets
removed). What no config field sets, the components' own defaults decide (their named constants).
"""

from __future__ import annotations

import copy
import logging
import os
import random
from pathlib import Path
from typing import Any

import yaml

from coevo.config.mode import Mode
from coevo.config.schema import EvolutionConfig, TrainConfig, stale_fields
from coevo.errors import UsageError
from coevo.loop.config_check import (
    SCRIPTED_MODELS,
    check,
    check_context_window,
    check_dependencies,
    check_train_split,
    device_of,
)
from coevo.loop.schedule import Processes, Schedule, Splits, Training
from coevo.loop.termination import sigterm_raises

log = logging.getLogger("coevo")

RESUMABLE_CHANGES = {"rounds", "logger", "val_every", "test", "test_limit"}
"""Top-level keys that may differ when a run is started again on its directory."""


def to_config(cfg: Any) -> TrainConfig:
    """A ``TrainConfig`` from a Hydra ``DictConfig`` (or a ``TrainConfig`` as is)."""
    if isinstance(cfg, TrainConfig):
        return cfg
    from omegaconf import OmegaConf

    return OmegaConf.to_object(cfg)


def write_config(run_dir: Path, cfg: TrainConfig) -> None:
    """Write ``config.yaml`` (secrets scrubbed), or check a resumed run's config against it."""
    data = check_resumable(run_dir, cfg)
    path = run_dir / "config.yaml"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(data, sort_keys=False))
    tmp.replace(path)


def check_resumable(run_dir: Path, cfg: TrainConfig) -> dict[str, Any]:
    """The config as ``config.yaml`` records it, after checking it against the run ``run_dir`` holds
    (fewer rounds than completed, other keys than ``RESUMABLE_CHANGES``); writes nothing, so it can
    run before the model is loaded while the file is written only after."""
    from omegaconf import OmegaConf

    from coevo.report.tracking import scrub

    data = scrub(OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True))
    path = run_dir / "config.yaml"
    done = completed_rounds(run_dir)
    if cfg.rounds < done:
        raise UsageError(f"config rounds={cfg.rounds} must be >= {done}: {run_dir} already completed {done} rounds; "
                         "resume it with rounds >= that, or choose another name= / run_dir=")
    if path.is_file():
        saved = yaml.safe_load(path.read_text())
        stale = stale_fields(saved)
        if stale:  # its values may differ from what this version hard-codes: no silent change of behaviour
            raise UsageError(f"{run_dir} holds a run recorded by an earlier coevo whose config sets fields this "
                             f"version no longer has ({', '.join(stale)}); it cannot be resumed (coevo report and "
                             "scripts read it as it is): choose another name= / run_dir=")
        changed = sorted(k for k in set(saved) | set(data)
                         if saved.get(k) != data.get(k) and k not in RESUMABLE_CHANGES)
        if changed:
            raise UsageError(f"{run_dir} holds a run with a different config (keys {changed}); resume it with the same "
                             "config, or choose another name= / run_dir=")
    return data


def completed_rounds(run_dir: Path) -> int:
    """Rounds the run in ``run_dir`` has committed (0 for a new run)."""
    from coevo.rundir import checkpoint

    directory = checkpoint.latest(run_dir / "checkpoint")
    return 0 if directory is None else int(checkpoint.load_state(directory)["next_round"])


@sigterm_raises()  # a SIGTERM (scheduler, `kill`) unwinds through the finally below instead of skipping it
def run(cfg: Any) -> Path:
    """Build everything from the config, run the rounds (resuming when the run directory holds a
    committed round), write the report. Returns the run directory."""
    import torch

    from coevo.envs.load import make_env
    from coevo.loop.launch import launch_accelerator, torn_down_on_exit, with_launch_sharding
    from coevo.safety.secrets import install_log_redaction, remember_secrets

    cfg = to_config(cfg)
    check(cfg)
    check_dependencies(cfg)
    install_log_redaction()
    remember_secrets()  # a variable unset during the run is still redacted from what it writes
    device = device_of(cfg.model.device)
    if device == "cpu":  # DeepSpeed (where installed) is told, not left to detect it and warn on every run
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    mixed = "bf16" if device == "cuda" and torch.cuda.is_bf16_supported() else "no"
    # what the launch asked for (DeepSpeed, FSDP, N processes) or a one-line ValueError, never another strategy
    accelerator, sharding, reshard = launch_accelerator(device, mixed)
    with torn_down_on_exit(accelerator):  # a multi-process launch's process group, on every exit path
        cfg = with_launch_sharding(cfg, sharding)  # an FSDP2 / ZeRO-3 launch sets trainer.sharding
        check(cfg)
        random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)

        # the env and the starting harness come before the run directory and the model: a value only
        # they can check (batch_tasks against the train split, a harness YAML's parameters) stops the
        # run before config.yaml records it and before minutes of model loading
        env = make_env(cfg.env.name, cfg.env.args)
        try:
            return run_on_env(cfg, env, accelerator, reshard_after_forward=reshard)
        finally:  # every exit path, a failing start included: a TextWorld env's JVMs must not outlive the run
            close_env(env)


def close_env(env: Any) -> None:
    """``env.close()`` where the env has one (it is optional in the Env protocol)."""
    close = getattr(env, "close", None)
    if close is not None:
        close()


def run_on_env(cfg: TrainConfig, env: Any, accelerator: Any, *, reshard_after_forward: bool | None = None) -> Path:
    """The rest of ``run`` once the env is built; ``run`` closes the env however this ends.
    ``reshard_after_forward``: an FSDP2 launch config's choice (``launch_accelerator``), None for
    the trainer's default."""
    from accelerate.utils import broadcast_object_list

    from coevo.agent.rollouts import RolloutService
    from coevo.buffers import ReplayBuffer
    from coevo.envs.base import session_tools
    from coevo.evolution.engine import AEGIS
    from coevo.evolution.reference import ReferenceStore, build_references, split_reference_pool
    from coevo.loop.coevolution import Coevolution
    from coevo.policy.load import load_model
    from coevo.report.progress import NullProgress, RichProgress
    from coevo.report.tracking import NullTracker, make_tracker
    from coevo.rundir.lock import lock_run_dir, unlock_run_dir
    from coevo.safety.sandbox.python_tool import isolation as python_isolation
    from coevo.trainers.grpo import GRPOTrainer, apply_lora
    from coevo.trainers.logprobs import LOGPROB_BATCH_SIZE, logprob_fn

    is_main = accelerator.is_main_process
    try:
        pool, train = split_reference_pool(env.tasks("train"), cfg.evolution.reference_pool, cfg.seed)
    except ValueError as err:
        raise UsageError(f"config evolution.reference_pool={cfg.evolution.reference_pool}: {err}") from None
    check_train_split(cfg, len(train))
    start = start_harness(cfg)
    env_tools = session_tools(env, train[0])
    if "python" in env_tools or any(p.kind == "python_executor" for p in start.processors):
        python_isolation()  # model-written code will run: the jail must work (or the user opted out)
    run_dir = Path(cfg.run_dir)
    if is_main:
        lock_run_dir(run_dir)  # before anything is written; already held when train.py's callback took it
        check_resumable(run_dir, cfg)  # config.yaml itself waits for the model: a bad model.name must not record it
    accelerator.wait_for_everyone()

    mode = Mode(cfg.mode)
    trains = mode.trains
    model, tok = None, None
    if cfg.model.name not in SCRIPTED_MODELS:
        try:
            model, tok = load_model(cfg.model.name, device=str(accelerator.device), dtype=cfg.model.dtype)
        except ValueError as err:  # the loader names the allowed values; the field is named here
            raise UsageError(f"config model.name={cfg.model.name!r}: {err}") from err
    if trains and cfg.model.lora:
        model = apply_lora(model, r=cfg.model.lora_r, alpha=cfg.model.lora_alpha, dropout=cfg.model.lora_dropout)
    temperature = cfg.rollout.temperature if cfg.rollout.temperature > 0 else 1.0
    trainer, sharded = None, trains and cfg.trainer.sharding != "none"  # fsdp2 | zero3
    # Sharded, no rank holds whole weights to generate with: rank 0 keeps a whole copy for rollouts
    # and behaviour log-probs, refreshed from the gathered weights after every round's steps.
    rollout_model = copy.deepcopy(model) if sharded and is_main else None
    if trains:
        resharding = {} if reshard_after_forward is None else {"reshard_after_forward": reshard_after_forward}
        trainer = GRPOTrainer(model, cfg.trainer, pad_id=tok.pad_token_id, accelerator=accelerator,
                              total_steps=cfg.rounds * cfg.trainer.steps_per_round,
                              loss_horizon=cfg.rollout.max_new_tokens, **resharding)
        model = trainer.unwrapped
    if model is not None:
        policy, sync = build_policy(cfg, rollout_model or model, tok, generates=is_main)
        if sharded:
            sync = gathered_sync(trainer.model, rollout_model)
        model = rollout_model or model
    else:
        try:
            policy, sync = scripted_policy(cfg.model.name, env, cfg.env.name), None
        except ValueError as err:
            raise UsageError(f"config model.name={cfg.model.name!r}: {err}") from None
    prompt_size = check_context_window(policy, start, env, train[0], cfg.rollout.max_steps)
    if is_main:  # config and model are valid: the run directory's first file
        write_config(run_dir, cfg)

    progress = RichProgress() if is_main else NullProgress()
    if prompt_size is not None:
        progress.message(prompt_size)
    tasks = {t.task_id: t for t in train}
    evolves = mode.evolves
    references = {}
    if evolves and is_main:
        # every train task's reference serves the Digester; only those of the pool and of tasks no
        # remaining round trains on may become demonstrations (Coevolution.withheld)
        references = build_references(env, [*train, *pool], ReferenceStore(run_dir / "references", tokenizer=tok))

    rollouts = RolloutService(policy, env, batch_size=cfg.rollout.batch_size, max_steps=cfg.rollout.max_steps,
                              workers=cfg.rollout.workers, seed=cfg.seed, progress=progress, tokenizer=tok)
    e = cfg.evolution
    meta = build_meta(cfg, run_dir)
    critic = make_critic(e, rollouts.critic_rollout())
    aegis = AEGIS(start, meta, critic, tasks=tasks, critic_pool=tasks, references=references,
                  tools=env_tools, max_variants=e.max_variants, max_proposals=e.max_proposals,
                  router=meta.route if e.router else None)
    tracker = make_tracker(cfg.logger.kind, **tracker_kwargs(cfg, run_dir)) if is_main else NullTracker()
    buffer = ReplayBuffer(run_dir / "buffer", capacity=cfg.buffer.capacity) if trains and is_main else None
    schedule = Schedule(
        rounds=cfg.rounds, batch_tasks=cfg.batch_tasks, attempts=cfg.rollout.attempts, seed=cfg.seed,
        steps_per_round=cfg.trainer.steps_per_round, val_every=cfg.val_every, eval_attempts=cfg.eval_attempts,
        step_traces=cfg.trainer.step_traces, signal_groups=cfg.rollout.signal_groups,
        max_extra_tasks=cfg.rollout.max_extra_tasks,
        unscaffolded_attempts=cfg.rollout.unscaffolded_attempts if mode.unscaffolds else 0,
        evolve_rounds=lambda r: r < e.early_rounds or (e.every > 0 and (r - e.early_rounds + 1) % e.every == 0),
        critic_episodes=(e.stat_budget if e.gate == "stat" else cfg.batch_tasks * e.critic_attempts)
        * e.max_proposals,  # for the time estimate: one variant's proposals, each judged to the gate's budget
    )
    training = Training(
        trainer, buffer, sampler_logprobs=cfg.buffer.sampler_logprobs, critic_traces=cfg.buffer.critic_traces,
        logprob_fn=logprob_fn(model, tok.pad_token_id, temperature=temperature, batch_size=LOGPROB_BATCH_SIZE,
                              share_prefix=True)) if trains else None
    several = accelerator.num_processes > 1
    given = {"sync_weights": sync,  # release: a vLLM engine sleeps, the transformers policy drops its prefix cache
             "release_rollout": getattr(policy, "release", None),
             "share": (lambda obj: broadcast_object_list([obj], from_process=0)[0]) if several else None}
    processes = Processes(is_main=is_main, **{k: v for k, v in given.items() if v is not None})
    loop = Coevolution(
        mode=cfg.mode, rollouts=rollouts, aegis=aegis, run_dir=run_dir, schedule=schedule, training=training,
        processes=processes, tracker=tracker, progress=progress,
        splits=Splits(train, env.tasks("val")[: cfg.val_limit],
                      env.tasks("test")[: cfg.test_limit] if cfg.test else ()))
    try:
        loop.run()
    finally:
        if buffer is not None:
            buffer.close()
        tracker.finish()
    if is_main:
        from coevo.report.result import result_lines, run_result
        from coevo.report.summary import write_report

        out = write_report(run_dir)
        progress.message(f"report: {out / 'summary.md'} (figure: {out / 'result.png'})")
        for line in result_lines(run_result(loop.state.records, loop.state.start)):  # the run's last lines: its result
            progress.message(line)
        unlock_run_dir(run_dir)
    accelerator.wait_for_everyone()
    return run_dir


def make_critic(e: EvolutionConfig, rollout: Any) -> Any:
    """The Critic of ``evolution.*`` over ``rollout`` (also used by scripts/gate_quality.py)."""
    from coevo.evolution.critic import Critic

    return Critic(rollout, k=e.critic_attempts, gate=e.gate, delta=e.delta, n_tasks=e.stat_tasks, budget=e.stat_budget)


def start_harness(cfg: TrainConfig) -> Any:
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


def gathered_sync(sharded_model: Any, rollout_model: Any | None) -> Any:
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


def build_policy(cfg: TrainConfig, model: Any, tok: Any, *, generates: bool = True) -> tuple[Any, Any]:
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


def scripted_policy(name: str, env: Any, env_name: str, *, delegate: bool = False) -> Any:
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
        return GoldPolicy(tasks, answer=getattr(env, "gold_answer", None),
                          owner=getattr(env, "tool_owners", None) if delegate else None,
                          model_version=f"gold-{env.name}")
    solver = scripted_solver(env_name)
    if solver is None:
        raise UsageError(f"env {env_name!r} has no scripted solver; use a model")
    return ScriptedPolicy(solver, model_version=f"scripted-{env.name}")


def build_meta(cfg: TrainConfig, run_dir: Path) -> Any:
    from coevo.meta import make_meta_agent

    m = cfg.meta_agent
    return make_meta_agent(m.backend, url=m.url, model=m.model, cache_dir=run_dir / "meta_cache",
                           api_key_env=m.api_key_env)


def tracker_kwargs(cfg: TrainConfig, run_dir: Path) -> dict[str, Any]:
    if cfg.logger.kind == "none":
        return {}
    from omegaconf import OmegaConf

    return {"project": cfg.logger.project, "run_dir": run_dir, "entity": cfg.logger.entity, "name": cfg.name,
            "group": cfg.logger.group, "tags": tuple(cfg.logger.tags), "mode": cfg.logger.mode,
            "config": OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)}
