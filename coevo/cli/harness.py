"""``coevo harness ...``: inspect and compare harness specs (show, diff, id, the processor kinds)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from coevo.harness import PROCESSORS, Harness, format_diff
from coevo.harness.defaults import BUILTIN_HARNESSES
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
        hook = getattr(cls, "hook", None)
        dim = getattr(cls, "dimension", None)
        table.add_row(kind, hook.value if hook else "(declared by code)", dim.value if dim else "-", cls.description)
    console.print(table)


def _short(value: object, width: int = 40) -> str:
    text = repr(value).replace("\n", "⏎")
    return text if len(text) <= width else text[: width - 1] + "…"
