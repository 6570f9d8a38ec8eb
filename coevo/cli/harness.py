"""``coevo harness ...``: inspect and compare harness specs (show, diff, id, the processor kinds), and
write a harness file with parameters changed (set)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from coevo.harness import PROCESSORS, Harness, format_diff
from coevo.harness.defaults import BUILTIN_HARNESSES
from coevo.harness.errors import CompositionError
from coevo.harness.hooks import HOOK_ORDER, Dimension

harness_app = typer.Typer(help="Inspect and compare harness specs.", no_args_is_help=True)
console = Console()


def load_harness(spec: str) -> Harness:
    """A built-in harness name (e.g. ``base``) or the path of a harness YAML file."""
    if spec in BUILTIN_HARNESSES:
        return BUILTIN_HARNESSES[spec]()
    path = Path(spec)
    if not path.is_file():
        raise typer.BadParameter(f"{spec!r} is neither a built-in harness {sorted(BUILTIN_HARNESSES)} nor a file")
    return Harness.load(path)


def evolved_on(spec: str) -> str | None:
    """The env a run noted in a harness YAML file (``evolved_on``, written by the loop), or None."""
    import yaml

    path = Path(spec)
    if spec in BUILTIN_HARNESSES or not path.is_file():
        return None
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError):
        return None
    origin = data.get("evolved_on") if isinstance(data, dict) else None
    return str(origin) if origin is not None else None


@harness_app.command("show")
def harness_show(spec: str = typer.Argument(..., help="harness YAML path or built-in name")) -> None:
    """Print a harness: its processors by dimension and by hook."""
    h = load_harness(spec)
    console.print(f"[bold]{h.name}[/bold]  id={h.id}  parent={h.parent_id or '-'}")
    if h.edit:
        console.print(f"made by: {h.edit.describe()}")
    by_dim = Table(title="by dimension")
    by_dim.add_column("dimension")
    by_dim.add_column("processors")
    for dim in Dimension:
        names = [f"{p.name} ({p.kind})" if p.name != p.kind else p.name for p in h if p.dimension is dim]
        by_dim.add_row(dim.value, ", ".join(names) or "-")
    console.print(by_dim)
    by_hook = Table(title="by hook (firing order)")
    for col in ("hook", "#", "processor", "dimension", "consumes -> produces", "params"):
        by_hook.add_column(col)
    for hook in HOOK_ORDER:
        for i, p in enumerate(h.at(hook)):
            params = ", ".join(f"{k}={_short(v)}" for k, v in p.config.items())
            by_hook.add_row(hook.value, str(i), p.name, p.dimension.value,
                            f"{p.consumes.__name__} -> {p.produces.__name__}", params)
    console.print(by_hook)


@harness_app.command("diff")
def harness_diff(
    a: str = typer.Argument(..., help="harness YAML path or built-in name"),
    b: str = typer.Argument(..., help="harness YAML path or built-in name"),
    ignore_sampling: bool = typer.Option(
        False, "--ignore-sampling",
        help="leave the 'sampling' processor's parameters out: a run writes its rollout settings "
             "(temperature, max_new_tokens) into its harness, so a run's harness against 'base' "
             "otherwise shows them as changes no edit made",
    ),
) -> None:
    """Print what changed from harness A to harness B (processors, parameters, prompts).

    A run's harnesses carry the run's sampling settings (rollout.temperature and
    rollout.max_new_tokens are written into the 'sampling' processor); --ignore-sampling compares
    everything else."""
    ignored = ("sampling",) if ignore_sampling else ()
    text = format_diff(load_harness(a), load_harness(b), ignore_params_of=ignored)
    console.print(text, markup=False, highlight=False)


@harness_app.command("set")
def harness_set(
    spec: str = typer.Argument(..., help="harness YAML path or built-in name"),
    assignments: list[str] = typer.Argument(None, help="PROCESSOR.PARAM=VALUE, the value read as YAML "
                                            "(e.g. sampling.max_new_tokens=256, few_shot.demos='[]')"),
    out: Path = typer.Option(..., "--out", help="the harness YAML file to write"),
    compact_tools: bool = typer.Option(False, "--compact-tools", help="list the tools in tool_schema_hint's template "
                                       "by {tools_compact} (one short line a tool) instead of {tools} (their schemas)"),
) -> None:
    """Write a harness file: SPEC with each PROCESSOR.PARAM set to VALUE (a set_param edit each, so
    the file's lineage says what changed), checked as any harness is."""
    import yaml

    h = load_harness(spec)
    changes: list[tuple[str, str, object]] = []
    for item in assignments or []:
        key, sep, text = item.partition("=")
        name, dot, param = key.partition(".")
        if not sep or not dot or not name or not param:
            raise typer.BadParameter(f"{item!r}: write PROCESSOR.PARAM=VALUE, e.g. sampling.max_new_tokens=256")
        try:
            changes.append((name, param, yaml.safe_load(text)))
        except yaml.YAMLError as err:
            raise typer.BadParameter(f"{item!r}: the value is not YAML ({err})") from None
    if compact_tools:
        if "tool_schema_hint" not in h:
            raise typer.BadParameter(f"--compact-tools: {spec} has no tool_schema_hint processor to list tools")
        template = h.get("tool_schema_hint").config["template"]
        if "{tools}" not in template:
            raise typer.BadParameter("--compact-tools: tool_schema_hint's template has no {tools} to replace")
        changes.append(("tool_schema_hint", "template", template.replace("{tools}", "{tools_compact}")))
    if not changes:
        raise typer.BadParameter("nothing to set: give PROCESSOR.PARAM=VALUE or --compact-tools")
    for name, param, value in changes:
        try:
            h = h.set_param(name, param, value)
        except (CompositionError, KeyError, TypeError, ValueError) as err:
            raise typer.BadParameter(f"{name}.{param}={value!r}: {err}") from None
    h.save(out)
    print(f"wrote {out} (harness {h.id}; {len(changes)} parameter(s) set on {spec})")


@harness_app.command("id")
def harness_id(spec: str) -> None:
    """Print the content-hash id of a harness."""
    print(load_harness(spec).id)


@harness_app.command("processors")
def harness_processors() -> None:
    """List the processor kinds a spec may use, with hook, dimension and description."""
    table = Table()
    for col in ("kind", "hook", "dimension", "description"):
        table.add_column(col)
    for kind, cls in sorted(PROCESSORS.items(), key=lambda kv: (kv[1].__dict__.get("hook", ""), kv[0])):
        hook = getattr(cls, "hook", None)  # CodeProcessor sets both per instance, from its source
        dim = getattr(cls, "dimension", None)
        table.add_row(kind, hook.value if hook else "(declared by code)", dim.value if dim else "-", cls.description)
    console.print(table)


def _short(value: object, width: int = 40) -> str:
    text = repr(value).replace("\n", "⏎")
    return text if len(text) <= width else text[: width - 1] + "…"
