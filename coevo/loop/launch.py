"""From the launch to an ``Accelerator`` that is what the launch asked for, and the trainer's sharding.

A launch asks for a strategy through the variables ``accelerate launch`` exports
(``config_check.launch_request``). accelerate itself can quietly give another: ``Accelerator(cpu=True)``
under a DeepSpeed launch sets up gloo DDP (MULTI_CPU), and without it on a CPU-only machine it finds
no backend for DeepSpeed and reports one process on each rank. So DeepSpeed launches are never
built with ``cpu=True``, and on a CPU their process group is named (gloo); every other launch keeps
``cpu`` as the device says; ``config_check.check_distributed`` then compares what was set up with
what was asked, and refuses a mismatch in one line.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from coevo.errors import UsageError
from coevo.loop.config_check import check_distributed, launch_request

if TYPE_CHECKING:
    from accelerate import Accelerator
    from omegaconf import DictConfig


def launch_accelerator(device: str, mixed_precision: str, environ: Mapping[str, str] | None = None
                       ) -> tuple[Any, str | None, bool | None]:
    """(accelerator, sharding, reshard_after_forward) for a run on ``device`` ("cpu" | "cuda"):
    sharding is ``"fsdp2"``, ``"zero3"`` or None (``check_distributed``); reshard_after_forward is the
    FSDP2 launch config's (None otherwise). Under ZeRO-3 transformers is left in its plain mode
    (``coevo.trainers.zero.plain_transformers``). A ValueError when the launch cannot get what it asked for."""
    from accelerate import Accelerator
    from accelerate.utils import InitProcessGroupKwargs

    environ = os.environ if environ is None else environ
    requested, world_size = launch_request(environ)
    deepspeed = requested == "deepspeed"
    if deepspeed:
        from coevo.config.optional import require

        require("deepspeed", "a DeepSpeed launch (ACCELERATE_USE_DEEPSPEED=true)")
        if "LOCAL_RANK" not in environ:  # accelerate would still report DEEPSPEED, without a process group
            raise UsageError("ACCELERATE_USE_DEEPSPEED=true without a launcher (LOCAL_RANK is unset): start DeepSpeed "
                             "runs with accelerate launch --config_file configs/accelerate/zero3.yaml")
    handlers = [InitProcessGroupKwargs(backend="gloo")] if deepspeed and device == "cpu" else []
    accelerator = Accelerator(cpu=device == "cpu" and not deepspeed, mixed_precision=mixed_precision,
                              kwargs_handlers=handlers)
    if deepspeed and accelerator.device.type != device:
        raise UsageError(f"config model.device={device} but the DeepSpeed launch runs on {accelerator.device.type} "
                         "(DeepSpeed's accelerator; DS_ACCELERATOR=cpu selects the CPU one): set model.device to match")
    fsdp = getattr(accelerator.state, "fsdp_plugin", None)  # None on CPU: accelerate sets up FSDP only on GPUs
    version = getattr(fsdp, "fsdp_version", None) or int(environ.get("FSDP_VERSION", "1") or 1)
    ds = accelerator.state.deepspeed_plugin  # None unless DeepSpeed runs
    zero_stage = ds.deepspeed_config.get("zero_optimization", {}).get("stage") if ds is not None else None
    sharding = check_distributed(accelerator.distributed_type, version, requested=requested, world_size=world_size,
                                 processes=accelerator.num_processes, zero_stage=zero_stage)
    reshard = None
    if sharding == "fsdp2":
        reshard = bool(fsdp.reshard_after_forward) if fsdp is not None else \
            environ.get("FSDP_RESHARD_AFTER_FORWARD", "true").strip().lower() in ("true", "1", "yes")
    if sharding == "zero3":
        from coevo.trainers import zero

        zero.plain_transformers(ds)
    return accelerator, sharding, reshard


@contextmanager
def torn_down_on_exit(accelerator: Accelerator) -> Iterator[None]:
    """Around a multi-process run's work: on the way out, however it leaves, the process group is
    destroyed while the interpreter is whole. Left to interpreter shutdown, gloo's worker threads
    can still hold async work (ZeRO-3's prefetching all-gathers, DDP's bucket reductions) whose
    tensors are freed after Python is gone, and the process aborts with "terminate called without
    an active exception" (exit -6) after its work succeeded; under load, where a rank's last
    collective finishes late, that was an occasional failure of every two-rank test. On a clean
    exit the ranks first meet at a barrier, so no rank tears down while a peer still sends to it;
    after an exception there is no barrier (a peer may never arrive: the launcher ends it)."""
    import gc

    import torch.distributed as dist

    clean = False
    try:
        yield
        clean = True
    finally:
        if dist.is_available() and dist.is_initialized():
            if clean:
                accelerator.wait_for_everyone()
            gc.collect()  # collective handles held in reference cycles (DeepSpeed's hooks) go while all is alive
            dist.destroy_process_group()


def end_rank() -> None:
    """End one rank of a multi-process launch (``WORLD_SIZE`` > 1) after its work and its
    teardown, without interpreter finalization: logs and standard streams are flushed, then the
    process exits 0 at once. ``destroy_process_group`` only drops torch's own references to a
    group; DeepSpeed keeps others (its engine, ZeRO-3's parameter coordinator), so the gloo groups
    and the work they hold die during finalization, where freeing a tensor from a gloo thread
    that needs the interpreter aborts the process ("terminate called without an active
    exception", exit -6) after its work succeeded. PyTorch's attempt to do this teardown at exit
    (pytorch#179291) was abandoned as harder than it looked; a rank has nothing left to finalise
    (its files are closed, the tracker finished), so it skips the step. A single process returns."""
    import logging

    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def with_launch_sharding(cfg: DictConfig, sharding: str | None) -> DictConfig:
    """``cfg`` with the launch's sharding (``launch_accelerator``'s) as ``trainer.sharding`` (the
    FSDP2 launch config's resharding choice goes to the trainer as an argument: ``coevo.loop.build``).
    A config that names another sharding than the launch gives is a ValueError:
    ``trainer.sharding=zero3`` needs a DeepSpeed launch, and a DeepSpeed or FSDP launch takes
    ``none`` or its own (``fsdp2`` without an FSDP launch config is the CPU path: the trainer shards
    a DDP launch's ranks itself)."""
    import dataclasses

    asked = cfg.trainer.sharding
    if sharding is None and asked != "zero3":
        return cfg
    if asked not in ("none", sharding):
        launch = {"zero3": "a DeepSpeed ZeRO-3 launch", "fsdp2": "an FSDP2 launch", None: "a launch without DeepSpeed"}
        launch = launch[sharding]
        raise UsageError(f"config trainer.sharding={asked} does not fit {launch}: DeepSpeed launches "
                         "(configs/accelerate/zero3.yaml) set zero3 and FSDP launches fsdp2 themselves; leave "
                         "trainer.sharding=none")
    return dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, sharding=sharding))
