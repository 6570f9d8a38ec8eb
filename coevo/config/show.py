"""The config reference: composed defaults with each field's help, as YAML (``show``) or Markdown
(``reference_markdown``, written to ``docs/config.md`` by ``scripts/config_reference.py``).

Both read the help text from the schema (``coevo/config/schema.py``), the single source of truth, and the
values from Hydra's composition of ``configs/train.yaml``, so what they print is what
``python train.py`` runs with. ``show`` output is valid YAML: the comments sit beside the values.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import MISSING, Field, fields
from pathlib import Path
from typing import Any

import yaml

from coevo.config.schema import GROUPS, TrainConfig, allowed, describe, register, resolve

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
REFERENCE_DOC = Path(__file__).resolve().parents[2] / "docs" / "config.md"

TOUCHED = (
    ("model.name", ("the model: `smollm2` (the main job's), `tiny` (a random test model), or a local "
                    "`save_pretrained` directory; `model=tiny` picks the group option")),
    ("model.lora", "train a LoRA adapter (`true`, the default for smollm2) or all weights"),
    ("model.device", "`auto` takes the GPU when there is one; `cpu` or `cuda:N` to choose"),
    ("env.name", ("the environment, or `package.module:ClassName` of your own; `env=reasoning_easy`, "
                  "`env=arithmetic`, ... pick one with its arguments")),
    ("env.args", "the environment's constructor arguments: datasets, tasks per dataset"),
    ("mode", "`coevolve`, or one half alone: `harness_only`, `model_only`, `static` (the ablation's arms)"),
    ("rounds", "how many rounds (rollouts, AEGIS, GRPO, checkpoint); raise it to extend a run"),
    ("batch_tasks", "train tasks per round"),
    ("seed", "the seed of sampling and task order; repeat a run with `seed=1`, `seed=2`, ..."),
    ("name", "the run's name: its directory `runs/<name>` and its W&B run"),
    ("run_dir", "where the run lives (default `runs/<name>`); started again on it, the run resumes"),
    ("rollout.attempts", "episodes per task per round: GRPO's group size and k of pass@k"),
    ("rollout.max_new_tokens", "the completion budget of each model call"),
    ("trainer.lr", "the learning rate"),
    ("test", "evaluate the sealed test split at the start and the end (`test_limit`: how many tasks)"),
    ("evolution.gate", "how the Critic judges an edit: `stat` (the default), `seesaw`, `performance`, `both`"),
)
"""The fields a user sets (from README.md's commands and the presets in configs/), with why; the
head of docs/config.md. Group options (``rollout=vllm``, ``logger=wandb``, ``meta_agent=openai``,
``experiment=smoke``) are the other thing a user picks."""


def compose_defaults(overrides: Sequence[str] = (),
                     config_dir: Path = CONFIGS) -> tuple[dict[str, Any], dict[str, str | None]]:
    """(the composed run config without ``hydra``, unresolved; group → chosen option) of ``train.yaml``."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    register()
    with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
        cfg = compose("train", overrides=list(overrides), return_hydra_config=True)
    choices = OmegaConf.to_container(cfg.hydra.runtime.choices)
    values = OmegaConf.to_container(cfg, resolve=False)
    values.pop("hydra")
    return values, {k: v for k, v in choices.items() if not k.startswith("hydra/")}


def compose_run_config(overrides: Sequence[str], run_dir: str | Path, config_dir: Path = CONFIGS) -> TrainConfig:
    """The ``TrainConfig`` ``python train.py <overrides>`` would run with, living in ``run_dir``
    (outside ``@hydra.main`` there is no Hydra output directory to default to)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    register()
    with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
        cfg = compose("train", overrides=[*overrides, f"run_dir={json.dumps(str(run_dir))}"])
    return OmegaConf.to_object(cfg)


def _helps() -> dict[str, str]:
    return {key: help_text for key, _, help_text in describe(TrainConfig)}


def _scalar(value: object) -> str:
    """One value as a single line of YAML (flow style for lists and dicts)."""
    text = yaml.safe_dump(value, default_flow_style=True, width=10**9, allow_unicode=True).strip()
    return text[: -len("...")].rstrip() if text.endswith("\n...") else text


def show(group: str | None = None, overrides: Sequence[str] = (), config_dir: Path = CONFIGS) -> str:
    """The composed defaults of ``configs/train.yaml`` (with ``overrides``) as YAML, each field with
    its help as a comment; the whole config, or one group (``trainer``, ``rollout``, ...).

    Raises ValueError for a group that is not one of ``GROUPS``, naming the allowed groups."""
    if group is not None and group not in GROUPS:
        raise ValueError(f"unknown config group {group!r}; choose one of {sorted(GROUPS)} (or none for everything)")
    values, choices = compose_defaults(overrides, config_dir)
    helps = _helps()
    composed = f" with {' '.join(overrides)}" if overrides else ""
    lines = [f"# configs/train.yaml composed{composed}; help from coevo/config/schema.py"]
    if choices.get("experiment"):
        lines.append(f"# experiment: configs/experiment/{choices['experiment']}.yaml")
    names = [group] if group is not None else [f.name for f in fields(TrainConfig)]
    for name in names:
        if name in GROUPS:
            option = choices.get(name)
            lines.append(_commented(f"{name}:", f"configs/{name}/{option}.yaml" if option else ""))
            for key, value in values[name].items():
                lines.append(_commented(f"  {key}: {_scalar(value)}", helps.get(f"{name}.{key}", "")))
        else:
            lines.append(_commented(f"{name}: {_scalar(values[name])}", helps.get(name, "")))
    return "\n".join(lines) + "\n"


def _commented(line: str, comment: str) -> str:
    return f"{line}  # {comment}" if comment else line


# ---------------------------------------------------------------------------------- Markdown reference
def _cell(text: str, *, code: bool = False) -> str:
    """Text safe inside a Markdown table cell: one line, ``|`` escaped (GFM honours that inside code
    spans too), and ``<`` escaped outside code so ``runs/<name>`` is not taken for HTML."""
    text = text.replace("|", "\\|").replace("\n", " ")
    return text if code else text.replace("<", "\\<")


def _schema_default(f: Field) -> object:
    if f.default is not MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not MISSING else "???"


def _option_blurb(path: Path) -> str:
    """The leading comment of an option file (what the option is for)."""
    out = []
    for line in path.read_text().splitlines():
        if not line.startswith("#") or line.startswith("# @package"):
            if out or not line.startswith("# @package"):
                break
            continue
        out.append(line.lstrip("#").strip())
    return " ".join(out)


def _options(name: str, chosen: str | None, config_dir: Path) -> list[str]:
    rows = []
    for path in sorted((config_dir / name).glob("*.yaml")):
        mark = " (default)" if path.stem == chosen else ""
        blurb = _option_blurb(path)
        rows.append(f"- `{name}={path.stem}`{mark}" + (f": {blurb}" if blurb else ""))
    return rows


def _table(schema: type, prefix: str, values: dict[str, Any]) -> list[str]:
    rows = ["| field | type | default | allowed | help |", "|---|---|---|---|---|"]
    described = []  # choices whose table says what each one is (evolution.gate: coevo.evolution.critic.GATES)
    for f in fields(schema):
        if f.name in GROUPS and schema is TrainConfig:
            continue
        value, default = values.get(f.name), _schema_default(f)
        shown = f"`{_cell(_scalar(value), code=True)}`"
        if value != default:
            shown += f" (schema: `{_cell(_scalar(default), code=True)}`)"
        rule = allowed(f)
        rows.append(f"| `{prefix}{f.name}` | `{_cell(str(f.type), code=True)}` | {shown} | "
                    f"{_cell(rule) if rule else ''} | {_cell(f.metadata.get('help', ''))} |")
        table = resolve(f.metadata["choices"]) if "choices" in f.metadata else None
        if isinstance(table, dict) and all(isinstance(v, str) for v in table.values()):
            described += [f"- `{prefix}{f.name}={name}`: {_cell(what)}" for name, what in table.items()]
    return rows + (["", *described] if described else [])


def _touched() -> list[str]:
    """docs/config.md's head: ``TOUCHED``, each field with its default in ``python train.py``."""
    intro = ("The fields the README's commands and the presets in `configs/` set; every other field below has a "
             "default that serves any run, and what no run tunes (the gates' error rates and thresholds, "
             "timeouts, retries, equivalent faster code paths) is no field at all but a named constant beside "
             "the code that uses it.")
    groups = ("and the group options: `rollout=vllm` (GPUs), `logger=wandb`, `meta_agent=openai` (with "
              "`meta_agent.url`, `meta_agent.model`), `experiment=smoke` / `retire` / `efficacy` / `ablation`.")
    return ["## Fields you should ever touch", "", intro, "", *[f"- `{key}`: {why}" for key, why in TOUCHED], "",
            groups]


def reference_markdown(config_dir: Path = CONFIGS) -> str:
    """``docs/config.md``: every field of the schema once, with its type, default and help, by group."""
    values, choices = compose_defaults((), config_dir)
    lines = [
        "# Config reference",
        "",
        ("<!-- Generated from coevo/config/schema.py and configs/ by scripts/config_reference.py; "
         "do not edit by hand. -->"),
        "",
        ("`python train.py` composes `configs/train.yaml`: the typed schema (`coevo/config/schema.py`), "
         "then one option per"),
        "group, then the `experiment` overrides. Pick an option with `group=option`, set a field with",
        "`group.field=value` (a key the schema does not have, or a value of the wrong type, is refused).",
        "**default** is the value `python train.py` runs with; where the schema's own default differs it is shown",
        "too. `coevo config show [GROUP]` prints the same values and help as YAML.",
        "",
        "Secrets never go in the config: a value that looks like an API key or token is refused before anything",
        "is written (see [run-directory.md](run-directory.md#secrets)); `meta_agent.api_key_env` holds the *name* of",
        "the environment variable with the key.",
        "",
        *_touched(),
        "",
        "## Top level",
        "",
        *_table(TrainConfig, "", values),
    ]
    for name, schema in GROUPS.items():
        lines += ["", f"## `{name}`", "", *_options(name, choices.get(name), config_dir), "",
                  *_table(schema, f"{name}.", values[name])]
    lines += ["", "## `experiment`", "", "Experiments override any group and field at once (`# @package _global_`).",
              "", *_options("experiment", choices.get("experiment"), config_dir)]
    return "\n".join(lines) + "\n"
