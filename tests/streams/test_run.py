"""``run_stream`` end to end on the toolbox env (three tool capabilities) with the scripted solver
and the default rule meta-agent: both protocols, every output file, values that match the
protocol tests."""

from __future__ import annotations

import csv
import json

import pytest

from coevo.agent.policy import ScriptedPolicy
from coevo.config.schema import EvolutionConfig, RolloutConfig
from coevo.harness.harness import Harness
from coevo.report.progress import NullProgress
from coevo.streams import run_stream
from coevo.streams.config import StreamConfig
from tests.streams.test_protocols import DEPLOYMENT, REFERENCE
from tests.streams.toolbox import ToolboxEnv, solve


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("stream")
    config = StreamConfig(axis="tools", stages=3, protocols=("deployment", "self_evolving"), rounds_per_stage=1,
                          adapt_limit=None, eval_limit=None, distractors_per_stage=1,
                          rollout=RolloutConfig(attempts=1, max_steps=6), seed=0)
    return run_stream(ToolboxEnv(), ScriptedPolicy(solve), out, config)


def test_every_file_is_written(run):
    out = run.out_dir
    for name in ("stream.json", "metrics.json", "outcomes.jsonl", "evolve.jsonl", "stream.png",
                 "matrix-deployment.csv", "matrix-deployment.json", "matrix-self_evolving.csv",
                 "matrix-self_evolving.json"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    assert (out / "stream.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    saved = sorted(p.name for p in (out / "harnesses").iterdir())
    assert "deployment-stage2-base.yaml" in saved and "self_evolving-stage0-base.yaml" in saved
    assert "stage_tools" in (out / "harnesses" / "deployment-stage2-base.yaml").read_text()
    assert len(list((out / "references").iterdir())) > 0


def test_matrices_and_metrics_on_disk(run):
    out = run.out_dir
    with (out / "matrix-deployment.csv").open() as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["stage", "cohort_0", "cohort_1", "cohort_2"]
    assert [[None if v == "" else float(v) for v in r[1:]] for r in rows[1:]] == DEPLOYMENT
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["reference"]["pass_rate"] == REFERENCE
    assert metrics["released"] == [["add"], ["mul"], ["neg"]]
    dep = metrics["deployment"]
    assert dep["matrix"] == DEPLOYMENT
    assert dep["fwt"] == pytest.approx(0.0) and dep["bwt"] == pytest.approx(-0.4)
    assert len(dep["eval_tokens"]) == 3 and all(t > 0 for t in dep["eval_tokens"])
    evo = json.loads((out / "matrix-self_evolving.json").read_text())
    assert all(evo["matrix"][i][j] is None for i in range(3) for j in range(i + 1, 3))
    assert all(evo["matrix"][i][j] is not None for i in range(3) for j in range(i + 1))
    assert sum(evo["adapt_tokens"]) > 0
    stream = json.loads((out / "stream.json").read_text())
    assert [s["released"] for s in stream["stages"]] == [["add"], ["mul"], ["neg"]]
    assert stream["args"]["protocols"] == ["deployment", "self_evolving"]


def test_outcomes_cover_every_stage_cohort_and_task(run):
    lines = [json.loads(x) for x in (run.out_dir / "outcomes.jsonl").read_text().splitlines()]
    by = {p: [x for x in lines if x["protocol"] == p] for p in ("reference", "deployment", "self_evolving")}
    assert len(by["reference"]) == 5 + 3 + 2
    assert len(by["deployment"]) == len(by["self_evolving"]) == 5 + (5 + 3) + (5 + 3 + 2)
    assert all(x["cohort"] <= x["stage"] for x in lines)
    final = run.results["self_evolving"].harnesses[-1]["base"]
    assert isinstance(final, Harness) and final.get("tool_registry").config["enabled"][:3] == ["add", "mul", "neg"]


def test_one_protocol_and_the_skills_axis(tmp_path):
    config = StreamConfig(axis="skills", stages=2, protocols=("deployment",), adapt_limit=None, eval_limit=2,
                          rollout=RolloutConfig(attempts=1, max_steps=6))
    result = run_stream(ToolboxEnv(), ScriptedPolicy(solve), tmp_path, config, progress=NullProgress())
    assert (tmp_path / "matrix-deployment.csv").is_file() and not (tmp_path / "matrix-self_evolving.csv").exists()
    assert result.stream.released == (("add", "mul"), ("neg",))
    assert "skill_library" in result.results["deployment"].harnesses[1]["base"]


@pytest.mark.parametrize("kwargs, message", [
    ({"protocols": "deployment"}, "not the string"),
    ({"protocols": ("deploy",)}, "protocols must be distinct names from"),
    ({"protocols": ("deployment", "deployment")}, "protocols must be distinct names from"),
    ({"axis": "memory"}, "axis must be one of"),
    ({"rollout": RolloutConfig(attempts=0)}, r"config rollout.attempts=0 is not allowed; it must be >= 1"),
    ({"evolution": EvolutionConfig(gate="vote")}, r"config evolution.gate='vote' is not allowed; choose"),
    ({"stages": 0}, r"config stages=0 is not allowed; it must be >= 1"),
    ({"adapt_limit": 0}, r"config adapt_limit=0 is not allowed"),
    ({"axis": "agents"}, "env 'toolbox' has no tool_owners map"),
    ({"distractors_per_stage": 6}, "distractors must be an integer in 0..10"),
])
def test_bad_arguments_are_refused(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        run_stream(ToolboxEnv(), ScriptedPolicy(solve), tmp_path, StreamConfig(**kwargs), progress=NullProgress())
