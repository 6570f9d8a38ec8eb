"""The command line: help lists the commands; harness show/diff/id; eval writes a summary."""

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from coevo.cli.main import app
from coevo.harness import Harness
from coevo.harness.defaults import base_harness
from coevo.harness.library import SlidingWindowMemory

runner = CliRunner()


def test_help_lists_commands():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("eval", "harness"):
        assert command in result.output
    sub = runner.invoke(app, ["harness", "--help"])
    for command in ("show", "diff", "id", "processors"):
        assert command in sub.output


def test_harness_show_diff_and_id(tmp_path):
    a = base_harness()
    b = a.insert(SlidingWindowMemory(keep_last=2)).set_param("step_budget", "max_steps", 4)
    pa, pb = a.save(tmp_path / "a.yaml"), b.save(tmp_path / "b.yaml")
    shown = runner.invoke(app, ["harness", "show", str(pb)], terminal_width=200)
    assert shown.exit_code == 0, shown.output
    assert b.id in shown.output and "memory" in shown.output and "sliding_window" in shown.output
    assert "before_model" in shown.output and "control_safety" in shown.output
    d = runner.invoke(app, ["harness", "diff", str(pa), str(pb)])
    assert d.exit_code == 0 and "added sliding_window" in d.output and "max_steps: 6 -> 4" in d.output
    assert runner.invoke(app, ["harness", "id", str(pa)]).output.strip() == a.id
    bad = runner.invoke(app, ["harness", "show", str(tmp_path / "missing.yaml")])
    assert bad.exit_code != 0 and "neither a built-in harness" in bad.output


def test_harness_diff_can_ignore_the_runs_sampling_settings(tmp_path):
    run = base_harness().set_param("sampling", "temperature", 0.7).set_param("sampling", "max_new_tokens", 512)
    run = run.set_param("step_budget", "max_steps", 4)  # what start_harness writes, plus one real edit
    path = run.save(tmp_path / "harness-evolved.yaml")
    plain = runner.invoke(app, ["harness", "diff", "base", str(path)])
    assert plain.exit_code == 0 and "sampling.temperature" in plain.output and "max_steps: 6 -> 4" in plain.output
    quiet = runner.invoke(app, ["harness", "diff", "--ignore-sampling", "base", str(path)])
    assert quiet.exit_code == 0, quiet.output
    assert "sampling." not in quiet.output and "max_steps: 6 -> 4" in quiet.output
    assert "parameters of sampling not compared" in quiet.output
    only_sampling = base_harness().set_param("sampling", "temperature", 0.7).save(tmp_path / "t.yaml")
    same = runner.invoke(app, ["harness", "diff", "--ignore-sampling", "base", str(only_sampling)])
    assert "(no differences)" in same.output
    assert "--ignore-sampling" in runner.invoke(app, ["harness", "diff", "--help"], terminal_width=200).output


def test_conversational_harness_differs_from_base_only_in_its_system_prompt():
    from coevo.harness.defaults import BUILTIN_HARNESSES
    from coevo.harness.diff import diff

    conversational = BUILTIN_HARNESSES["conversational"]()
    (change,) = diff(base_harness(), conversational)
    assert (change.kind, change.processor, change.param) == ("prompt", "system_prompt", "template")
    assert "plain text" in change.new and "<answer>" in change.new
    shown = runner.invoke(app, ["harness", "show", "conversational"], terminal_width=200)
    assert shown.exit_code == 0 and conversational.id in shown.output and "conversational" in shown.output
    d = runner.invoke(app, ["harness", "diff", "base", "conversational"])
    assert d.exit_code == 0 and "prompt system_prompt.template" in d.output


def test_processors_listing():
    out = runner.invoke(app, ["harness", "processors"], terminal_width=250).output
    for kind in ("system_prompt", "sliding_window", "python_executor", "code"):
        assert kind in out


def test_eval_writes_summary(tmp_path):
    args = ["eval", "--env", "arithmetic", "--model", "scripted", "--split", "test", "--env-arg", "n_tasks=40"]
    result = runner.invoke(app, [*args, "--limit", "5", "--k", "2", "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["n_tasks"] == 5 and summary["attempts"] == 2 and summary["pass_at_1"] == 1.0
    assert len((tmp_path / "run" / "traces.jsonl").read_text().splitlines()) == 10
    assert (tmp_path / "run" / "harness.yaml").exists()
    report = (tmp_path / "run" / "report.md").read_text()
    assert "| 1.000 | 1.000 |" in report and report.count("| arith-") == 5 and "2/2" in report
    bad = runner.invoke(app, ["eval", "--env", "nope"])
    assert bad.exit_code != 0 and "unknown env" in bad.output
    bad_arg = runner.invoke(app, ["eval", "--env", "arithmetic", "--env-arg", "n_taks=3"])
    assert bad_arg.exit_code != 0 and "n_taks" in bad_arg.output
    bad_backend = runner.invoke(app, ["eval", "--env", "arithmetic", "--model", "tiny", "--backend", "x"])
    assert bad_backend.exit_code != 0 and "backend must be transformers or vllm" in bad_backend.output


def test_eval_with_a_tiny_model(tmp_path):
    args = ["eval", "--env", "arithmetic", "--model", "tiny", "--split", "val", "--limit", "3", "--k", "2",
            "--temperature", "1.0", "--out", str(tmp_path / "run")]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["n_tasks"] == 3 and summary["completion_tokens"] > 0 and summary["errors"] == 0


def test_evolve_with_a_scripted_policy_writes_rounds_harnesses_and_summary(tmp_path):
    out = tmp_path / "evo"
    result = runner.invoke(app, ["evolve", "--env", "arithmetic", "--model", "scripted", "--rounds", "2",
                                 "--batch-tasks", "4", "--k", "2", "--val-limit", "4", "--test-limit", "3",
                                 "--max-new-tokens", "96", "--out", str(out)])
    assert result.exit_code == 0, result.output
    # a train.py run directory of mode=harness_only: the same round, records and report
    rounds = [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines()]
    expected = [(0, "harness_only", None), (1, "harness_only", None)]
    assert [(r["round"], r["mode"], r["grpo"]) for r in rounds] == expected
    assert rounds[0]["evolve"]["digests"][0]["n_traces"] == 8 and rounds[0]["evolve"]["digests"][0]["n_failed"] == 0
    assert (out / "harness-base.yaml").is_file() and (out / "report" / "summary.md").is_file()
    config = yaml.safe_load((out / "config.yaml").read_text())
    settings = (config["mode"], config["rollout"]["attempts"], config["evolution"]["critic_attempts"])
    assert settings == ("harness_only", 2, 2)
    start = json.loads((out / "start.json").read_text())
    assert len(start["val"]["outcomes"]) == 4 and len(start["test"]["outcomes"]) == 3
    summary = json.loads((out / "summary.json").read_text())
    assert summary["splits"] == {name: {"tasks": n, "pass@1": [1.0, 1.0], "pass@2": [1.0, 1.0]}
                                 for name, n in (("val", 4), ("test", 3))}
    assert "| val | 4 | 1.000 | 1.000 | 1.000 | 1.000 |" in (out / "summary.md").read_text()


def test_evolve_summary_reports_pass_at_1_and_k_and_every_verdict():
    from types import SimpleNamespace

    from coevo.harness.edits import Edit
    from coevo.report.data import Run
    from coevo.report.evolve_summary import evolve_markdown, evolve_summary
    from coevo.rundir.evolve_records import Outcome, Proposal, Verdict
    from coevo.rundir.records import Evaluation, StartRecord

    def verdict(ship: bool, reason: str) -> Verdict:
        proposal = Proposal(hypothesis="h", edits=[Edit("set_param", "sampling", param="temperature", value=0.1)],
                            dimension="model_selection", cluster="format_error")
        return Verdict(proposal, "p", "c", "base", Outcome.SHIP if ship else Outcome.REJECT, reason, gate="seesaw", round=1,
                       fail_to_pass=["a"] if ship else [])

    def evaluation(outcomes: dict) -> Evaluation:
        return Evaluation(0.0, 0.0, 2, outcomes)  # the summary computes the rates from the outcomes

    start = StartRecord(evaluation({"a": [False, False], "b": [True, False]}), None, {"base": "h0"}, 0)
    last = SimpleNamespace(val=evaluation({"a": [True, False], "b": [True, True]}), test=None, meta_tokens={"total": 0},
                           verdicts=[verdict(True, "ship: 1 fail→pass"), verdict(False, "reject: no fail→pass")])
    summary = evolve_summary(Run(Path("run"), [last], []), start, 2, "arithmetic")
    assert summary["splits"] == {"val": {"tasks": 2, "pass@1": [0.25, 0.75], "pass@2": [0.5, 1.0]}}
    assert [e["reason"] for e in summary["shipped"]] == ["ship: 1 fail→pass"]
    assert [e["reason"] for e in summary["rejected"]] == ["reject: no fail→pass"]
    assert summary["shipped"][0]["edits"] == ["set_param sampling.temperature"]
    text = evolve_markdown(summary)
    assert "| val | 2 | 0.250 | 0.750 | 0.500 | 1.000 |" in text
    assert "## Shipped edits (1)" in text and "reject: no fail→pass" in text
    one = evolve_markdown({**summary, "k": 1})
    assert "| val | 2 | 0.250 | 0.750 |\n" in one and "pass@1 before | pass@1 after |\n" in one  # no second pass@1


def test_evolve_refuses_an_unknown_gate(tmp_path):
    result = runner.invoke(app, ["evolve", "--env", "arithmetic", "--model", "scripted", "--gate", "vote",
                                 "--out", str(tmp_path)])
    assert result.exit_code != 0 and "seesaw" in result.output


def test_report_command_names_a_run_without_rounds(tmp_path):
    result = runner.invoke(app, ["report", str(tmp_path)])
    assert result.exit_code != 0 and "completed" in result.output


def test_config_show_prints_one_group_with_help_and_names_bad_groups():
    result = runner.invoke(app, ["config", "show", "trainer", "-o", "experiment=smoke"])
    assert result.exit_code == 0, result.output
    assert "trainer:" in result.output and "lr:" in result.output and "#" in result.output
    bad = runner.invoke(app, ["config", "show", "optim"])
    assert bad.exit_code != 0 and "trainer" in bad.output


def test_stream_names_bad_axis_and_protocol(tmp_path):
    for args, word in ((["--axis", "tool"], "skills"), (["--protocol", "online"], "self_evolving")):
        result = runner.invoke(app, ["stream", "--env", "arithmetic", "--model", "scripted", *args,
                                     "--out", str(tmp_path)])
        assert result.exit_code != 0 and word in result.output


def test_stream_on_an_env_without_axis_annotations_says_so(tmp_path):
    # arithmetic tasks carry a bare "calculator" capability, nothing on the tool: axis
    result = runner.invoke(app, ["stream", "--env", "arithmetic", "--model", "scripted", "--out", str(tmp_path)])
    assert result.exit_code != 0 and "tool:" in result.output


@pytest.mark.slow
def test_stream_runs_both_protocols_on_the_reasoning_tool_axis(tmp_path):
    out = tmp_path / "stream"
    result = runner.invoke(app, ["stream", "--env", "reasoning", "--env-arg",
                                 "datasets=[basic_arithmetic, letter_counting]", "--env-arg", "n_per_dataset=8",
                                 "--model", "tiny", "--max-new-tokens", "8", "--max-steps", "1", "--adapt-limit", "1",
                                 "--eval-limit", "1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    metrics = json.loads((out / "metrics.json").read_text())
    assert {"deployment", "self_evolving", "reference"} <= set(metrics)
    assert (out / "stream.png").stat().st_size > 0 and (out / "matrix-self_evolving.csv").is_file()


def test_evolve_notes_that_greedy_attempts_are_identical(tmp_path):
    args = ["evolve", "--env", "arithmetic", "--model", "scripted", "--rounds", "1", "--batch-tasks", "2",
            "--val-limit", "1", "--test-limit", "0"]
    greedy = runner.invoke(app, [*args, "--temperature", "0", "--out", str(tmp_path / "greedy")])
    sampled = runner.invoke(app, [*args, "--temperature", "0.7", "--out", str(tmp_path / "sampled")])
    assert greedy.exit_code == 0 and sampled.exit_code == 0, greedy.output + sampled.output
    assert "greedy decoding" in greedy.output and "greedy decoding" not in sampled.output


def test_eval_notes_a_harness_evolved_on_another_env(tmp_path):
    evolved = tmp_path / "harness-base.yaml"
    base_harness().save(evolved, evolved_on="reasoning")
    args = ["eval", "--env", "arithmetic", "--model", "scripted", "--split", "val", "--limit", "2", "--harness",
            str(evolved), "--out", str(tmp_path / "e")]
    noted = runner.invoke(app, args)
    assert noted.exit_code == 0, noted.output
    assert "was evolved on env 'reasoning'" in " ".join(noted.output.split())
    base_harness().save(evolved, evolved_on="arithmetic")
    assert "was evolved on" not in runner.invoke(app, args).output
    assert Harness.load(evolved).id == base_harness().id  # the note is outside the spec and the id


def test_harness_set_writes_a_harness_file_with_parameters_changed(tmp_path):
    """``coevo harness set``: each PROCESSOR.PARAM=VALUE a set_param edit (the value read as YAML),
    --compact-tools swaps the tool listing, bad names fail in one line naming what exists."""
    from typer.testing import CliRunner

    from coevo.cli.main import app
    from coevo.harness.harness import Harness

    out = tmp_path / "h.yaml"
    done = CliRunner().invoke(app, ["harness", "set", "function_calling", "sampling.max_new_tokens=256",
                                    "parse_retry.max_retries=1", "--compact-tools", "--out", str(out)])
    assert done.exit_code == 0, done.output
    h = Harness.load(out)
    assert h.get("sampling").config["max_new_tokens"] == 256 and h.get("parse_retry").config["max_retries"] == 1
    assert "{tools_compact}" in h.get("tool_schema_hint").config["template"]
    assert "<answer>" not in h.get("parse_retry").config["message"]  # function_calling's own rule: plain text
    bad = CliRunner().invoke(app, ["harness", "set", "function_calling", "sampling.nope=1", "--out", str(out)])
    assert bad.exit_code == 2 and "sampling takes ['max_new_tokens'" in bad.output
    bad = CliRunner().invoke(app, ["harness", "set", "base", "max_new_tokens=1", "--out", str(out)])
    assert bad.exit_code == 2 and "PROCESSOR.PARAM=VALUE" in bad.output
