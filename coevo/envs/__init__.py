"""Environments: the Env base classes and the built-in task sets."""

from coevo.envs.arithmetic import ArithmeticEnv, calculator_solver
from coevo.envs.base import SPLITS, Env, EnvSession, Score, Task, assign_split
from coevo.envs.command_env import CommandEnv
from coevo.envs.office import OfficeEnv, gold_solver
from coevo.envs.openenv_env import OpenEnvEnv
from coevo.envs.reasoning import ReasoningEnv
from coevo.envs.skyrl_env import SkyRLEnv
from coevo.envs.textworld_express import TWXEnv
from coevo.envs.verifiers_env import VerifiersEnv

ENVS = {"arithmetic": ArithmeticEnv, "office": OfficeEnv, "reasoning": ReasoningEnv, "textworld_express": TWXEnv,
        "verifiers": VerifiersEnv, "skyrl_gym": SkyRLEnv, "program": CommandEnv,
        "openenv": OpenEnvEnv}
"""Environments constructible by name (the CLI and configs use this); ``verifiers`` and ``skyrl_gym``
run the environments of those libraries and ``openenv`` an OpenEnv server or app (the ``envs`` extra);
``program`` runs any agent program that speaks the OpenAI API on another env's tasks."""

SCRIPTED_SOLVERS = {"arithmetic": calculator_solver, "office": gold_solver}
"""Scripted demo policies, for envs that have one."""

__all__ = ["ArithmeticEnv", "OfficeEnv",
    "ReasoningEnv", "ENVS",
    "SCRIPTED_SOLVERS", "CommandEnv", "Env", "OpenEnvEnv", "EnvSession", "SPLITS", "Score", "SkyRLEnv", "TWXEnv",
    "VerifiersEnv",
    "Task", "assign_split"]
