"""One ``train.py`` round of a tiny model in a subprocess, with an env's overrides written as the docs
write them: what the tests of the ecosystem's envs share."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TINY_ROUND = ("model=tiny", "trainer=grpo", "rounds=1", "batch_tasks=2", "rollout.attempts=2",
              "rollout.keep_truncated=true", "rollout.max_steps=2")


def one_round(tmp_path: Path, *overrides: str, cwd: Path | None = None) -> dict[str, Any]:
    """The round's record of ``train.py TINY_ROUND overrides`` (its exit status checked), run in ``cwd``."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    args = [*TINY_ROUND, *overrides, f"hydra.run.dir={tmp_path / 'run'}"]
    out = subprocess.run([sys.executable, str(ROOT / "train.py"), *args], cwd=cwd or tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    (record,) = [json.loads(line) for line in (tmp_path / "run" / "rounds.jsonl").read_text().splitlines()]
    return record
