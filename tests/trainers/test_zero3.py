"""DeepSpeed ZeRO-3 through accelerate on two CPU ranks (DeepSpeed's CPU accelerator, gloo): the trainer's
step equals one process's, with the parameters really partitioned and the fused hidden-state loss fed
the gathered LM head; checkpoints are whole files that one process loads, and a resumed run continues
exactly; train.py under the ZeRO-3 launch config trains ZeRO-3, and a DeepSpeed launch it cannot honour
is refused in one line. Full fine-tune and LoRA."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.trainers.helpers import launch_failure

pytest.importorskip("deepspeed", reason="the deepspeed extra (scripts/bootstrap.sh installs it without a GPU)")

ROOT = Path(__file__).resolve().parents[2]
# the venv's bin first: DeepSpeed JIT-compiles its CPU shm comm op at start-up (30-80 s here) and compiles it
# again whenever another ninja builds it (the system's vs the one deepspeed installs); one ninja keeps it cached
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1", "DS_ACCELERATOR": "cpu", "WANDB_SILENT": "true",
       "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
ZERO3 = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
         str(ROOT / "configs" / "accelerate" / "zero3.yaml"), "--num_processes", "2"]  # the config's mixed_precision (bf16) is left to coevo, which asks for none on CPU


def _one(out: Path, *flags: str) -> None:
    done = subprocess.run([sys.executable, "-m", "tests.trainers.zero3_worker", str(out), "4", *flags],
                          cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, launch_failure(done)


def _two(out: Path, port: int, *flags: str) -> list[dict]:
    launch = [*ZERO3, "--main_process_port", str(port), "-m", "tests.trainers.zero3_worker", str(out), "2", "--zero3",
              *flags]
    done = subprocess.run(launch, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, launch_failure(done)
    assert "rank 0 of 2 done" in done.stdout and "rank 1 of 2 done" in done.stdout
    return [json.loads(Path(f"{out}.rank{r}.json").read_text()) for r in (0, 1)]


def _close(a: dict, b: dict, tol: float) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert (a[k] - b[k]).abs().max() <= tol, (k, float((a[k] - b[k]).abs().max()), tol)


def _update(before: dict, after: dict) -> float:
    return max(float((after[k] - before[k]).abs().max()) for k in after)


@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_zero3_on_two_ranks_equals_one_process_partitioned_with_the_head_gathered(tmp_path, lora):
    # LoRA with the KL to its adapter-less base: a reference forward per micro-batch, the filler's included
    flags = ["--lora", "--beta", "0.1"] if lora else []
    _one(tmp_path / "one.pt", *flags)
    ranks = _two(tmp_path / "two.pt", 29681 + lora, *flags)
    one, two = torch.load(tmp_path / "one.pt"), torch.load(tmp_path / "two.pt")

    # it ran as DeepSpeed on two ranks, in fp32 (coevo's choice on CPU, over the config's bf16)
    assert [(r["distributed_type"], r["processes"], r["rank"], r["bf16"]) for r in ranks] == \
        [("DistributedType.DEEPSPEED", 2, 0, False), ("DistributedType.DEEPSPEED", 2, 1, False)]
    # partitioned, not replicated as under DDP: outside a gather a rank holds no element of a weight
    # matrix, and its slice (ds_tensor) is half of it
    prefix = "base_model.model." if lora else ""
    for name in (f"{prefix}model.layers.0.self_attn.q_proj{'.base_layer' if lora else ''}.weight",
                 f"{prefix}model.embed_tokens.weight"):
        sizes = [r["sizes"][name] for r in ranks]
        assert [s["local"] for s in sizes] == [0, 0], (name, sizes)
        assert [s["shard"] for s in sizes] == [sizes[0]["whole"] // 2] * 2, (name, sizes)
    # the fused chunked loss got hidden states [N, 64] and the whole LM head [V, 64], a ZeRO-3 parameter
    # gathered for it (tied to the embedding, whose rank-local size is 0 outside the gather)
    vocab = ranks[0]["sizes"][f"{prefix}model.embed_tokens.weight"]["whole"] // 64
    for r in ranks:
        assert len(r["loss_calls"]) >= 3
        assert all(c == {"hidden": [c["hidden"][0], 64], "weight": [vocab, 64], "impl": "chunked", "zero_param": True}
                   for c in r["loss_calls"]), r["loss_calls"]

    from coevo.policy.tiny import tiny_model, tiny_tokenizer

    start = tiny_model(tiny_tokenizer(), seed=0, arch="llama").state_dict()
    first = {k: v for k, v in one["steps"][0].items() if "lora_B" in k} if lora else one["steps"][0]
    moved = max(float((v - (0 if lora else start[k])).abs().max()) for k, v in first.items())
    assert moved > 1e-2, moved  # a real update, so a missing or doubled gradient shard is far above tolerance
    # plain SGD without clipping: the update is lr x the reduced gradient, and a wrong slice, a wrong
    # scale (mean vs sum over ranks) or a missing reduction is off by a multiple of it
    _close(one["steps"][0], two["steps"][0], 1e-4 * moved)
    _close(one["steps"][1], two["steps"][1], 1e-3 * moved)  # step 1: rank 1 runs a zero-weight filler forward
    _close(one["steps"][2], two["steps"][2], 1e-3 * moved)
    for step in range(3):  # the same schedule (once per step, not once per rank) and the same gradient norm
        (lr_one, norm_one), (lr_two, norm_two) = one["metrics"][step], two["metrics"][step]
        assert lr_one == lr_two and abs(norm_one - norm_two) <= 1e-5 * norm_one, (step, one["metrics"], two["metrics"])
    assert one["metrics"][0][0] > one["metrics"][2][0]


@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_a_zero3_checkpoint_is_whole_loads_in_one_process_and_resumes_exactly(tmp_path, lora):
    flags = ["--adamw", *(["--lora"] if lora else [])]
    ckpt = tmp_path / "ckpt"
    _two(tmp_path / "saved.pt", 29685 + 2 * lora, "--save", str(ckpt), *flags)
    _two(tmp_path / "resumed.pt", 29686 + 2 * lora, "--resume", str(ckpt), *flags)
    _one(tmp_path / "one.pt", "--resume", str(ckpt), *flags)  # ZeRO-3's files, loaded by one process
    saved, resumed, one = (torch.load(tmp_path / f"{n}.pt")["steps"] for n in ("saved", "resumed", "one"))

    # the files one process writes: the same names (a tied head once, an adapter alone), the gathered weights
    from safetensors.torch import load_file

    from coevo.policy.tiny import tiny_model, tiny_tokenizer
    from coevo.trainers.grpo import apply_lora

    plain = tiny_model(tiny_tokenizer(), seed=0, arch="llama")
    plain = apply_lora(plain, r=4, alpha=8, dropout=0.0) if lora else plain
    plain.save_pretrained(tmp_path / "plain")
    name = "adapter_model.safetensors" if lora else "model.safetensors"
    files, expected = load_file(ckpt / "model" / name), load_file(tmp_path / "plain" / name)
    assert sorted(files) == sorted(expected)
    for key, tensor in files.items():
        gathered = saved[1][re.sub(r"\.(lora_[AB])\.weight$", r".\1.default.weight", key)]
        assert tensor.dtype == expected[key].dtype and torch.equal(tensor, gathered), key

    step = _update(saved[1], saved[2])
    assert step > 1e-3, step  # step 2 moved the weights, and the resumed runs moved them the same way
    _close(saved[2], resumed[2], 1e-6 * step)  # AdamW moments, step count and the schedule's rate restored
    _close(saved[2], one[2], 1e-4 * step)


@pytest.mark.slow
def test_train_py_under_the_zero3_launch_config_trains_zero3(tmp_path):
    """The main entry point under the ZeRO-3 config: DeepSpeed on two CPU ranks, not gloo DDP; rank 0
    rolls out from a whole copy refreshed from the gathered weights, so round 1's first step is on-policy
    (a stale copy would put its ratio off 1 by round 0's update)."""
    run = tmp_path / "run"
    cmd = [*ZERO3, "--main_process_port", "29691", str(ROOT / "train.py"), "experiment=smoke", "rounds=2",
           "trainer.lr=1e-2", f"hydra.run.dir={run}"]
    done = subprocess.run(cmd, cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, launch_failure(done)
    import yaml

    assert yaml.safe_load((run / "config.yaml").read_text())["trainer"]["sharding"] == "zero3"
    rounds = [json.loads(line) for line in (run / "rounds.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rounds] == [0, 1]
    for r in rounds:
        first = r["grpo"]["steps"][0]
        assert first["sequences"] > 0 and first["grad_norm"] > 0, r["grpo"]
        assert abs(first["ratio_min"] - 1) < 1e-4 and abs(first["ratio_max"] - 1) < 1e-4, r["grpo"]
    assert any((run / "checkpoint").rglob("trainer/model/model.safetensors"))


@pytest.mark.slow
def test_a_deepspeed_launch_train_py_cannot_honour_is_refused_in_one_line(tmp_path):
    """ZeRO stage 2, and a DeepSpeed request without a launcher: one line naming why (exit 2), no run."""
    zero2 = [sys.executable, "-m", "accelerate.commands.launch", "--use_deepspeed", "--zero_stage", "2",
             "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
             "--main_process_port", "29692", str(ROOT / "train.py"), "experiment=smoke",
             f"hydra.run.dir={tmp_path / 'a'}"]
    alone = [sys.executable, str(ROOT / "train.py"), "experiment=smoke", f"hydra.run.dir={tmp_path / 'b'}"]
    for cmd, env, why in [(zero2, ENV, "error: DeepSpeed ZeRO stage 2 is not supported: coevo runs DeepSpeed at "
                                       "stage 3 (configs/accelerate/zero3.yaml)"),
                          (alone, {**ENV, "ACCELERATE_USE_DEEPSPEED": "true"},
                           "error: ACCELERATE_USE_DEEPSPEED=true without a launcher (LOCAL_RANK is unset)")]:
        done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode != 0
        assert any(line.startswith(why) for line in done.stderr.splitlines()), done.stderr[-3000:]
        assert not (tmp_path / "a" / "config.yaml").exists() and not (tmp_path / "b" / "config.yaml").exists()


def test_a_zero3_step_asking_for_another_clipping_norm_is_refused():
    """DeepSpeed clips at the norm its config was given when the model was wrapped; a step that asks
    for another one must not be clipped silently at the configured norm."""
    from coevo.trainers.strategies import ZeRO3

    strategy = ZeRO3(accelerator=None, plugin=None, max_grad_norm=1.0)  # the check runs before any engine call
    with pytest.raises(ValueError, match=r"clips at gradient_clipping=1, .*max_grad_norm=0.5"):
        strategy.step(0.5)
