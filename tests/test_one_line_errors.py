"""An error the user can fix is one line at the entry points, with no stack trace: ``train.py`` and
the ``coevo`` command print ``error: <message>`` on stderr and exit 2 for a usage error (a bad
value, a missing dependency, a file that cannot be read, an unknown option), 1 for a run directory
that cannot be used as it is. ``HYDRA_FULL_ERROR=1`` / ``coevo --debug`` bring the trace back."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from coevo.cli.main import main as coevo_main

ROOT = Path(__file__).resolve().parents[1]


def train(tmp_path: Path, *overrides: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python train.py experiment=smoke`` with ``overrides``, its run directory under ``tmp_path``."""
    cmd = [sys.executable, str(ROOT / "train.py"), "experiment=smoke", f"run_dir={tmp_path / 'run'}",
           f"hydra.run.dir={tmp_path / 'run'}", *overrides]
    environ = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"} | (env or {})
    return subprocess.run(cmd, cwd=tmp_path, env=environ, capture_output=True, text=True, timeout=300)


def test_a_bad_config_value_is_one_line_naming_the_field_and_exit_2(tmp_path):
    out = train(tmp_path, "trainer.lr=1e30")
    assert out.returncode == 2
    assert out.stderr.splitlines()[0] == (
        "error: config trainer.lr=1e+30 is not allowed; it must be in (0, 0.01] for adamw: fine-tuning rates are "
        "1e-7..1e-3, and larger steps destroy the weights")
    assert "Traceback" not in out.stdout + out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_an_env_whose_module_lacks_a_dependency_is_one_line_naming_the_package(tmp_path):
    (tmp_path / "needs_pkg_env.py").write_text("import coevo_test_package_that_is_not_installed\n\nclass Env: ...\n")
    out = train(tmp_path, "~env", "env.name=needs_pkg_env:Env", env={"PYTHONPATH": str(tmp_path)})
    assert out.returncode == 2
    first = out.stderr.splitlines()[0]
    assert first.startswith("error: config env.name='needs_pkg_env:Env': env 'needs_pkg_env:Env' needs module "
                            "'coevo_test_package_that_is_not_installed', which is not installed")
    assert first.endswith("install that package, or fix the import in 'needs_pkg_env'")
    assert "Traceback" not in out.stdout + out.stderr


def test_hydra_full_error_shows_the_stack_trace(tmp_path):
    out = train(tmp_path, "trainer.lr=1e30", env={"HYDRA_FULL_ERROR": "1"})
    assert out.returncode != 0
    assert "Traceback" in out.stderr and "UsageError: config trainer.lr=1e+30 is not allowed" in out.stderr


def run_cli(capsys, *argv: str) -> tuple[int, str]:
    with pytest.raises(SystemExit) as stopped:
        coevo_main(list(argv))
    return stopped.value.code, capsys.readouterr().err


def test_the_cli_prints_an_unreadable_run_directory_as_one_line_and_exit_2(capsys, tmp_path):
    code, err = run_cli(capsys, "report", str(tmp_path / "missing"))
    assert code == 2
    assert err.splitlines() == [f"error: Invalid value for RUN_DIR: run directory '{tmp_path / 'missing'}' does "
                                "not exist (see coevo report --help)"]


def test_the_cli_prints_an_unknown_option_and_a_bad_choice_as_one_line(capsys):
    code, err = run_cli(capsys, "eval", "--no-such-option")
    assert code == 2 and err.splitlines()[0].startswith("error: No such option: --no-such-option")
    assert len(err.splitlines()) == 1
    code, err = run_cli(capsys, "eval", "--env", "nope")
    assert code == 2
    assert err.splitlines() == ["error: Invalid value for --env: unknown env 'nope'; use a built-in env ['arithmetic', "
                                "'office', 'openenv', 'program', 'reasoning', 'skyrl_gym', 'textworld_express', "
                                "'verifiers'] or an import path 'package.module:ClassName' (see coevo eval --help)"]


def test_the_cli_debug_flag_raises_instead(capsys, tmp_path, monkeypatch):
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    with pytest.raises(Exception, match="does not exist"):
        coevo_main(["--debug", "report", str(tmp_path / "missing")])
    os.environ.pop("HYDRA_FULL_ERROR", None)  # --debug set it for the process


def test_a_run_directory_with_a_malformed_record_is_one_line_naming_the_file_line_and_field(capsys, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "rounds.jsonl").write_text("{}\n")
    code, err = run_cli(capsys, "report", str(run_dir))
    assert code == 1  # the command was right, the run directory is damaged: no "(see --help)"
    assert err.splitlines() == [f"error: {run_dir / 'rounds.jsonl'}:1: required field 'round' is missing "
                                "(and 12 more)"]


def test_a_run_directory_that_cannot_be_created_is_one_line_and_exit_1(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    out = train(tmp_path, f"run_dir={blocker / 'run'}", f"hydra.run.dir={blocker / 'run'}")
    assert out.returncode == 1
    first = out.stderr.splitlines()[0]
    assert first.startswith(f"error: run directory {blocker / 'run'} cannot be used: Not a directory")
    assert first.endswith("choose another name= / run_dir=, or fix its permissions")
    assert "Traceback" not in out.stdout + out.stderr
