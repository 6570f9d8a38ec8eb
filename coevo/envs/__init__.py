"""Environments: the Env protocol and the built-in task sets."""

from coevo.envs.arithmetic import ArithmeticEnv, calculator_solver
from coevo.envs.base import SPLITS, Env, EnvSession, Score, Task, assign_split
from coevo.envs.office import OfficeEnv, gold_solver
from coevo.envs.reasoning import ReasoningEnv
from coevo.envs.textworld_express import TWXEnv

ENVS = {"arithmetic": ArithmeticEnv, "office": OfficeEnv, "reasoning": ReasoningEnv, "textworld_express": TWXEnv}
"""Environments constructible by name (the CLI and configs use this)."""

SCRIPTED_SOLVERS = {"arithmetic": calculator_solver, "office": gold_solver}
"""Scripted demo policies, for envs that have one."""

__all__ = ["ArithmeticEnv", "OfficeEnv",
    "ReasoningEnv", "ENVS",
    "SCRIPTED_SOLVERS", "Env", "EnvSession", "SPLITS", "Score", "TWXEnv",
    "Task", "assign_split"]
