"""FSDP2 over two gloo ranks trains like one process holding the whole model, and a sharded run
resumed from its checkpoint continues exactly; full fine-tune and LoRA."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.trainers.helpers import launch_failure

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1"}


def _one(out: Path, *flags: str) -> None:
    done = subprocess.run([sys.executable, "-m", "tests.trainers.fsdp_worker", str(out), "4", *flags],
                          cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, launch_failure(done)


def _two(out: Path, port: int, *flags: str) -> None:
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
              "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port",
              str(port), "-m", "tests.trainers.fsdp_worker", str(out), "2", "--sharded", *flags]
    done = subprocess.run(launch, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, launch_failure(done)
    assert "rank 0 of 2 done" in done.stdout and "rank 1 of 2 done" in done.stdout


def _close(a: dict, b: dict, tol: float) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert (a[k] - b[k]).abs().max() <= tol, (k, float((a[k] - b[k]).abs().max()), tol)


@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_fsdp2_on_two_ranks_equals_one_process_and_resumes_exactly(tmp_path, lora):
    flags = ["--lora"] if lora else []
    port = 29641 + 2 * lora
    _one(tmp_path / "one.pt", *flags)
    _two(tmp_path / "two.pt", port, *flags)
    one, two = torch.load(tmp_path / "one.pt"), torch.load(tmp_path / "two.pt")

    from coevo.policy.tiny import tiny_model, tiny_tokenizer

    start = tiny_model(tiny_tokenizer(), seed=0, arch="llama").state_dict()
    first = {k: v for k, v in one[0].items() if "lora_B" in k} if lora else one[0]
    moved = max(float((v - (0 if lora else start[k.removeprefix("base_model.model.")])).abs().max())
                for k, v in first.items())
    assert moved > 1e-2, moved  # a real update, so a missing or doubled gradient shard is far above tolerance
    # plain SGD without clipping: the update is lr x the reduced gradient, and a wrong shard, a wrong
    # scale (mean vs sum over ranks) or a missing reduction is off by a multiple of it
    _close(one[0], two[0], 1e-4 * moved)
    _close(one[2], two[2], 1e-2 * moved)  # later steps compound fp32 summation order through the clip

    # resume: AdamW's state and the weights gathered into whole files, loaded into a fresh sharded model
    _two(tmp_path / "saved.pt", port, "--adamw", "--save", str(tmp_path / "ckpt"), *flags)
    _two(tmp_path / "resumed.pt", port + 1, "--adamw", "--resume", str(tmp_path / "ckpt"), *flags)
    saved, resumed = torch.load(tmp_path / "saved.pt"), torch.load(tmp_path / "resumed.pt")
    step = max(float((saved[2][k] - saved[1][k]).abs().max()) for k in saved[2])
    assert step > 1e-3, step  # step 2 moved the weights, and the resumed run moved them identically
    _close(saved[2], resumed[2], 1e-6 * step)
    files = sorted(p.name for p in (tmp_path / "ckpt" / "model").iterdir())
    assert any(name.endswith(".safetensors") for name in files), files  # whole weights, as one process writes them
