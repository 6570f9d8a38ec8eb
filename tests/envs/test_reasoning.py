"""The reasoning-gym env: gold answers verify, splits are stable, tools work, episodes run end to end."""

import json
import re

import pytest

from coevo.agent import ScriptedPolicy, run_episode
from coevo.envs.base import SPLITS, Task
from coevo.envs.reasoning import BANDS, CURATED, DEFAULT_DATASETS, ReasoningEnv
from coevo.harness.defaults import base_harness

N = 4


@pytest.fixture(scope="module")
def env() -> ReasoningEnv:
    return ReasoningEnv(n_per_dataset=N)


def first_task(env: ReasoningEnv, dataset: str, where=lambda t: True) -> Task:
    return next(t for t in env.all_tasks() if t.metadata["dataset"] == dataset and where(t))


def test_every_default_dataset_verifies_its_gold_answer_and_rejects_wrong_ones(env):
    for dataset in DEFAULT_DATASETS:
        tasks = [t for t in env.all_tasks() if t.metadata["dataset"] == dataset]
        assert len(tasks) == N, dataset
        for task in tasks:
            session = env.reset(task)
            gold = session.verify(task.answer)
            assert (gold.reward, gold.passed, gold.info["expected"]) == (1.0, True, task.answer), task.task_id
            assert session.verify(f"  {task.answer}\n").passed  # surrounding whitespace is not the model's error
            wrong = session.verify("no idea")
            assert (wrong.reward, wrong.passed) == (0.0, False), task.task_id
            assert session.verify(None).reward == 0.0
            if re.fullmatch(r"-?\d+", task.answer):
                off_by_one = session.verify(str(int(task.answer) + 1))
                assert not off_by_one.passed and off_by_one.reward < 1.0, task.task_id


def test_splits_are_disjoint_cover_all_and_repeat_for_the_same_seed(env):
    ids = {s: [t.task_id for t in env.tasks(s)] for s in SPLITS}
    assert sum(len(v) for v in ids.values()) == len(env.all_tasks()) == N * len(DEFAULT_DATASETS)
    assert set().union(*ids.values()) == {t.task_id for t in env.all_tasks()}
    again = ReasoningEnv(n_per_dataset=N)
    assert {s: [t.task_id for t in again.tasks(s)] for s in SPLITS} == ids
    with pytest.raises(ValueError, match="unknown split"):
        env.tasks("dev")


def test_generation_and_splits_are_pinned():
    """Questions, ids and splits for seed 0: a change in reasoning-gym's generators, in the curated
    config or in the hashing shows up here, and would silently reshuffle train and test."""
    env = ReasoningEnv(datasets=["basic_arithmetic", "family_relationships"], n_per_dataset=4, seed=0)
    got = [(t.task_id, t.split, t.answer) for t in env.all_tasks()]
    assert got == [
        ("reasoning/basic_arithmetic/2c04dd367fbd", "train", "-2"),
        ("reasoning/basic_arithmetic/9f1e376502e8", "train", "2"),
        ("reasoning/basic_arithmetic/3db6a0842024", "test", "1"),
        ("reasoning/basic_arithmetic/9031eae79f93", "train", "-17"),
        ("reasoning/family_relationships/9aa7c5e9e497", "val", "wife"),
        ("reasoning/family_relationships/efd2a05448dc", "train", "mother-in-law"),
        ("reasoning/family_relationships/2e494c6363f3", "train", "son"),
        ("reasoning/family_relationships/bb26df5d477a", "train", "wife"),
    ]
    first = env.all_tasks()[0]
    assert first.instruction == "Calculate -1 * 0 - 2.\n\nAnswer with the integer result only."
    assert first.gold_actions[0].arguments == {"expression": "-1 * 0 - 2"}
    other_seed = ReasoningEnv(datasets=["basic_arithmetic"], n_per_dataset=4, seed=1)
    assert [t.task_id for t in other_seed.all_tasks()] != [t.task_id for t in env.all_tasks()[:4]]


def test_ids_capabilities_and_metadata(env):
    tasks = env.all_tasks()
    assert len({t.task_id for t in tasks}) == len(tasks)
    for task in tasks:
        dataset = task.metadata["dataset"]
        spec = CURATED[dataset]
        assert re.fullmatch(rf"reasoning/{dataset}/[0-9a-f]{{12}}", task.task_id)
        assert task.env == "reasoning" and task.instruction.endswith(spec.answer_note)
        assert task.capabilities == ((f"tool:{spec.tool}",) if spec.tool else ()) + (f"skill:{dataset}",)
        assert task.metadata["band"] in BANDS
        assert json.loads(json.dumps(task.metadata)) == task.metadata  # plain JSON, round-trips exactly
        assert task.metadata["entry"]["source_dataset"] == dataset
        if spec.gold is not None:  # every curated gold derivation must hold on every task
            assert [c.name for c in task.gold_actions] == [spec.tool], task.task_id


def test_duplicate_questions_are_dropped():
    """One animal, one instance: only 37 distinct questions exist, however many are asked for."""
    env = ReasoningEnv(
        ["leg_counting"], n_per_dataset=50, configs={"leg_counting": {"max_animals": 1, "max_instances": 1}}
    )
    questions = [t.instruction for t in env.all_tasks()]
    assert len(questions) == len(set(questions)) == 37


def test_gold_actions_reproduce_the_answer_in_the_session(env):
    assert env.all_tasks()
    for task in env.all_tasks():
        if not task.gold_actions:
            continue
        session = env.reset(task)
        result = session.call_tool(task.gold_actions[0].name, task.gold_actions[0].arguments)
        assert result.error is None, (task.task_id, result.error)
        assert session.verify(result.output).passed, (task.task_id, result.output, task.answer)


def test_tools(env):
    session = env.reset(env.all_tasks()[0])
    assert set(session.tools) == {"calculator", "python"}
    assert all(spec.provider == "env" for spec in session.tools.values())
    assert session.call_tool("calculator", {"expression": "2 + 3 * (4 - 1)"}).output == "11"
    assert session.call_tool("calculator", {"expression": "7 / 2"}).output == "3.5"
    assert session.call_tool("calculator", {"expression": "1/0"}).error == "division by zero"
    assert session.call_tool("calculator", {}).error is not None
    printed = session.call_tool("python", {"code": "print(sum(range(10)))"})
    assert (printed.output, printed.error) == ("45\n", None)
    assert "ZeroDivisionError" in session.call_tool("python", {"code": "1/0"}).error
    assert session.call_tool("python", {"code": 3}).error is not None
    assert "unknown tool" in session.call_tool("shell", {}).error


def test_python_timeout_is_a_tool_error_not_an_exception():
    env = ReasoningEnv(["chain_sum"], n_per_dataset=1, python_timeout_s=0.5)
    result = env.reset(env.all_tasks()[0]).call_tool("python", {"code": "while True:\n    pass"})
    assert result.output == "" and "timed out" in result.error


def test_gold_answer_episode_passes_end_to_end(env):
    # One task per dataset whose answer fits on one line: the base harness keeps only the first line
    # of an <answer> block, so multi-line answers (mini_sudoku grids) cannot pass through it.
    for dataset in DEFAULT_DATASETS:
        task = next((t for t in env.all_tasks() if t.metadata["dataset"] == dataset and "\n" not in t.answer), None)
        if task is None:
            assert dataset == "mini_sudoku"
            continue
        trace = run_episode(
            task, base_harness(), ScriptedPolicy(lambda messages, t=task: f"<answer>{t.answer}</answer>"), env
        )
        assert trace.error is None and trace.passed and trace.reward == 1.0, (task.task_id, trace.error)


@pytest.mark.parametrize("dataset", ["basic_arithmetic", "leg_counting", "letter_counting"])
def test_replaying_gold_actions_passes_end_to_end(env, dataset):
    task = first_task(env, dataset)
    calls = list(task.gold_actions)
    assert calls

    def respond(messages):
        if messages[-1]["role"] == "tool":
            return f"<answer>{messages[-1]['content'].strip()}</answer>"
        call = calls[0]
        return f"<tool_call>{json.dumps({'name': call.name, 'arguments': call.arguments})}</tool_call>"

    trace = run_episode(task, base_harness(), ScriptedPolicy(respond), env)
    assert trace.error is None and trace.passed, (trace.error, trace.final_answer, task.answer)
    assert [c.name for c in trace.tool_calls] == [calls[0].name]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"datasets": ["chain_sum", "sokoban_deluxe"]},
            r"unknown reasoning datasets \['sokoban_deluxe'\]; choose from: basic_arithmetic, chain_sum",
        ),
        ({"datasets": []}, "non-empty list"),
        ({"datasets": "chain_sum"}, "a list of names, not the string 'chain_sum'"),
        ({"datasets": ["chain_sum", "chain_sum"]}, "twice"),
        ({"n_per_dataset": 0}, "n_per_dataset must be a positive integer"),
        ({"split_fractions": (0.5, 0.5, 0.5)}, "summing to 1"),
        ({"split_fractions": (1.2, -0.2, 0.0)}, "non-negative"),
        ({"datasets": ["chain_sum"], "configs": {"products": {}}}, r"not selected: \['products'\]"),
        ({"datasets": ["chain_sum"], "configs": {"chain_sum": {"seed": 3}}}, "env controls these"),
        (
            {"datasets": ["chain_sum"], "configs": {"chain_sum": {"max_term": 5}}},
            "invalid config for 'chain_sum'.*fields: min_terms",
        ),
        (
            {"datasets": ["chain_sum"], "configs": {"chain_sum": {"min_terms": 5, "max_terms": 2}}},
            "invalid config for 'chain_sum'",
        ),
        ({"python_timeout_s": 0}, "must be positive"),
    ],
)
def test_bad_arguments_raise_helpful_value_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ReasoningEnv(**{"n_per_dataset": 1, **kwargs})


def test_reset_rejects_a_task_from_elsewhere(env):
    foreign = Task("reasoning/chain_sum/000000000000", "reasoning", "What is 1 + 1?", "train", "2")
    with pytest.raises(ValueError, match="not generated by this reasoning env"):
        env.reset(foreign)
