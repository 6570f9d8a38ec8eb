"""The ``coevo`` command line: evaluate a harness, and inspect or compare harness specs."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from coevo.harness import PROCESSORS, Harness, format_diff
from coevo.harness.defaults import BUILTIN_HARNESSES
from coevo.harness.hooks import HOOK_ORDER, Dimension

app = typer.Typer(help="coevo: harness-model co-evolution for LLM agents.", no_args_is_help=True, add_completion=False)
harness_app = typer.Typer(help="Inspect and compare harness specs.", no_args_is_help=True)
app.add_typer(harness_app, name="harness")
console = Console()


def load_harness(spec: str) -> Harness:
    """A built-in harness name (e.g. ``base``) or the path of a harness YAML file."""
    if spec in BUILTIN_HARNESSES:
        return BUILTIN_HARNESSES[spec]()
    path = Path(spec)
    if not path.is_file():
        raise typer.BadParameter(f"{spec!r} is neither a built-in harness {sorted(BUILTIN_HARNESSES)} nor a file")
    return Harness.load(path)


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
def harness_diff(a: str, b: str) -> None:
    """Print what changed from harness A to harness B (processors, parameters, prompts)."""
    console.print(format_diff(load_harness(a), load_harness(b)), markup=False, highlight=False)


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


@app.command("eval")
def eval_cmd(
    env_name: str = typer.Option("arithmetic", "--env", help="environment name"),
    harness: str = typer.Option("base", help="built-in harness name or YAML path"),
    split: str = typer.Option("test", help="train | val | test"),
    policy: str = typer.Option("scripted", help="scripted: the env's scripted solver (a demo policy)"),
    attempts: int = typer.Option(1, min=1, help="attempts per task (pass@k uses all of them)"),
    limit: Optional[int] = typer.Option(None, min=1, help="evaluate only the first N tasks"),
    out: Optional[Path] = typer.Option(None, help="output directory (default runs/eval-<time>)"),
) -> None:
    """Evaluate a harness with a policy on one split; write traces and a summary."""
    from coevo.agent.policy import ScriptedPolicy
    from coevo.envs import ENVS
    from coevo.envs.arithmetic import calculator_solver
    from coevo.evaluate import evaluate, write_eval

    if env_name not in ENVS:
        raise typer.BadParameter(f"unknown env {env_name!r}; choose one of {sorted(ENVS)}", param_hint="--env")
    policies = {"scripted": lambda: ScriptedPolicy(calculator_solver, model_version="scripted-calculator")}
    if policy not in policies:
        raise typer.BadParameter(f"unknown policy {policy!r}; choose one of {sorted(policies)}", param_hint="--policy")
    h = load_harness(harness)
    env = ENVS[env_name]()
    n = len(env.tasks(split)[:limit]) * attempts
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console) as progress:
        bar = progress.add_task(f"{env_name}/{split}", total=n)
        report, traces = evaluate(h, policies[policy](), env, split, attempts=attempts, limit=limit,
                                  on_trace=lambda _t: progress.advance(bar))
    out = out or Path("runs") / time.strftime("eval-%Y%m%d-%H%M%S")
    write_eval(out, h, report, traces)
    table = Table(title=f"{env_name} / {split} — harness {h.name} ({h.id}), policy {report.model_version}")
    columns = {"tasks": str(report.n_tasks), "attempts": str(attempts), "pass@1": f"{report.pass_at_1:.3f}"}
    if attempts > 1:
        columns[f"pass@{attempts}"] = f"{report.pass_at_k:.3f}"
    columns |= {"mean reward": f"{report.mean_reward:.3f}", "errors": str(report.errors), "seconds": f"{report.seconds:.1f}"}
    for col in columns:
        table.add_column(col)
    table.add_row(*columns.values())
    console.print(table)
    console.print(f"traces and summary written to {out}")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
