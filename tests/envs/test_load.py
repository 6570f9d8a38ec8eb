"""Env names resolve to built-in envs or to import paths, with errors that name the allowed forms."""

from __future__ import annotations

import pytest

from coevo.envs import ENVS, ArithmeticEnv, calculator_solver
from coevo.envs.load import check_env_args, env_class, make_env, scripted_solver

PATH = "examples.countdown_env:CountdownEnv"


def test_built_in_names_and_import_paths_resolve():
    assert all(env_class(name) is cls for name, cls in ENVS.items())
    from examples.countdown_env import CountdownEnv

    assert env_class(PATH) is CountdownEnv
    assert isinstance(make_env("arithmetic", {"n_tasks": 5}), ArithmeticEnv)
    assert make_env(PATH, {"n_tasks": 5}).tasks("train") is not None


@pytest.mark.parametrize(("name", "message"), [
    ("gsm8k", r"unknown env 'gsm8k'; use a built-in env \['arithmetic', 'office', 'openenv', 'program', "
              r"'reasoning', 'skyrl_gym', 'textworld_express', 'verifiers'\] or an "
              r"import path 'package\.module:ClassName'"),
    ("no_such_pkg.envs:Env", r"module 'no_such_pkg\.envs' is not importable .*PYTHONPATH"),
    ("examples.countdown_env:Nope", r"has no attribute 'Nope'"),
    ("examples.countdown_env:check_expression",
     r"is not an environment class: it does not subclass coevo.envs.base.Env"),
    ("not a path:X", r"is not an import path; write it as 'package\.module:Name'"),
])
def test_bad_names_say_what_is_allowed(name, message):
    with pytest.raises(ValueError, match=message):
        env_class(name)


def test_constructor_arguments_are_checked_without_building_the_env():
    check_env_args("arithmetic", {"n_tasks": 5})
    with pytest.raises(ValueError, match=r"does not take the arguments \{'datasets'.*ArithmeticEnv\(n_tasks"):
        check_env_args("arithmetic", {"datasets": ["x"]})
    with pytest.raises(ValueError, match="unexpected keyword argument 'n_per_dataset'"):
        make_env(PATH, {"n_per_dataset": 3})


def test_scripted_solvers_come_from_the_table_or_the_env_class():
    from examples.countdown_env import CountdownEnv

    assert scripted_solver("arithmetic") is calculator_solver
    assert scripted_solver(PATH) is CountdownEnv.scripted_solver
    assert scripted_solver("reasoning") is None


def test_an_env_module_whose_dependency_is_missing_names_the_path_and_the_package(tmp_path, monkeypatch):
    """A module that exists but imports an uninstalled package is told apart from a module that
    does not exist: the error names the import path and the package to install."""
    (tmp_path / "env_needing_a_dep.py").write_text("import coevo_no_such_dependency\n\n\nclass Env:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    path = "env_needing_a_dep:Env"
    for resolve in (lambda: env_class(path), lambda: make_env(path, {})):
        with pytest.raises(ValueError) as info:
            resolve()
        message = str(info.value)
        assert message.startswith(f"env {path!r} needs module 'coevo_no_such_dependency', which is not installed")
        assert "module 'env_needing_a_dep' imports it" in message and "not importable" not in message
    with pytest.raises(ValueError, match=r"module 'env_not_there' is not importable .*PYTHONPATH"):
        env_class("env_not_there:Env")
