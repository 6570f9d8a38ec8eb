"""Environments: the Env protocol and the built-in task sets."""

from coevo.envs.arithmetic import ArithmeticEnv, calculator_solver
from coevo.envs.base import SPLITS, Env, EnvSession, Score, Task, assign_split

ENVS = {"arithmetic": ArithmeticEnv}
"""Environments constructible by name (the CLI and configs use this)."""

SCRIPTED_SOLVERS = {"arithmetic": calculator_solver}
"""Scripted demo policies, for envs that have one."""

__all__ = ["ArithmeticEnv", "ENVS",
    "SCRIPTED_SOLVERS", "Env", "EnvSession", "SPLITS", "Score", "Task", "assign_split"]
