"""Sweeps on a scheduler: ``train.py -m hydra/launcher=submitit_local`` runs each override set as a
submitit job (a process of its own) in its own run directory; the same sweep started again resumes
each job's run there; a job whose directory another live process holds stops naming it.
``submitit_slurm`` is the same launcher with SLURM's executor (docs/gpu-cluster.md)."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
JOBS = ["experiment=smoke,seed=0,val_limit=2", "experiment=smoke,seed=1,val_limit=2"]


def sweep(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    """The 2-job smoke sweep through train.py; ``rounds`` stays out of the directory names so that a
    later sweep with more rounds finds the same directories."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(ROOT / "train.py"), "-m", "hydra/launcher=submitit_local", "experiment=smoke",
           "val_limit=2", *overrides, f"hydra.sweep.dir={tmp_path / 'sweep'}",
           "hydra.job.config.override_dirname.exclude_keys=[name,rounds]"]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900, check=False)


def rounds(run_dir: Path) -> list[str]:
    return (run_dir / "rounds.jsonl").read_text().splitlines()


@pytest.mark.slow
def test_a_submitit_local_sweep_runs_each_job_in_its_own_resumable_run_directory(tmp_path):
    first = sweep(tmp_path, "rounds=1", "seed=0,1")
    assert first.returncode == 0, first.stderr[-3000:]
    root = tmp_path / "sweep"
    assert sorted(p.name for p in root.iterdir() if not p.name.startswith(".") and p.is_dir()) == JOBS
    jobs = sorted((root / ".submitit").glob("*/*_result.pkl"))
    assert len(jobs) == 2  # each override set ran as a submitit job of its own
    pids = set()
    for seed, name in enumerate(JOBS):
        run = root / name
        assert [json.loads(line)["round"] for line in rounds(run)] == [0]
        config = yaml.safe_load((run / "config.yaml").read_text())  # its own config, resolved by the job
        assert (config["seed"], config["run_dir"]) == (seed, str(run))
        assert yaml.safe_load((run / ".hydra" / "config.yaml").read_text())["seed"] == seed
        pids.add((run / ".run.lock").read_text())  # the lock's holder: the job's process
    assert len(pids) == 2
    done = {name: rounds(root / name) for name in JOBS}

    again = sweep(tmp_path, "rounds=2", "seed=0,1")  # the same jobs, two rounds: each resumes its run
    assert again.returncode == 0, again.stderr[-3000:]
    assert sorted(p.name for p in root.iterdir() if not p.name.startswith(".") and p.is_dir()) == JOBS
    for name in JOBS:
        rows = [json.loads(line) for line in rounds(root / name)]
        assert [r["round"] for r in rows] == [0, 1]
        before = json.loads(done[name][0])  # round 0 was not run again: its measured times are the first run's
        assert rows[0]["generation_seconds"] == before["generation_seconds"]
        assert rows[0]["seconds"]["rollout"] == before["seconds"]["rollout"]
        assert f"resumed {root / name} after round 0" in (root / name / "train.log").read_text()

    held = root / JOBS[0] / ".run.lock"  # another live process holds seed 0's directory
    fd = os.open(held, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        busy = sweep(tmp_path, "rounds=2", "seed=0")
    finally:
        os.close(fd)
    assert busy.returncode != 0
    assert "is in use by another run" in busy.stdout + busy.stderr
    assert len(rounds(root / JOBS[0])) == 2
