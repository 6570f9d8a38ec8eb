"""scripts/internalisation.py on a tiny model_only run whose harness forces the tool: the run's
harness with and without its scaffolding, trained and frozen weights, one report."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

import coevo
from coevo.harness.defaults import base_harness
from coevo.harness.library.tools import ToolChoice
from coevo.rundir import checkpoint
from tests.test_loop import smoke

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("internalisation", ROOT / "scripts" / "internalisation.py")
internalisation = importlib.util.module_from_spec(spec)
spec.loader.exec_module(internalisation)


def test_forms_remove_exactly_the_scaffold():
    h = base_harness().insert(ToolChoice(tool="calculator", steps=1), index=0)
    forms = internalisation.harness_forms(h)
    assert list(forms) == ["as run", "without tool_choice"]  # the base harness shows no demonstrations
    assert forms["as run"] == h and "tool_choice" not in {p.kind for p in forms["without tool_choice"].processors}
    assert len(forms["without tool_choice"]) == len(h) - 1
    # the tools the run called: the harness listing only those is a form, when that lists fewer
    called = internalisation.harness_forms(h, called={"calculator"})[internalisation.CALLED]
    assert [p.config["enabled"] for p in called.processors if p.kind == "tool_registry"] == [["calculator"]]
    assert internalisation.CALLED not in internalisation.harness_forms(h, called=set())  # no tool: no form
    assert internalisation.only_tools(called, {"calculator"}) is None  # nothing would change


def test_tiny_run_trained_against_frozen_under_each_form(tmp_path):
    harness = tmp_path / "forced.yaml"
    base_harness().insert(ToolChoice(tool="calculator", steps=1), index=0).save(harness)
    run_dir = Path(coevo.run(smoke(tmp_path / "s0", "mode=model_only", "rounds=1", "model.lora=true",
                                   f"harness.start={harness}", "trainer.lr=1e-2")))
    summary = internalisation.main([str(run_dir), "--limit", "4", "--out", str(tmp_path / "out")])
    forms = summary["forms"]
    # the tiny model never completes a call, so no form lists only the tools it called
    assert internalisation.tools_run_called(run_dir) == set() and forms["as run"]["tasks"] >= 1
    assert set(forms) == {"as run", "without tool_choice"}
    for row in forms.values():
        for metric in ("pass", "tool_use"):
            diff, trained, frozen = (row[metric][k][0] for k in ("difference", "trained", "frozen"))
            assert diff == pytest.approx(trained - frozen)
    assert "without tool_choice" in (tmp_path / "out" / "internalisation.md").read_text()
    # the run shed nothing: asked for by name, its most scaffolded harness is its final one
    same = internalisation.main([str(run_dir), "--limit", "4", "--forms", "as run", "most scaffolded",
                                 "--out", str(tmp_path / "same")])["retirement"]
    assert same["final_minus_most_scaffolded"][0] == 0.0 and same["prompt_tokens_saved"] == 0.0
    # as ablation arms, beside a run that trained nothing (static: no adapter, the frozen weights)
    static = Path(coevo.run(smoke(tmp_path / "static", "mode=static", "rounds=1", "model.lora=true",
                                  f"harness.start={harness}")))
    arms = internalisation.main([str(run_dir), str(static), "--limit", "4", "--arms", "--out", str(tmp_path / "out")])
    assert list(arms["arms"]) == ["static", "model_only"] and arms["seeds"] == [0]
    assert set(arms["differences"]) == {"model_only - static"}
    assert "model_only - static" in (tmp_path / "out" / "internalisation-arms.md").read_text()
    with pytest.raises(SystemExit, match="trained no adapter"):
        internalisation.main([str(static), "--limit", "4", "--out", str(tmp_path / "out")])


def evaluation(passed: list[float], tools: list[float], trained: list[float] | None = None) -> dict:
    """What ``evaluate_run(..., arm=True)`` returns for a run: the start harness (frozen) and the
    final one, with the trained weights' scores where the run trained."""
    scores = lambda p, u: {"pass": dict(enumerate(p)), "tool_use": dict(enumerate(u)),  # noqa: E731
                           "prompt_tokens": dict.fromkeys(range(len(p)), 100.0)}
    zeros = [0.0] * len(passed)
    final = {"frozen": scores(passed, tools)} | ({"trained": scores(trained, tools)} if trained is not None else {})
    return {"start": {"frozen": scores(zeros, zeros)}, "as run": final}


def test_each_arm_is_its_final_harness_with_its_own_weights_paired_over_shared_seeds():
    passed, better = [1.0, 0.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]
    evaluated = [("coevolve", 0, evaluation(passed, [1.0] * 4, trained=better)),
                 ("coevolve", 2, evaluation(passed, [1.0] * 4, trained=better)),
                 ("harness_only", 0, evaluation(passed, [1.0] * 4)),
                 ("harness_only", 2, evaluation(passed, [1.0] * 4)),
                 ("harness_only", 5, evaluation(passed, [1.0] * 4))]  # a seed the other arm lacks: left out
    out = internalisation.summarise_arms(evaluated)
    assert out["seeds"] == [0, 2] and list(out["arms"]) == ["static", "harness_only", "coevolve"]
    assert out["arms"]["coevolve"]["pass"][0] == pytest.approx(100.0)  # the trained weights, not the frozen
    assert out["arms"]["harness_only"]["pass"][0] == pytest.approx(50.0)
    assert out["arms"]["static"]["pass"][0] == pytest.approx(0.0)
    assert out["differences"]["coevolve - harness_only"]["pass"][0] == pytest.approx(50.0)
    assert out["differences"]["harness_only - static"]["tool_use"][0] == pytest.approx(100.0)
    with pytest.raises(SystemExit, match="same seeds"):
        internalisation.summarise_arms([("coevolve", 0, evaluation(passed, [1.0] * 4, trained=better)),
                                        ("harness_only", 1, evaluation(passed, [1.0] * 4))])


def test_a_run_that_retired_its_prefill_is_measured_against_its_most_scaffolded_harness(tmp_path):
    scaffolded = base_harness().insert(ToolChoice(tool="calculator", steps=1), index=0)
    final = scaffolded.remove("tool_choice")
    run = tmp_path / "run"
    (run / "lineage").mkdir(parents=True)
    rows = [(base_harness(), "start"), (scaffolded, "shipped"), (final, "shipped")]
    for h, _how in rows:
        h.save(run / "lineage" / f"{h.id}.yaml")
    (run / "lineage.jsonl").write_text("".join(f'{{"id": "{h.id}", "variant": "base", "how": "{how}"}}\n'
                                               for h, how in rows))
    final.save(run / "harness-base.yaml")
    assert internalisation.most_scaffolded(run).id == scaffolded.id
    forms = internalisation.harness_forms(final, internalisation.most_scaffolded(run))
    assert list(forms) == ["most scaffolded", "most scaffolded, without tool_choice", "as run"]
    scaffolded.save(run / "harness-base.yaml")
    assert internalisation.most_scaffolded(run) is None  # nothing was retired

    def form(pass_, tool, tokens):  # one seed's per-task figures, trained = frozen
        row = {"pass": dict(zip("ab", pass_, strict=True)), "tool_use": dict(zip("ab", tool, strict=True)),
               "prompt_tokens": {"a": tokens, "b": tokens}}
        return {"trained": row, "frozen": row}

    seed = {"most scaffolded": form((1.0, 1.0), (1.0, 1.0), 400.0),
            "most scaffolded, without tool_choice": form((1.0, 0.0), (1.0, 0.0), 380.0),
            "as run": form((1.0, 0.0), (1.0, 0.0), 100.0)}
    retired = internalisation.summarise([seed, seed])["retirement"]
    assert retired["prompt_tokens_saved"] == pytest.approx(0.75)
    assert retired["unforced_pass_kept"] == pytest.approx(0.5)
    assert retired["final_minus_most_scaffolded"][0] == pytest.approx(-50.0)
    assert retired["unforced_tool_use"][0] == pytest.approx(50.0)
    assert "75.0% fewer prompt tokens" in internalisation.report_text(internalisation.summarise([seed]), "cmd")
    assert retired["per_seed"] == [{"final_minus_most_scaffolded": -50.0, "prompt_tokens": [100.0, 400.0]}] * 2
    # measured on the two forms alone (--forms 'as run' 'most scaffolded'): the comparison, without the prefill's
    only = internalisation.summarise([{k: v for k, v in seed.items() if "without" not in k}])["retirement"]
    assert only["final_minus_most_scaffolded"][0] == pytest.approx(-50.0) and "unforced_tool_use" not in only
    # a form of the final harness in its place (--final): the comparison is that form's
    seed[internalisation.CALLED] = form((1.0, 1.0), (1.0, 1.0), 80.0)
    narrowed = internalisation.summarise([seed], final=internalisation.CALLED)
    assert narrowed["retirement"]["final"] == internalisation.CALLED
    assert narrowed["retirement"]["prompt_tokens_saved"] == pytest.approx(0.8)
    assert narrowed["retirement"]["final_minus_most_scaffolded"][0] == pytest.approx(0.0)
    assert internalisation.CALLED in internalisation.report_text(narrowed, "cmd")


def test_transfer_evaluates_the_run_on_datasets_it_never_trained_on_with_its_starting_harness(tmp_path):
    run_dir = Path(coevo.run(smoke(tmp_path / "s0", "mode=model_only", "rounds=1", "model.lora=true",
                                   "env=reasoning", "+env.args.datasets=[basic_arithmetic]",
                                   "env.args.n_per_dataset=20",
                                   "~env.args.max_terms", "~env.args.max_operand", "~env.args.partial_credit",
                                   "~env.args.n_tasks")))
    per_form = internalisation.evaluate_run(run_dir, 4, ["products", "leg_counting"])
    skills = per_form.pop(internalisation.SKILLS)
    assert sorted(skills.values()) == ["leg_counting", "leg_counting", "products", "products"]  # two of each
    assert list(per_form)[0] == "start"
    for weights in per_form.values():
        for figures in weights.values():
            assert sorted(figures["pass"]) == sorted(skills)
    summary = internalisation.main([str(run_dir), "--limit", "4", "--datasets", "products", "leg_counting",
                                    "--out", str(tmp_path / "out")])
    text = (tmp_path / "out" / "transfer.md").read_text()
    assert "--datasets products leg_counting" in text and "dataset products" in text and "dataset leg_counting" in text
    assert {d: sub["forms"]["start"]["tasks"] for d, sub in summary["by_dataset"].items()} == \
        {"products": 2, "leg_counting": 2}
    assert summary["forms"]["start"]["tasks"] == 4


def test_a_run_is_evaluated_once_and_read_back_until_it_trains_further(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoint" / "round-0000").mkdir(parents=True)
    (run / "checkpoint" / "round-0000" / "state.json").write_text("{}")
    (run / "checkpoint" / checkpoint.LATEST).write_text("round-0000")
    calls = []
    evaluate = lambda: calls.append(1) or {"as run": {"frozen": {"pass": {"t1": 1.0}}}}  # noqa: E731
    first = internalisation.kept(tmp_path / "out", run, (10, []), evaluate)
    assert internalisation.kept(tmp_path / "out", run, (10, []), evaluate) == first and len(calls) == 1
    internalisation.kept(tmp_path / "out", run, (20, []), evaluate)  # other settings: evaluated again
    (run / "checkpoint" / "round-0001").mkdir()
    (run / "checkpoint" / "round-0001" / "state.json").write_text("{}")
    (run / "checkpoint" / checkpoint.LATEST).write_text("round-0001")
    internalisation.kept(tmp_path / "out", run, (10, []), evaluate)  # trained further: evaluated again
    assert len(calls) == 3
