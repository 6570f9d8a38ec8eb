"""Every CLI command's outputs go through the run directory's redaction: keys planted in
the environment and quoted by every task text never reach a byte of what ``coevo eval``, ``coevo
stream`` and ``coevo evolve`` write, token ids included. The run directory itself is covered by
``tests/test_secrets.py``; these commands write files of their own beside (or instead of) it."""

from __future__ import annotations

import dataclasses
import os
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from coevo.cli.main import app
from coevo.envs.arithmetic import calculator_solver
from coevo.safety.secrets import REDACTED
from tests.streams.toolbox import ToolboxEnv, solve
from tests.test_secrets import TASK_KEYS, KeyedArithmetic

runner = CliRunner()


CONSUMED = "PGPASSWORD"
"""The variable the envs below unset once read, as a client library that consumes its credential
does: a command must remember the values it started with (``coevo.safety.secrets.start_redaction``)."""


class ScriptedKeyedArithmetic(KeyedArithmetic):
    """``KeyedArithmetic`` (every task text quotes the keys) with the arithmetic env's scripted solver,
    so ``--model scripted`` runs it by import path."""

    scripted_solver = staticmethod(calculator_solver)

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)
        os.environ.pop(CONSUMED)


class KeyedToolbox(ToolboxEnv):
    """The stream tests' toolbox env (three tool capabilities) whose every task text quotes the keys."""

    scripted_solver = staticmethod(solve)

    def __init__(self) -> None:
        super().__init__()
        quoted = ", ".join(f"{name}={os.environ[name]}" for name in TASK_KEYS)
        self._tasks = [dataclasses.replace(t, instruction=f"{t.instruction} (service: {quoted})") for t in self._tasks]
        os.environ.pop(CONSUMED)


@pytest.fixture
def keys(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """A fresh value for each of ``TASK_KEYS`` in the environment, and no value remembered by an earlier test."""
    import coevo.safety.secrets

    monkeypatch.setattr(coevo.safety.secrets, "_REMEMBERED", set())
    planted = {"OPENAI_API_KEY": f"sk-proj-{uuid.uuid4().hex}", "SERVICE_KEY": f"svc-{uuid.uuid4().hex[:16]}",
               "PGPASSWORD": f"pg-{uuid.uuid4().hex[:20]}"}
    for name, value in planted.items():
        monkeypatch.setenv(name, value)
    return planted


def leaks(root: Path, keys: dict[str, str]) -> list[str]:
    """Every (file, key name) under ``root`` whose bytes hold a key."""
    files = [p for p in root.rglob("*") if p.is_file()]
    assert files
    return [f"{p.relative_to(root)} ({name})" for p in files for name, key in keys.items()
            if key.encode() in p.read_bytes()]


def redacted_somewhere(root: Path) -> bool:
    return any(REDACTED.encode() in p.read_bytes() for p in root.rglob("*") if p.is_file())


@pytest.mark.parametrize("model", ["scripted", "tiny"])
def test_coevo_eval_writes_no_key(tmp_path: Path, keys: dict[str, str], model: str) -> None:
    """traces.jsonl (strings and, with the tiny model, prompt ids that decoded to the keys), report.md,
    summary.json and harness.yaml."""
    out = tmp_path / "eval"
    budget = ["--max-new-tokens", "8"] if model == "tiny" else []
    result = runner.invoke(app, ["eval", "--env", "tests.test_cli_secrets:ScriptedKeyedArithmetic", "--model", model,
                                 "--split", "val", "--limit", "2", *budget, "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert (out / "traces.jsonl").is_file() and redacted_somewhere(out)
    assert not leaks(out, keys), leaks(out, keys)
    assert not any(key in result.output for key in keys.values())
    if model == "tiny":
        import json

        from coevo.policy.tiny import tiny_tokenizer

        tok = tiny_tokenizer()
        calls = [c for line in (out / "traces.jsonl").read_text().splitlines() for c in json.loads(line)["model_calls"]]
        texts = [tok.decode(c["prompt_ids"], skip_special_tokens=False) for c in calls]
        assert calls and all(f"PGPASSWORD={REDACTED}" in t for t in texts)  # re-encoded, not dropped
        assert not [t for t in texts if any(key in t for key in keys.values())]


def test_coevo_stream_writes_no_key(tmp_path: Path, keys: dict[str, str]) -> None:
    """stream.json, metrics, matrices, outcomes, evolve.jsonl, harnesses/, references/ and each stage's
    self-evolving run directory."""
    out = tmp_path / "stream"
    result = runner.invoke(app, ["stream", "--env", "tests.test_cli_secrets:KeyedToolbox", "--model", "scripted",
                                 "--stages", "2", "--adapt-limit", "2", "--eval-limit", "2", "--max-steps", "4",
                                 "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert (out / "metrics.json").is_file() and list((out / "self_evolving").rglob("rounds.jsonl"))
    assert not leaks(out, keys), leaks(out, keys)
    assert not any(key in result.output for key in keys.values())


def test_coevo_evolve_writes_no_key(tmp_path: Path, keys: dict[str, str]) -> None:
    """The train.py run directory plus summary.json and summary.md."""
    out = tmp_path / "evolve"
    result = runner.invoke(app, ["evolve", "--env", "tests.test_cli_secrets:ScriptedKeyedArithmetic", "--model",
                                 "scripted", "--rounds", "1", "--batch-tasks", "2", "--val-limit", "2",
                                 "--test-limit", "0", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert (out / "summary.json").is_file() and (out / "rounds.jsonl").is_file() and redacted_somewhere(out)
    assert not leaks(out, keys), leaks(out, keys)
    assert not any(key in result.output for key in keys.values())
