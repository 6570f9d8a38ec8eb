"""``torn_down_on_exit``: the process group of a launch is destroyed on every way out of the run,
after a barrier only when the run ended cleanly (after an exception a peer may never arrive)."""

import pytest
import torch
import torch.distributed as dist

from coevo.loop.launch import torn_down_on_exit


class Recorder:
    def __init__(self):
        self.barriers = 0

    def wait_for_everyone(self):
        assert dist.is_initialized()  # the barrier comes before the group is destroyed
        self.barriers += 1


def one_rank_group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)


def test_a_clean_exit_meets_at_a_barrier_then_destroys_the_group(tmp_path):
    one_rank_group(tmp_path)
    accelerator = Recorder()
    with torn_down_on_exit(accelerator):
        dist.all_reduce(torch.ones(3), async_op=True).wait()
    assert accelerator.barriers == 1 and not dist.is_initialized()


def test_an_exception_destroys_the_group_without_a_barrier_and_propagates(tmp_path):
    one_rank_group(tmp_path)
    accelerator = Recorder()
    with pytest.raises(KeyboardInterrupt):
        with torn_down_on_exit(accelerator):
            raise KeyboardInterrupt
    assert accelerator.barriers == 0 and not dist.is_initialized()


def test_a_single_process_run_has_nothing_to_tear_down():
    accelerator = Recorder()
    with torn_down_on_exit(accelerator):
        pass
    assert accelerator.barriers == 0 and not dist.is_initialized()


RANK_SCRIPT = """
import atexit, logging, sys
from coevo.loop.launch import end_rank
atexit.register(lambda: print("finalised", flush=True))
logging.basicConfig(stream=sys.stderr, level=logging.INFO)
logging.getLogger("run").info("logged")
print("work done")  # buffered (stdout is a pipe): end_rank must flush it
end_rank()
print("after end_rank")
"""


@pytest.mark.parametrize("world_size", ["1", "2"])
def test_a_rank_of_a_launch_ends_without_finalization_and_loses_no_output(world_size):
    """Under a launch of several ranks the process ends at ``end_rank`` (no atexit handler, no
    interpreter finalization) with its output flushed and status 0; a single process goes on."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "WORLD_SIZE": world_size, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run([sys.executable, "-c", RANK_SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "work done" in done.stdout and "logged" in done.stderr
    if world_size == "2":
        assert "after end_rank" not in done.stdout and "finalised" not in done.stdout
    else:
        assert "after end_rank" in done.stdout and "finalised" in done.stdout
