"""What the ``coevo`` commands share: the console, ``--env``/``--env-arg`` parsing, sampling
overrides, the prompt-size line and the policy a command runs (gold, scripted, transformers, vLLM).
Bad input is a ``typer.BadParameter`` naming the option, which the CLI prints as a usage error."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console

from coevo.envs import ENVS
from coevo.harness import Harness
from coevo.harness.defaults import with_step_cap

if TYPE_CHECKING:
    from coevo.agent.policy import Policy
    from coevo.envs.base import Env

console = Console()
ENV_HELP = (f"environment: {' | '.join(ENVS)}, or the import path package.module:ClassName "
            "of your own (docs/environments.md)")


def with_sampling(h: Harness, temperature: float | None, max_new_tokens: int | None, attempts: int,
                  max_steps: int | None = None) -> Harness:
    """``h`` with the sampling overrides of ``--temperature``/``--max-new-tokens``, its step budget
    raised to ``--max-steps`` (``with_step_cap``), and a note when greedy decoding would make the
    ``attempts`` of a task identical (pass@k would be pass@1)."""
    if max_steps is not None:
        h = with_step_cap(h, max_steps)
    overrides = {"temperature": temperature, "max_new_tokens": max_new_tokens}
    for param, value in overrides.items():
        if value is None:
            continue
        if "sampling" not in h:
            raise typer.BadParameter("the harness has no 'sampling' processor to set",
                                     param_hint=f"--{param.replace('_', '-')}")
        h = h.set_param("sampling", param, value)
    if attempts > 1 and "sampling" in h and h.get("sampling").config["temperature"] == 0:
        console.print(f"[yellow]note: greedy decoding makes the {attempts} attempts identical; "
                      f"pass --temperature[/yellow]")
    return h


def split_env_arg(pair: str) -> tuple[str, str]:
    """``"n_per_dataset=10"`` -> ("n_per_dataset", "10"); anything else is a usage error."""
    key, sep, value = pair.partition("=")
    if not sep or not key.isidentifier():
        raise typer.BadParameter(f"expected KEY=VALUE, got {pair!r}", param_hint="--env-arg")
    return key, value


def parse_env_args(pairs: list[str]) -> dict[str, object]:
    """``["n_per_dataset=10", "games=[coin]"]`` -> keyword arguments (values parsed as YAML)."""
    import yaml

    return {key: yaml.safe_load(value) for key, value in map(split_env_arg, pairs)}


def resolve_env(name: str):
    """The env class for ``--env``: a built-in name or ``package.module:ClassName``."""
    from coevo.envs.load import env_class

    try:
        return env_class(name)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--env") from None


def say_prompt_size(policy: Policy, harness: Harness, env: Env, split: str, max_steps: int) -> None:
    """The first prompt's size against the model's context window, printed before any episode (a
    large tool listing shows here); a completion budget that does not fit is a usage error."""
    from coevo.agent.evaluate import first_tasks
    from coevo.loop.config_check import check_context_window

    first = first_tasks(env, split, 1)
    size = check_context_window(policy, harness, env, first[0], max_steps, field="--max-new-tokens") if first else None
    if size is not None:
        console.print(size, soft_wrap=True)


def cli_policy(model: str, backend: str, device: str, adapter: str | None, env_name: str, seed: int, *,
                 env: Env, delegate: bool = False):
    """The policy for ``coevo eval`` and ``coevo stream``: ``gold`` (``env``'s tasks' own gold
    actions; with ``delegate``, as a lead handing them to specialists by ``env.tool_owners``),
    ``scripted`` (the env's scripted solver), or a model name or path served by transformers or vLLM."""
    from coevo.loop.builders import scripted_policy
    from coevo.loop.config_check import SCRIPTED_MODELS

    if model in SCRIPTED_MODELS:  # gold: as one agent or, on the agents axis, a delegating lead
        try:
            return scripted_policy(model, env, env_name, delegate=delegate)
        except ValueError as err:
            raise typer.BadParameter(str(err), param_hint="--model") from None
    if backend == "transformers":
        from coevo.policy.load import transformers_policy

        return transformers_policy(model, device=device, adapter=adapter, seed=seed)
    if backend == "vllm":
        from transformers import AutoTokenizer

        from coevo.policy.smollm2 import converted_dir
        from coevo.policy.vllm import ColocatedEngine, VLLMPolicy

        path = str(converted_dir()) if model == "smollm2" else model
        if not Path(path).is_dir():
            raise typer.BadParameter("vllm serves smollm2 or a local model directory", param_hint="--model")
        return VLLMPolicy(ColocatedEngine(path, seed=seed), AutoTokenizer.from_pretrained(path),
                          model_version=Path(path).name)
    raise typer.BadParameter(f"backend must be transformers or vllm, got {backend!r}", param_hint="--backend")
