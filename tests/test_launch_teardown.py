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
