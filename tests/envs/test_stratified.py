"""A sample naming several datasets holds the same number of tasks from each, or fails naming the one missing."""

import pytest

from coevo.envs.base import Task, skill_of, stratified
from coevo.envs.reasoning import ReasoningEnv


def task(i: int, skill: str) -> Task:
    return Task(f"t{i}", "env", "", "test", None, capabilities=("tool:calculator", f"skill:{skill}"))


def test_each_named_dataset_gives_the_same_number_of_tasks():
    tasks = [task(i, "products") for i in range(60)] + [task(60 + i, "leg_counting") for i in range(7)]
    assert [skill_of(t) for t in tasks[:50]] == ["products"] * 50  # the first 50: one dataset only
    sample = stratified(tasks, ["products", "leg_counting"], 50)
    assert [skill_of(t) for t in sample] == ["products"] * 7 + ["leg_counting"] * 7  # the smaller one bounds both
    sample = stratified(tasks, ["products", "leg_counting"], 10)
    assert [t.task_id for t in sample] == [f"t{i}" for i in range(5)] + [f"t{60 + i}" for i in range(5)]


def test_a_named_dataset_without_a_task_fails_loudly():
    tasks = [task(i, "products") for i in range(10)]
    missing = r"no task of \['leg_counting'\] in this split \(its datasets: \['products'\]\)"
    with pytest.raises(ValueError, match=missing):
        stratified(tasks, ["products", "leg_counting"], 10)
    with pytest.raises(ValueError, match="limit 1 is fewer than the 2 datasets"):
        stratified(tasks, ["products", "leg_counting"], 1)


def test_the_reasoning_env_test_split_sampled_per_dataset():
    env = ReasoningEnv(datasets=["products", "leg_counting", "gsm_symbolic"], n_per_dataset=80)
    sample = stratified(env.tasks("test"), ["products", "leg_counting", "gsm_symbolic"], 15)
    assert sorted(skill_of(t) for t in sample) == ["gsm_symbolic"] * 5 + ["leg_counting"] * 5 + ["products"] * 5
