"""An environment from its name in a config or on the command line: built-in, or by import path.

``train.py env.name=...``, ``coevo eval --env ...``, ``coevo evolve --env ...`` and ``coevo stream
--env ...`` all resolve the name here, so an environment defined in the user's own module
(``package.module:ClassName``, see ``coevo.config.imports``) works everywhere a built-in one does.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from coevo.config.imports import import_object
from coevo.envs.base import Env
from coevo.errors import UsageError
from coevo.harness.events import Message


def allowed_forms() -> str:
    """The accepted forms of an env name, for error messages."""
    from coevo.envs import ENVS

    return f"a built-in env {sorted(ENVS)} or an import path 'package.module:ClassName'"


def env_class(name: str) -> type[Env]:
    """The class an env name stands for; a ValueError naming the allowed forms otherwise."""
    from coevo.envs import ENVS

    if name in ENVS:
        return ENVS[name]
    if ":" not in name:
        raise UsageError(f"unknown env {name!r}; use {allowed_forms()}")
    cls = import_object(name, "env")
    if not (isinstance(cls, type) and issubclass(cls, Env)):
        raise UsageError(f"env {name!r} is not an environment class: it does not subclass coevo.envs.base.Env "
                         "(which declares tasks and reset, and the optional parts with their defaults)")
    return cls


def check_env_args(name: str, args: dict[str, Any] | None) -> None:
    """Refuse keyword arguments the env's constructor does not take, naming the ones it does,
    without building the env (some load datasets or start JVMs)."""
    cls = env_class(name)
    try:
        signature = inspect.signature(cls)
    except (TypeError, ValueError):  # no introspectable signature: the constructor will say
        return
    try:
        signature.bind(**(args or {}))
    except TypeError as err:
        raise UsageError(f"env {name!r} does not take the arguments {dict(args or {})}: {err}; "
                         f"its constructor is {cls.__name__}{signature}") from None


def make_env(name: str, args: dict[str, Any] | None = None) -> Env:
    """``env_class(name)(**args)``, after ``check_env_args``."""
    check_env_args(name, args)
    return env_class(name)(**(args or {}))


def scripted_solver(name: str) -> Callable[[list[Message]], str] | None:
    """The env's scripted demo policy, if it has one: ``SCRIPTED_SOLVERS`` for a built-in env, the
    class's ``scripted_solver`` (a static method: messages → completion text) for one given by path."""
    from coevo.envs import SCRIPTED_SOLVERS

    if name in SCRIPTED_SOLVERS:
        return SCRIPTED_SOLVERS[name]
    return env_class(name).scripted_solver
