"""Environments: the Env protocol and the built-in task sets."""

from coevo.envs.arithmetic import ArithmeticEnv
from coevo.envs.base import SPLITS, Env, EnvSession, Score, Task, assign_split

ENVS = {"arithmetic": ArithmeticEnv}
"""Environments constructible by name (the CLI and configs use this)."""

__all__ = ["ArithmeticEnv", "ENVS", "Env", "EnvSession", "SPLITS", "Score", "Task", "assign_split"]
