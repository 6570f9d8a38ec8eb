"""From a ``TrainConfig`` to a running ``Coevolution`` loop: the run, its directory, and the recipe.

Every component takes flat arguments; ``run_on_env`` reads as the recipe and
``coevo.loop.builders`` unpacks the config into each component, after ``coevo.loop.config_check``
has refused the values a user can get wrong (naming the field and the allowed values). This module
owns the run directory's one-time files (the resolved config, with secrets removed). What no config
field sets, the components' own defaults decide (their named constants).
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from coevo.config.mode import Mode
from coevo.config.schema import TrainConfig, stale_fields
from coevo.errors import UsageError
from coevo.loop.builders import (
    build_aegis,
    build_meta,
    build_models,
    build_processes,
    build_rollout_policy,
    build_rollouts,
    build_schedule,
    build_training,
    start_harness,
    tracker_kwargs,
)
from coevo.loop.config_check import check, check_context_window, check_dependencies, check_train_split, device_of
from coevo.loop.schedule import Splits
from coevo.loop.termination import sigterm_raises

if TYPE_CHECKING:
    from accelerate import Accelerator
    from omegaconf import DictConfig

    from coevo.envs.base import Env, Task
    from coevo.harness.harness import Harness
    from coevo.loop.coevolution import Coevolution
    from coevo.report.progress import ProgressDisplay

RESUMABLE_CHANGES = {"rounds", "logger", "val_every", "test", "test_limit"}
"""Top-level keys that may differ when a run is started again on its directory."""


def to_config(cfg: DictConfig | TrainConfig) -> TrainConfig:
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
def run(cfg: DictConfig | TrainConfig) -> Path:
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
            env.close()


def run_on_env(cfg: TrainConfig, env: Env, accelerator: Accelerator, *,
               reshard_after_forward: bool | None = None) -> Path:
    """The recipe, once the env is built (``run`` closes it however this ends): the tasks and the
    starting harness, the run directory, the weights and the policy, AEGIS, GRPO's half of a round,
    then the rounds and the report. ``reshard_after_forward``: an FSDP2 launch config's choice
    (``launch_accelerator``), None for the trainer's default."""
    from coevo.evolution.reference import ReferenceStore, build_references
    from coevo.loop.coevolution import Coevolution
    from coevo.report.progress import NullProgress, RichProgress
    from coevo.report.tracking import NullTracker, make_tracker

    mode, is_main = Mode(cfg.mode), accelerator.is_main_process
    pool, train = reference_split(cfg, env)
    start = start_harness(cfg)
    env_tools = env.tool_names(train[0])
    require_jail(env_tools, start)
    run_dir = open_run_dir(cfg, accelerator)
    models = build_models(cfg, mode, accelerator, reshard_after_forward)
    policy, sync = build_rollout_policy(cfg, env, models, generates=is_main)
    prompt_size = check_context_window(policy, start, env, train[0], cfg.rollout.max_steps)
    if is_main:  # config and model are valid: the run directory's first file
        write_config(run_dir, cfg)
    progress = RichProgress() if is_main else NullProgress()
    if prompt_size is not None:
        progress.message(prompt_size)

    rollouts = build_rollouts(cfg.rollout, policy, env, seed=cfg.seed, progress=progress, tokenizer=models.tokenizer)
    # every train task's reference serves the Digester; only those of the pool and of tasks no
    # remaining round trains on may become demonstrations (Coevolution.withheld)
    store = ReferenceStore(run_dir / "references", tokenizer=models.tokenizer)
    references = build_references(env, [*train, *pool], store) if mode.evolves and is_main else {}
    aegis = build_aegis(cfg.evolution, start, rollouts, build_meta(cfg, run_dir), tasks={t.task_id: t for t in train},
                        references=references, tools=env_tools, inert=env.inert_processors)
    training = build_training(cfg, models, run_dir, is_main=is_main) if mode.trains else None
    tracker = make_tracker(cfg.logger.kind, **tracker_kwargs(cfg, run_dir)) if is_main else NullTracker()
    loop = Coevolution(
        mode=cfg.mode, rollouts=rollouts, aegis=aegis, run_dir=run_dir, schedule=build_schedule(cfg, mode),
        training=training, processes=build_processes(accelerator, policy, sync), tracker=tracker, progress=progress,
        splits=Splits(train, env.tasks("val")[: cfg.val_limit],
                      env.tasks("test")[: cfg.test_limit] if cfg.test else ()))
    try:
        loop.run()
    finally:
        if training is not None and training.buffer is not None:
            training.buffer.close()
        tracker.finish()
    if is_main:
        report_result(run_dir, loop, progress)
    accelerator.wait_for_everyone()
    return run_dir


def reference_split(cfg: TrainConfig, env: Env) -> tuple[list[Task], list[Task]]:
    """(reference pool, train tasks): the pool's tasks only ever serve as demonstrations."""
    from coevo.evolution.reference import split_reference_pool

    try:
        pool, train = split_reference_pool(env.tasks("train"), cfg.evolution.reference_pool, cfg.seed)
    except ValueError as err:
        raise UsageError(f"config evolution.reference_pool={cfg.evolution.reference_pool}: {err}") from None
    check_train_split(cfg, len(train))
    return pool, train


def require_jail(env_tools: list[str], start: Harness) -> None:
    """Model-written code will run (a python tool, a python executor): the jail must work, or the user
    opted out."""
    from coevo.safety.sandbox.python_tool import isolation

    if "python" in env_tools or any(p.kind == "python_executor" for p in start.processors):
        isolation()


def open_run_dir(cfg: TrainConfig, accelerator: Accelerator) -> Path:
    """Lock the run directory and check that its run can be resumed with this config, on rank 0,
    before anything is written (the lock is already held when train.py's callback took it);
    ``config.yaml`` itself waits for the model, so a bad ``model.name`` does not record it."""
    from coevo.rundir.lock import lock_run_dir

    run_dir = Path(cfg.run_dir)
    if accelerator.is_main_process:
        lock_run_dir(run_dir)
        check_resumable(run_dir, cfg)
    accelerator.wait_for_everyone()
    return run_dir


def report_result(run_dir: Path, loop: Coevolution, progress: ProgressDisplay) -> None:
    """Write the report, print the run's result as its last lines, release the run directory."""
    from coevo.report.result import result_lines, run_result
    from coevo.report.summary import write_report
    from coevo.rundir.lock import unlock_run_dir

    out = write_report(run_dir)
    progress.message(f"report: {out / 'summary.md'} (figure: {out / 'result.png'})")
    for line in result_lines(run_result(loop.state.records, loop.state.start)):
        progress.message(line)
    unlock_run_dir(run_dir)
