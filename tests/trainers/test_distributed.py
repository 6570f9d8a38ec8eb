"""Two gloo processes give the parameters of one process that accumulates both shards.

(`accelerate launch --multi_gpu --num_processes 2` starts two gloo ranks on a CPU-only machine;
`--cpu --num_processes 2` silently starts one.)"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_two_processes_equal_one_with_doubled_accumulation(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    one = subprocess.run([sys.executable, "-m", "tests.trainers.ddp_worker", str(tmp_path / "one.pt"), "2"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stderr[-3000:]
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
              "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port",
              "29517", "-m", "tests.trainers.ddp_worker", str(tmp_path / "two.pt"), "1"]
    two = subprocess.run(launch, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert two.returncode == 0, two.stderr[-3000:]
    assert "rank 1 of 2 done" in two.stdout and "rank 0 of 2 done" in two.stdout
    a, b = torch.load(tmp_path / "one.pt"), torch.load(tmp_path / "two.pt")
    assert a.keys() == b.keys()
    for k in a:
        # Adam divides by sqrt(v): summation-order noise (~1e-7) on near-zero gradients can show
        # up as ~1e-4 in a weight, while a wrong reduction would be off by the whole update
        assert (a[k] - b[k]).abs().max() < 1e-4, (k, float((a[k] - b[k]).abs().max()))
    initial = __import__("coevo.policy.tiny", fromlist=["tiny_model"])
    tok = initial.tiny_tokenizer()
    start = initial.tiny_model(tok, seed=0).state_dict()
    assert any(not torch.allclose(start[k], a[k]) for k in a)  # training moved the weights
