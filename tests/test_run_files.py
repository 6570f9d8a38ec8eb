"""Files and runs: a run directory is locked before anything is written, in every mode;
traces a checkpoint counts must be in the buffer; damaged checkpoint and harness files give errors
that name the file."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

import coevo
from coevo.buffers.segments import read_header
from coevo.harness.harness import Harness
from coevo.rundir.checkpoint import CheckpointError
from coevo.rundir.lock import LOCK_NAME, RunDirInUseError, lock_run_dir, unlock_run_dir
from tests.test_loop import ROOT, _train_py, smoke


def hold(run_dir: Path) -> subprocess.Popen:
    """Another live process that holds ``run_dir`` (returned once it has the lock)."""
    holder = subprocess.Popen(
        [sys.executable, "-c", f"from coevo.rundir.lock import lock_run_dir; lock_run_dir({str(run_dir)!r}); "
                               "print('held', flush=True); import time; time.sleep(120)"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline() == "held\n"
    return holder


@pytest.fixture
def held(tmp_path):
    """A directory another live process holds; yields (directory, holder pid)."""
    run_dir = tmp_path / "run"
    holder = hold(run_dir)
    yield run_dir, holder.pid
    holder.kill()
    holder.wait()


@pytest.mark.parametrize("mode", ["coevolve", "harness_only", "model_only", "static"])
def test_a_held_run_directory_refuses_a_second_run_before_anything_is_written(held, mode):
    run_dir, pid = held
    out = _train_py(["experiment=smoke", f"mode={mode}", f"hydra.run.dir={run_dir}"], cwd=run_dir.parent)
    assert out.returncode == 1
    assert f"run directory {run_dir} is in use by another run (pid {pid})" in out.stderr
    assert sorted(p.name for p in run_dir.iterdir()) == [LOCK_NAME]  # no .hydra/, config.yaml, references/


def test_coevo_run_locks_too(held):
    run_dir, pid = held
    with pytest.raises(RunDirInUseError, match=f"pid {pid}"):
        coevo.run(smoke(run_dir, "mode=static"))
    assert sorted(p.name for p in run_dir.iterdir()) == [LOCK_NAME]


def test_the_lock_dies_with_its_holder_and_is_reentrant_in_one_process(tmp_path):
    run_dir = tmp_path / "run"
    holder = hold(run_dir)
    with pytest.raises(RunDirInUseError):
        lock_run_dir(run_dir)
    holder.kill()  # kill -9: the kernel drops the flock
    holder.wait()
    time.sleep(0.05)
    assert lock_run_dir(run_dir) == lock_run_dir(run_dir) == run_dir.resolve() / LOCK_NAME
    unlock_run_dir(run_dir)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished two-round smoke coevolution run (copied by each test that damages it)."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    coevo.run(smoke(run_dir))
    return run_dir


def copy_of(finished: Path, tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    shutil.copytree(finished, run_dir)
    (run_dir / LOCK_NAME).unlink(missing_ok=True)
    config = run_dir / "config.yaml"  # the copy lives elsewhere: only its run_dir differs
    config.write_text(config.read_text().replace(str(finished), str(run_dir)))
    return run_dir


def newest_segment(run_dir: Path) -> Path:
    return sorted((run_dir / "buffer").glob("*.seg"))[-1]


def test_a_deleted_newest_segment_the_checkpoint_counts_stops_the_resume(finished, tmp_path):
    run_dir = copy_of(finished, tmp_path)
    newest = read_header(newest_segment(run_dir))  # 8 and 16 alone; more where the Critic's re-runs were buffered
    newest_segment(run_dir).unlink()
    with pytest.raises(CheckpointError, match=rf"replay buffer .*buffer holds {newest.first_seq} traces .* the "
                                              rf"checkpoint of round 1 counts {newest.next_seq} \(the newest segment "
                                              r"files are missing\); restore the missing segment files, or") as info:
        coevo.run(smoke(run_dir))
    assert ".corrupt" not in str(info.value)  # none exists to rename back


def test_a_damaged_newest_segment_the_checkpoint_counts_stops_the_resume(finished, tmp_path):
    run_dir = copy_of(finished, tmp_path)
    segment = newest_segment(run_dir)
    segment.write_bytes(segment.read_bytes()[:-10])  # a copy that lost its tail
    with pytest.warns(UserWarning, match="set aside damaged newest segment"), \
            pytest.raises(CheckpointError,
                          match=rf"\(damaged: [^)]*{segment.name}: \d+ bytes where the header promises \d+\)"):
        coevo.run(smoke(run_dir))
    with pytest.raises(CheckpointError, match=rf"set aside as damaged: {segment.name}.corrupt"):
        coevo.run(smoke(run_dir))  # started again: the file an earlier opening set aside is named


@pytest.mark.parametrize("damage", ["truncated", "binary", "empty", "non_integer_round"])
def test_a_damaged_state_json_names_the_file(finished, tmp_path, damage):
    run_dir = copy_of(finished, tmp_path)
    state = next((run_dir / "checkpoint").glob("round-*")) / "state.json"
    text = state.read_bytes()
    state.write_bytes({"truncated": text[:100], "binary": b"\x00\xff\xfe" * 10, "empty": b"",
                       "non_integer_round": json.dumps({**json.loads(text), "next_round": "2"}).encode()}[damage])
    with pytest.raises(CheckpointError, match=rf"{state} is damaged.*the run cannot resume from it"):
        coevo.run(smoke(run_dir))


def test_missing_checkpoint_weights_name_the_directory(finished, tmp_path):
    run_dir = copy_of(finished, tmp_path)
    trainer = next((run_dir / "checkpoint").glob("round-*")) / "trainer"
    for weights in (trainer / "model").glob("*.safetensors"):
        weights.unlink()
    with pytest.raises(CheckpointError, match=rf"{trainer}/model/\S+\.safetensors is missing from the checkpoint"):
        coevo.run(smoke(run_dir))


def weights_file(run_dir: Path) -> Path:
    return next(next((run_dir / "checkpoint").glob("round-*")).glob("trainer/model/*.safetensors"))


@pytest.mark.parametrize("damage", ["garbled", "truncated"])
def test_damaged_checkpoint_weights_stop_the_resume_naming_the_file(finished, tmp_path, damage):
    run_dir = copy_of(finished, tmp_path)
    weights = weights_file(run_dir)
    data = bytearray(weights.read_bytes())
    if damage == "garbled":  # 64 bytes of tensor data (past the safetensors header): loads, then trains on NaN
        middle = len(data) // 2
        data[middle : middle + 64] = b"\xff" * 64
    else:
        del data[len(data) // 2 :]
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=rf"{weights} is damaged: \d+ bytes whose SHA-256 differs from the one "
                                              r"recorded when round-0001 was committed; the run cannot resume"):
        coevo.run(smoke(run_dir))


def test_non_finite_weights_are_refused_where_no_hash_was_recorded(finished, tmp_path):
    from safetensors.torch import load_file, save_file

    run_dir = copy_of(finished, tmp_path)
    weights = weights_file(run_dir)
    tensors = load_file(weights)
    name = sorted(tensors)[0]
    tensors[name][0] = float("nan")
    save_file(tensors, weights, metadata={"format": "pt"})
    state = weights.parents[2] / "state.json"  # a checkpoint written before hashes were recorded
    state.write_text(json.dumps({k: v for k, v in json.loads(state.read_text()).items() if k != "files"}))
    with pytest.raises(CheckpointError, match=rf"cannot be loaded \(ValueError: {weights}: tensor '{name}' holds NaN "
                                              r"or infinite values\)"):
        coevo.run(smoke(run_dir))


@pytest.mark.parametrize("content,words", [
    (b"name: h\nprocessors:\n  - kind: system_prompt\n    params: {template: 'unterminated", "truncated or not YAML"),
    (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe", "not UTF-8 text"),
    (b"- just\n- a list\n", "a harness spec is a mapping"),
])
def test_a_damaged_harness_yaml_names_the_file(tmp_path, content, words):
    path = tmp_path / "harness.yaml"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=rf"{path}.*{words}"):
        Harness.load(path)
    with pytest.raises(ValueError, match=rf"config harness.start='{path}'.*{words}"):
        coevo.run(smoke(tmp_path / "run", f"harness.start={path}"))


def snapshot(directory: Path) -> dict[str, bytes]:
    """Every file under ``directory`` (name -> bytes): what an export must leave as it was."""
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def garble_payload(segment: Path) -> None:
    """Flip bytes inside the last payload of ``segment``: header, length and name stay intact."""
    data = bytearray(segment.read_bytes())
    for i in range(len(data) - 40, len(data) - 20):
        data[i] ^= 0xFF
    segment.write_bytes(bytes(data))


def test_a_garbled_payload_stops_resume_and_export_naming_the_segment(finished, tmp_path):
    from coevo.cli.main import app
    from coevo.report.export import export

    run_dir = copy_of(finished, tmp_path)
    segment = sorted((run_dir / "buffer").glob("*.seg"))[0]  # the older one: its header check passes
    garble_payload(segment)
    message = (rf"replay buffer {run_dir / 'buffer'}: 1 stored trace\(s\) fail their CRC \({segment}: "
               r".*restore the segment")
    with pytest.raises(CheckpointError, match=message):
        coevo.run(smoke(run_dir))
    with pytest.raises(CheckpointError, match=message):
        export(run_dir, tmp_path / "out.jsonl", "sft")
    out = CliRunner().invoke(app, ["export", str(run_dir), "--out", str(tmp_path / "out.jsonl")])
    assert out.exit_code == 1 and "error: replay buffer" in out.output and "fail their CRC" in out.output, out.output
    assert not (tmp_path / "out.jsonl").exists()


def test_the_report_is_written_and_names_what_else_is_damaged(finished, tmp_path):
    """``coevo report`` draws the records it can read, then names damaged checkpoint weights and a
    buffer payload that fails its CRC, one line each, and exits 1."""
    from coevo.cli.main import app

    run_dir = copy_of(finished, tmp_path)
    assert CliRunner().invoke(app, ["report", str(run_dir)]).exit_code == 0  # intact: nothing to say
    weights = next(p for p in (run_dir / "checkpoint").rglob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:-4] + b"\0\0\0\0")
    garble_payload(sorted((run_dir / "buffer").glob("*.seg"))[0])
    out = CliRunner().invoke(app, ["report", str(run_dir)])
    errors = [line for line in out.output.splitlines() if line.startswith("error:")]
    assert out.exit_code == 1 and (run_dir / "report" / "summary.md").is_file(), out.output
    assert len(errors) == 2 and weights.name in errors[0] and "fail their CRC" in errors[1], out.output
    assert "--help" not in out.output


def test_a_deleted_newest_segment_stops_the_export_unless_partial(finished, tmp_path):
    from coevo.report.export import export

    run_dir = copy_of(finished, tmp_path)
    newest = read_header(newest_segment(run_dir))
    newest_segment(run_dir).unlink()
    have, counted = newest.first_seq, newest.next_seq
    counts = rf"holds {have} traces \(by sequence number\), but the checkpoint of round 1 counts {counted}"
    with pytest.raises(CheckpointError, match=counts):
        export(run_dir, tmp_path / "out.jsonl", "jsonl")
    with pytest.warns(UserWarning, match=counts):
        assert export(run_dir, tmp_path / "out.jsonl", "jsonl", partial=True) == have


def test_damaged_lineage_files_stop_resume_and_report_naming_the_file(finished, tmp_path):
    from coevo.cli.main import app
    from coevo.report.summary import write_report

    run_dir = copy_of(finished, tmp_path)
    files = sorted((run_dir / "lineage").glob("*.yaml"))
    assert files
    for path in files:
        path.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe")
    named = rf"{run_dir / 'lineage'}/\w+\.yaml is damaged \(.*not UTF-8 text.*\); restore the file"
    with pytest.raises(CheckpointError, match=named):
        coevo.run(smoke(run_dir))
    with pytest.raises(CheckpointError, match=named):
        write_report(run_dir)
    out = CliRunner().invoke(app, ["report", str(run_dir)])
    assert out.exit_code == 1 and "is damaged" in out.output, out.output


def test_a_lost_round_in_rounds_jsonl_stops_report_and_export_and_a_resume_rewrites_it(finished, tmp_path):
    from coevo.report.export import export
    from coevo.report.summary import write_report

    run_dir = copy_of(finished, tmp_path)
    rounds = run_dir / "rounds.jsonl"
    whole = rounds.read_text()
    rounds.write_text("".join(whole.splitlines(keepends=True)[:-1]))
    lost = (rf"{rounds} holds 1 rounds but the checkpoint round-0001 holds 2 \(missing: rounds \[1\]\); "
            r"start the run again")
    with pytest.raises(CheckpointError, match=lost):
        write_report(run_dir)
    with pytest.raises(CheckpointError, match=lost):
        export(run_dir, tmp_path / "out.jsonl", "sft")
    coevo.run(smoke(run_dir))  # the recovery the message names: the resume rewrites rounds.jsonl
    assert [json.loads(line)["round"] for line in rounds.read_text().splitlines()] == [0, 1]
    write_report(run_dir)


def test_export_never_changes_the_run_directory(finished, tmp_path):
    from coevo.report.export import export

    run_dir = copy_of(finished, tmp_path)
    segment = newest_segment(run_dir)
    intact = read_header(segment).first_seq
    segment.write_bytes(segment.read_bytes()[:-10])  # damaged: a writer would set it aside as .corrupt
    (run_dir / "buffer" / (segment.name + ".tmp")).write_bytes(b"an add that never committed")
    (run_dir / "buffer" / "LOCK").unlink()  # a copied run: no lock file (a reader must not create one)
    before = snapshot(run_dir)
    with pytest.warns(UserWarning, match=f"skipped damaged newest segment {segment.name} \\(left as it is\\)"), \
            pytest.warns(UserWarning, match=f"holds {intact} traces .* counts .*damaged: .*{segment.name}: .*promises"):
        written = export(run_dir, tmp_path / "out.jsonl", "jsonl", partial=True)
    assert written == intact  # the intact segments' traces
    with pytest.warns(UserWarning, match="skipped damaged newest segment"), \
            pytest.raises(CheckpointError, match=rf"\(damaged: [^)]*{segment.name}: \d+ bytes where the header"):
        export(run_dir, tmp_path / "whole.jsonl", "jsonl")  # without partial=True: refused, naming the damage
    assert snapshot(run_dir) == before


def test_export_waits_for_no_one_but_refuses_a_buffer_a_run_holds(finished, tmp_path):
    from coevo.buffers import ReplayBuffer
    from coevo.report.export import export

    run_dir = copy_of(finished, tmp_path)
    with ReplayBuffer(run_dir / "buffer", capacity=64):
        with pytest.raises(RuntimeError, match="already open in another process or object"):
            export(run_dir, tmp_path / "out.jsonl", "jsonl")
    assert export(run_dir, tmp_path / "out.jsonl", "sft") > 0
