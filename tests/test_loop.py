"""The co-evolution loop end to end on the smoke experiment: records, checkpoints, report, the
ablation modes, and a run killed with SIGKILL at random moments that resumes to exactly the
result of an uninterrupted one."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import coevo
from coevo.buffers import ReplayBuffer
from coevo.loop.round_plan import round_batches
from tests.test_config import compose_cfg

ROOT = Path(__file__).resolve().parents[1]


def smoke(run_dir: Path, *overrides: str):
    return compose_cfg(["experiment=smoke", *overrides, f"run_dir={run_dir}"])


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "rounds.jsonl").read_text().splitlines()]


def killed_in_round_1_and_resumed(run_dir: Path, monkeypatch, *overrides: str) -> Path:
    """A smoke run killed in round 1's GRPO step (its rollouts committed to the buffer), then
    started again on the same directory: what a resume after a crash mid-round gives."""
    from coevo.loop.coevolution import Coevolution

    original = Coevolution._train

    def crash_in_round_1(self, batch, r):
        if r == 1:
            raise RuntimeError("killed")
        return original(self, batch, r)

    monkeypatch.setattr(Coevolution, "_train", crash_in_round_1)
    with pytest.raises(RuntimeError, match="killed"):
        coevo.run(smoke(run_dir, *overrides))
    monkeypatch.setattr(Coevolution, "_train", original)
    return Path(coevo.run(smoke(run_dir, *overrides)))


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    latest = (run_dir / "checkpoint" / "latest").read_text().strip()
    return load_file(next((run_dir / "checkpoint" / latest / "trainer" / "model").glob("*.safetensors")))


def test_a_phase_timed_twice_adds_up_and_the_phases_sum_to_the_total(monkeypatch):
    from coevo.loop import round_record

    now = iter([0.0, 1.0, 3.0, 3.5, 4.0, 4.5, 5.0, 10.0])  # began; eval 1→3; grpo 3.5→4; eval 4.5→5; close at 10
    monkeypatch.setattr(round_record.time, "perf_counter", lambda: next(now))
    clock = round_record.PhaseClock()
    for phase in ("eval", "grpo", "eval"):
        with clock(phase):
            pass
    assert clock.close() == {"eval": 2.5, "grpo": 0.5, "total": 10.0, "other": 7.0}


def test_round_batches_walk_epochs_of_the_shuffled_split():
    tasks = [type("T", (), {"task_id": str(i)})() for i in range(10)]
    out = round_batches(tasks, 4, seed=1, rounds=5)
    assert [len(b) for b in out] == [4, 4, 4, 4, 4]
    first, second = out[:2], out[2:4]  # two full batches per epoch; the remainder waits for a later epoch
    assert len({t.task_id for b in first for t in b}) == 8 and len({t.task_id for b in second for t in b}) == 8
    assert [t.task_id for t in out[0]] != [t.task_id for t in out[2]]  # each epoch reshuffles
    assert round_batches(tasks, 4, seed=1, rounds=5) == out


def test_smoke_coevolution_run_writes_records_checkpoint_and_report(tmp_path, monkeypatch):
    from coevo.loop.coevolution import Coevolution
    from coevo.policy.tiny import tiny_model, tiny_tokenizer
    from coevo.report.data import load_run
    from coevo.rundir.state import LoopState

    loops = []
    run_loop = Coevolution.run
    monkeypatch.setattr(Coevolution, "run", lambda self: loops.append(self) or run_loop(self))
    run_dir = Path(coevo.run(smoke(tmp_path / "run")))
    # the typed records round-trip: rounds.jsonl and lineage.jsonl read back equal to the loop's own
    (loop,) = loops
    run = load_run(run_dir)
    assert run.records == loop.state.records and run.lineage == loop.state.lineage
    assert [type(r).__name__ for r in loop.state.records] == ["RoundRecord", "RoundRecord"]
    latest = (run_dir / "checkpoint" / "latest").read_text().strip()
    saved = LoopState.from_state(json.loads((run_dir / "checkpoint" / latest / "state.json").read_text()), "state")
    assert saved.records[:-1] == loop.state.records[:-1] and saved.lineage == loop.state.lineage
    assert saved.records[-1].train == loop.state.records[-1].train  # its timings were taken after the commit
    recs = records(run_dir)
    assert [r["round"] for r in recs] == [0, 1]
    phases = {"rollout", "logprobs", "digest", "plan", "critic", "grpo", "checkpoint"}
    assert [set(r["seconds"]) for r in recs] == [phases | {"total", "other"}, phases | {"eval", "total", "other"}]
    for r in recs:  # the phases and the time in none of them make up the round
        assert sum(v for k, v in r["seconds"].items() if k != "total") == pytest.approx(r["seconds"]["total"])
    with ReplayBuffer(run_dir / "buffer", capacity=64) as buf:  # 8 rollouts a round, and the Critic's re-runs
        critic = [sum(e.round == r and e.variant == "critic" for e in buf.entries()) for r in (0, 1)]
    assert all(r["grpo"]["sequences"] >= 8 and r["evolve"] is not None for r in recs)
    assert [r["grpo"]["buffer_traces"] for r in recs] == [8 + critic[0], 8 + critic[1]]  # batches of distinct tasks
    assert recs[-1]["val"] is not None and recs[0]["val"] is None
    assert recs[1]["buffer"]["size"] == 16 + sum(critic) and recs[1]["model_version"] == 1
    lineage = [json.loads(line) for line in (run_dir / "lineage.jsonl").read_text().splitlines()]
    assert lineage[0]["how"] == "start" and (run_dir / "lineage" / f"{lineage[0]['id']}.yaml").is_file()
    for name in ("summary.md", "pass_rate.png", "lineage.png", "task_matrix.png", "time_breakdown.png"):
        assert (run_dir / "report" / name).stat().st_size > 0
    start = tiny_model(tiny_tokenizer(), seed=0).state_dict()
    trained = weights(run_dir)
    moved = [k for k in trained if not torch.equal(trained[k], start[k])]
    assert len(moved) == len(trained)  # every parameter took the two GRPO steps
    with ReplayBuffer(run_dir / "buffer", capacity=64) as buf:
        assert {e.round for e in buf.entries()} == {0, 1}
        assert all(t.behaviour_logprobs for t in buf.load(buf.entries()))


@pytest.mark.parametrize("mode", ["static", "harness_only", "model_only"])
def test_ablation_modes_switch_the_halves_off(tmp_path, mode):
    coevo.run(smoke(tmp_path / mode, f"mode={mode}", "rounds=1"))
    (rec,) = records(tmp_path / mode)
    assert (rec["evolve"] is not None) == (mode == "harness_only")
    assert (rec["grpo"] is not None) == (mode == "model_only")
    assert (tmp_path / mode / "buffer").exists() == (mode == "model_only")


def test_evolution_patience_ends_the_harness_search_and_the_weights_keep_training(tmp_path):
    """``evolution.patience=1``: after a round that ships no edit the search stops for the rest of the
    run (no proposal is judged again, each later record says why) while GRPO steps go on."""
    common = ("rounds=3", "val_limit=2", "evolution=stat")  # the stat gate judges a proposal every round here
    recs = records(Path(coevo.run(smoke(tmp_path / "run", *common, "evolution.patience=1"))))
    stops = [r["evolve"]["stopped"] for r in recs]
    assert "rounds" in stops, stops
    first = stops.index("rounds")
    assert not recs[first]["evolve"]["shipped"] and first < len(recs) - 1
    for r in recs[first + 1:]:
        assert r["evolve"]["verdicts"] == [] and r["evolve"]["stopped"] == "rounds"
        assert r["grpo"]["loss"] is not None  # the weights still train
    unlimited = records(Path(coevo.run(smoke(tmp_path / "free", *common))))
    assert all(r["evolve"]["stopped"] is None for r in unlimited)
    assert any(r["evolve"]["verdicts"] for r in unlimited[first + 1:])  # without patience the search went on


def test_a_changed_config_does_not_resume_into_an_existing_run(tmp_path):
    coevo.run(smoke(tmp_path / "run", "rounds=1"))
    with pytest.raises(ValueError, match="different config"):
        coevo.run(smoke(tmp_path / "run", "rounds=1", "trainer.lr=2e-3"))
    coevo.run(smoke(tmp_path / "run", "rounds=2"))  # more rounds: resumes and extends
    assert [r["round"] for r in records(tmp_path / "run")] == [0, 1]


def test_a_run_recorded_with_fields_removed_since_is_read_and_reported_but_not_resumed(tmp_path):
    """A run directory written before fields were removed from the schema: its config.yaml still
    loads (the removed fields ignored) and ``coevo report`` reads it; resuming it is refused with one
    line naming those fields, since what they set may not be what this version hard-codes."""
    import yaml
    from typer.testing import CliRunner

    from coevo.cli.main import app
    from coevo.config.schema import load_run_config

    coevo.run(smoke(tmp_path / "run", "rounds=1"))
    path = tmp_path / "run" / "config.yaml"
    saved = yaml.safe_load(path.read_text())
    saved["trainer"]["pack_calls"] = True  # as the version before recorded it
    saved["evolution"]["stat_alpha"] = 0.1
    path.write_text(yaml.safe_dump(saved, sort_keys=False))
    with pytest.raises(ValueError, match=r"^\S+ holds a run recorded by an earlier coevo whose config sets fields "
                                         r"this version no longer has \(evolution\.stat_alpha, trainer\.pack_calls\); "
                                         r"it cannot be resumed"):
        coevo.run(smoke(tmp_path / "run", "rounds=2"))
    assert [r["round"] for r in records(tmp_path / "run")] == [0]
    assert load_run_config(tmp_path / "run") == smoke(tmp_path / "run", "rounds=1")
    result = CliRunner().invoke(app, ["report", str(tmp_path / "run"), "--out", str(tmp_path / "report")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "report" / "summary.md").is_file()


ROUNDS = 6


def _committed(run_dir: Path) -> int:
    """Rounds committed so far (the checkpoint pointer names the last one)."""
    pointer = run_dir / "checkpoint" / "latest"
    return int(pointer.read_text().split("-")[1]) + 1 if pointer.is_file() else 0


def _launch(run_dir: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(ROOT / "train.py"), "experiment=smoke", f"rounds={ROUNDS}", f"hydra.run.dir={run_dir}"]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _comparable_traces(run_dir: Path) -> list[tuple]:
    with ReplayBuffer(run_dir / "buffer", capacity=64) as buf:
        return [(t.trace_id, t.harness_id, t.model_version, tuple(c.completion_ids for c in t.model_calls), t.reward,
                 t.passed, tuple(tuple(round(x, 5) for x in row) for row in t.behaviour_logprobs))
                for t in buf.load(buf.entries())]


def _stable(value):
    """A record without its wall-clock and memory fields (everything else must be reproduced exactly), and the
    sampler/trainer mismatch at the 5 decimals the log-probs it is made of are compared at (a
    round re-run after a kill recomputes them in a fresh process: ~1e-7 apart)."""
    if isinstance(value, dict):
        return {k: round(v, 5) if k.startswith("sampler_mismatch") and v is not None else _stable(v)
                for k, v in value.items() if k not in ("seconds", "tokens_per_s", "generation_seconds", "peak_rss_mb")}
    if isinstance(value, list):
        return [_stable(v) for v in value]
    return value


@pytest.mark.slow
def test_killed_at_random_moments_the_run_resumes_to_the_uninterrupted_result(tmp_path):
    straight = tmp_path / "straight"
    proc = _launch(straight)
    assert proc.wait(timeout=600) == 0, proc.stderr.read().decode()[-3000:]

    # kill once a given number of rounds is committed, after a random extra delay, so the kills
    # land in different phases of the following round (rollout, buffer, AEGIS, GRPO, commit)
    killed, rng, kills = tmp_path / "killed", random.Random(7), []
    for target in (1, 2, 4):
        proc = _launch(killed)
        while proc.poll() is None and _committed(killed) < target:
            time.sleep(0.05)
        time.sleep(rng.uniform(0.0, 0.6))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            kills.append(_committed(killed))
    proc = _launch(killed)
    assert proc.wait(timeout=600) == 0, proc.stderr.read().decode()[-3000:]
    assert len(kills) == 3 and 0 < kills[0] < ROUNDS, kills
    assert [r["round"] for r in records(killed)] == list(range(ROUNDS))
    assert _comparable_traces(killed) == _comparable_traces(straight)
    assert (killed / "lineage.jsonl").read_text() == (straight / "lineage.jsonl").read_text()
    assert [_stable(r) for r in records(killed)] == [_stable(r) for r in records(straight)]
    a, b = weights(killed), weights(straight)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.allclose(a[k], b[k], atol=1e-6), (k, float((a[k] - b[k]).abs().max()))


def _train_py(args: list[str], cwd: Path, launcher: list[str] | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "WANDB_SILENT": "true"}
    cmd = [*(launcher or [sys.executable]), str(ROOT / "train.py"), *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=900, check=False)


@pytest.mark.slow
def test_a_hydra_sweep_gives_one_run_directory_per_override(tmp_path):
    out = _train_py(["-m", "experiment=smoke", "rounds=1", "trainer.lr=1e-3,2e-3",
                     f"hydra.sweep.dir={tmp_path / 'sweep'}"], cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    runs = sorted(p.parent for p in (tmp_path / "sweep").glob("*/rounds.jsonl"))
    assert [p.name for p in runs] == ["experiment=smoke,rounds=1,trainer.lr=0.001",
                                      "experiment=smoke,rounds=1,trainer.lr=0.002"]
    lrs = [records(p)[0]["grpo"]["lr"] for p in runs]
    assert lrs == [1e-3, 2e-3]


@pytest.mark.slow
def test_two_processes_under_accelerate_write_one_run_directory(tmp_path):
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                "--main_process_port", "29533"]
    out = _train_py(["experiment=smoke", f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, launcher=launcher)
    assert out.returncode == 0, out.stderr[-3000:]
    assert [p.name for p in tmp_path.iterdir()] == ["run"]  # no second directory, no outputs/ from rank 1
    assert [r["round"] for r in records(tmp_path / "run")] == [0, 1]
    grpo = records(tmp_path / "run")[-1]["grpo"]  # the round's 8 rollouts and the Critic's re-runs, on both ranks
    assert grpo["buffer_traces"] == 8 + grpo["critic_traces"]
    assert grpo["sequences"] >= 8  # the whole step, not a rank's half
    assert len(list((tmp_path / "run").glob(".hydra/config.yaml"))) == 1


@pytest.mark.slow
def test_a_sharded_run_rolls_out_the_trained_weights_and_resumes(tmp_path):
    """trainer.sharding=fsdp2 on two gloo ranks: rank 0 generates from a whole copy refreshed after
    every round's steps, so each round's first step is on-policy (its behaviour log-probs came from
    that copy: a stale one would put the ratio off 1 by the last round's update); the run resumes
    from its gathered checkpoint into a fresh sharded model."""
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                "--main_process_port", "29535"]
    common = ["experiment=smoke", "trainer.sharding=fsdp2", "trainer.lr=1e-2", f"hydra.run.dir={tmp_path / 'run'}"]
    out = _train_py([*common, "rounds=2"], cwd=tmp_path, launcher=launcher)
    assert out.returncode == 0, out.stderr[-3000:]
    out = _train_py([*common, "rounds=3"], cwd=tmp_path, launcher=launcher)
    assert out.returncode == 0, out.stderr[-3000:]
    rounds = records(tmp_path / "run")
    assert [r["round"] for r in rounds] == [0, 1, 2]
    for r in rounds:
        first = r["grpo"]["steps"][0]
        assert first["sequences"] > 0 and abs(first["ratio_min"] - 1) < 1e-4 and abs(first["ratio_max"] - 1) < 1e-4, r


@pytest.mark.slow
def test_wandb_offline_run_resumes_the_same_wandb_run(tmp_path):
    env_dirs = [f"hydra.run.dir={tmp_path / 'run'}", "logger=wandb", "logger.mode=offline", "experiment=smoke"]
    first = _train_py([*env_dirs, "rounds=1"], cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    run_id = (tmp_path / "run" / "wandb_id").read_text().strip()
    second = _train_py([*env_dirs, "rounds=2"], cwd=tmp_path)
    assert second.returncode == 0, second.stderr[-3000:]
    assert (tmp_path / "run" / "wandb_id").read_text().strip() == run_id
    offline = sorted((tmp_path / "run" / "wandb").glob(f"offline-run-*-{run_id}"))
    assert len(offline) == 2 and all(any(d.glob("*.wandb")) for d in offline)


def test_epoch_end_selects_snapshots_on_validation(tmp_path, monkeypatch):
    from coevo.evolution.engine import AEGIS

    calls, original = [], AEGIS.select

    def spy(self, evaluate, *, round):
        calls.append((round, evaluate(self.harness("base"))))
        return original(self, evaluate, round=round)

    monkeypatch.setattr(AEGIS, "select", spy)
    # 19 train tasks in batches of 9: two batches per epoch, so round 1 ends the first epoch
    coevo.run(smoke(tmp_path / "run", "batch_tasks=9", "rounds=3", "buffer.capacity=64"))
    assert len(calls) == 1 and calls[0][0] == 1 and 0.0 <= calls[0][1] <= 1.0
