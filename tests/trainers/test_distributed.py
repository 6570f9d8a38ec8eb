"""Two gloo processes give the parameters of one process that accumulates both shards.

(`accelerate launch --multi_gpu --num_processes 2` starts two gloo ranks on a CPU-only machine;
`--cpu --num_processes 2` silently starts one.)"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.trainers.helpers import launch_failure

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_two_processes_equal_one_with_doubled_accumulation(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1"}
    one = subprocess.run([sys.executable, "-m", "tests.trainers.ddp_worker", str(tmp_path / "one.pt"), "4"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, launch_failure(one)
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
              "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port",
              "29517", "-m", "tests.trainers.ddp_worker", str(tmp_path / "two.pt"), "2"]
    two = subprocess.run(launch, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert two.returncode == 0, launch_failure(two)
    assert "rank 1 of 2 done" in two.stdout and "rank 0 of 2 done" in two.stdout
    one_steps, two_steps = torch.load(tmp_path / "one.pt"), torch.load(tmp_path / "two.pt")
    initial = __import__("coevo.policy.tiny", fromlist=["tiny_model"])
    start = initial.tiny_model(initial.tiny_tokenizer(), seed=0).state_dict()
    # after the first step: plain SGD without clipping, so the update is lr x the reduced gradient
    # and a missing reduction, a wrong shard or a wrong scale (mean vs sum over ranks) is off by a
    # multiple of the update, far above float32 summation-order noise
    a, b = one_steps[0], two_steps[0]
    assert a.keys() == b.keys()
    moved = max(float((start[k] - a[k]).abs().max()) for k in a)
    assert moved > 1e-2, moved
    for k in a:
        assert (a[k] - b[k]).abs().max() < 1e-4 * moved, (k, float((a[k] - b[k]).abs().max()), moved)
    # later steps compound that noise through clip boundaries (ratios crossing 1 ± eps), so the
    # final weights are compared loosely: still far below one update
    a, b = one_steps[-1], two_steps[-1]
    for k in a:
        assert (a[k] - b[k]).abs().max() < 1e-2 * moved, (k, float((a[k] - b[k]).abs().max()), moved)
