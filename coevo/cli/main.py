"""The ``coevo`` command line: evaluate a harness (``eval``), evolve it with the model frozen
(``evolve``: the loop of ``train.py`` in harness_only mode), release capabilities in stages
(``stream``), show the config, export traces, draw a run's report. ``coevo harness ...``
(``coevo.cli.harness``) inspects and compares harness specs."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.table import Table

from coevo.cli.harness import evolved_on, harness_app, load_harness
from coevo.cli.options import (
    ENV_HELP,
    cli_policy,
    console,
    parse_env_args,
    resolve_env,
    say_prompt_size,
    split_env_arg,
    with_sampling,
)
from coevo.config.schema import EvolutionConfig, RolloutConfig
from coevo.errors import USAGE_EXIT, RunDirError, debugging, one_line, reported_as_one_line

if TYPE_CHECKING:
    from coevo.agent.evaluate import EvalReport
    from coevo.agent.trace import Trace

app = typer.Typer(help="coevo: harness-model co-evolution for LLM agents.", no_args_is_help=True, add_completion=False)
app.add_typer(harness_app, name="harness")
config_app = typer.Typer(help="Show the composed configuration with every field's help.", no_args_is_help=True)
app.add_typer(config_app, name="config")


@app.command("eval")
def eval_cmd(
    env_name: str = typer.Option("reasoning", "--env", help=ENV_HELP),
    env_args: list[str] = typer.Option([], "--env-arg", help="constructor argument KEY=VALUE (YAML value), repeatable"),
    model: str = typer.Option("smollm2", help="smollm2 | tiny | scripted | gold | a local model directory"),
    backend: str = typer.Option("transformers", help="transformers (CPU/GPU) | vllm (GPU)"),
    device: str = typer.Option("cpu", help="torch device for the transformers backend"),
    adapter: str | None = typer.Option(None, help="PEFT adapter directory to load on the model"),
    harness: str = typer.Option("base", help="built-in harness name or YAML path"),
    split: str = typer.Option("val", help="train | val | test"),
    attempts: int = typer.Option(1, "--k", "--attempts", min=1, help="attempts per task: reports pass@1 and pass@k"),
    temperature: float | None = typer.Option(None, min=0.0, help="override the harness's sampling temperature "
                                                "(>= 0, 0 is greedy: train.py's rollout.temperature range)"),
    max_new_tokens: int | None = typer.Option(None, min=1, help="override the harness's completion budget"),
    limit: int | None = typer.Option(None, min=1, help="evaluate only the first N tasks of the split"),
    batch_size: int = typer.Option(RolloutConfig.batch_size, min=1, help="model calls per generate() batch"),
    max_steps: int = typer.Option(RolloutConfig.max_steps, min=1, help="model calls per episode at most (a "
                                  "harness step budget below it is raised to it)"),
    seed: int = typer.Option(0, help="sampling seed"),
    out: Path | None = typer.Option(None, help="output directory (default runs/eval-<env>-<time>)"),
) -> None:
    """Evaluate a harness with a policy on one split: pass@1 and pass@k, a JSON and a Markdown report."""
    from coevo.agent.evaluate import TraceLog, evaluate, write_eval
    from coevo.agent.rollouts import RolloutService
    from coevo.envs.base import SPLITS
    from coevo.loop.termination import sigterm_raises
    from coevo.report.progress import RichProgress
    from coevo.safety.secrets import start_redaction

    if split not in SPLITS:
        raise typer.BadParameter(f"split must be one of {list(SPLITS)}, got {split!r}", param_hint="--split")
    env_cls = resolve_env(env_name)
    h = with_sampling(load_harness(harness), temperature, max_new_tokens, attempts, max_steps)
    start_redaction()  # before the env: a variable it unsets after reading stays redacted from the files
    try:
        env = env_cls(**parse_env_args(env_args))
    except (TypeError, ValueError) as err:
        raise typer.BadParameter(f"{env_name}: {err}", param_hint="--env-arg") from None
    origin = evolved_on(harness)
    if origin is not None and origin != env.name:
        console.print(f"[yellow]note: harness {h.id} was evolved on env {origin!r} and is evaluated on {env.name!r}: "
                      "edits shipped for one env may hurt another[/yellow]")
    try:
        with console.status(f"loading model {model}"):
            policy = cli_policy(model, backend, device, adapter, env_name, seed, env=env)
        say_prompt_size(policy, h, env, split, max_steps)
        rollouts = RolloutService(policy, env, batch_size=batch_size, max_steps=max_steps,
                                  workers=RolloutConfig.workers, seed=seed, progress=RichProgress(console))
        out = out or Path("runs") / time.strftime(f"eval-{env.name}-%Y%m%d-%H%M%S")
        log = TraceLog(out / "traces.jsonl", tokenizer=policy.tokenizer)
        console.print(f"traces: {log.path} (appended as episodes end)", soft_wrap=True)
        def write_partial(report: EvalReport, traces: list[Trace]) -> None:
            write_eval(out, h, report, traces, tokenizer=policy.tokenizer)
            console.print(f"stopped: a partial report of {len(traces)} ended episode(s) in {out / 'report.md'}")

        with sigterm_raises():  # a SIGTERM (a scheduler, `timeout`, `kill`) stops it as Ctrl-C does
            report, traces = evaluate(h, rollouts, split, attempts=attempts, limit=limit, on_trace=log.append,
                                      on_partial=write_partial)
    finally:
        env.close()
    write_eval(out, h, report, traces, tokenizer=policy.tokenizer)
    table = Table(title=f"{env_name} / {split} — harness {h.name} ({h.id}), policy {report.model_version}")
    columns = {"tasks": str(report.n_tasks), "attempts": str(attempts), "pass@1": f"{report.pass_at_1:.3f}"}
    if attempts > 1:
        columns[f"pass@{attempts}"] = f"{report.pass_at_k:.3f}"
    columns |= {"mean reward": f"{report.mean_reward:.3f}", "errors": str(report.errors),
                "tokens": str(report.completion_tokens), "seconds": f"{report.seconds:.1f}"}
    for col in columns:
        table.add_column(col)
    table.add_row(*columns.values())
    console.print(table)
    console.print(f"report: {out / 'report.md'}  (traces: {out / 'traces.jsonl'})")


@app.command("evolve")
def evolve_cmd(
    env_name: str | None = typer.Option(None, "--env", help=ENV_HELP + "; default: the config's (env=...)"),
    env_args: list[str] = typer.Option([], "--env-arg", help="constructor argument KEY=VALUE (YAML value), repeatable"),
    model: str | None = typer.Option(None, help="smollm2 | tiny | scripted | gold | a local model directory"),
    backend: str | None = typer.Option(None, help="transformers (CPU/GPU) | vllm (GPU)"),
    device: str | None = typer.Option(None, help="torch device (auto: cuda when available)"),
    harness: str | None = typer.Option(None, help="starting harness: built-in name or YAML path"),
    meta: str | None = typer.Option(None, help="meta-agent backend: rule | openai | hf, or package.module:factory"),
    meta_url: str | None = typer.Option(None, help="openai backend: base URL of the endpoint"),
    meta_model: str | None = typer.Option(None, help="openai: model name; hf: model name or path"),
    rounds: int | None = typer.Option(None, min=1, help="evolution rounds (one train batch each)"),
    batch_tasks: int | None = typer.Option(None, min=1, help="train tasks per round"),
    attempts: int | None = typer.Option(None, "--k", "--attempts", min=1,
                                           help="attempts per task in rollouts, the Critic and evaluation (pass@k)"),
    temperature: float | None = typer.Option(None, help="sampling temperature set on the harness"),
    gate: str | None = typer.Option(None, help="stat (paired re-runs, sequential test; undecided edits are judged "
                                       "again) | seesaw | performance | both"),
    max_variants: int | None = typer.Option(None, min=1, help="harness variants K"),
    max_proposals: int | None = typer.Option(None, min=1, help="proposals judged per variant per round"),
    val_limit: int | None = typer.Option(None, min=1, help="validation tasks for the start/end comparison"),
    test_limit: int | None = typer.Option(None, min=0, help="test tasks for the start/end comparison (0: skip; "
                                             "default: all)"),
    max_steps: int | None = typer.Option(None, min=1, help="model calls per episode at most"),
    max_new_tokens: int | None = typer.Option(None, min=1, help="completion budget per model call"),
    batch_size: int | None = typer.Option(None, min=1, help="model calls per generate() batch"),
    seed: int | None = typer.Option(None, help="sampling seed and task order"),
    overrides: list[str] = typer.Option([], "--override", "-o", help="any other config override, e.g. "
                                        "evolution.stat_budget=32 (coevo config show lists them)"),
    out: Path | None = typer.Option(None, help="run directory (default runs/evolve-<env>-<time>); started "
                                       "again on it, the run resumes"),
) -> None:
    """Evolve the harness with AEGIS, the model frozen: the co-evolution loop of ``train.py`` in
    ``mode=harness_only``, composed from configs/train.yaml with these options as overrides (an
    option left out keeps the config's value). Then the starting and the evolved harness compared by
    pass@1 and pass@k on validation and test. The run directory is a train.py run directory
    (rounds.jsonl, lineage, harness-<variant>.yaml, report/) plus summary.json and summary.md."""
    import json

    from coevo.config.show import CONFIGS, compose_run_config
    from coevo.loop.build import run
    from coevo.report.data import load_run
    from coevo.report.evolve_summary import evolve_markdown, evolve_summary

    options = {"model.name": model, "rollout.backend": backend, "model.device": device, "harness.start": harness,
               "meta_agent.backend": meta, "meta_agent.url": meta_url, "meta_agent.model": meta_model,
               "rounds": rounds, "batch_tasks": batch_tasks, "rollout.attempts": attempts,
               "evolution.critic_attempts": attempts, "eval_attempts": attempts, "rollout.temperature": temperature,
               "evolution.gate": gate, "evolution.max_variants": max_variants,
               "evolution.max_proposals": max_proposals, "val_limit": val_limit, "rollout.max_steps": max_steps,
               "rollout.max_new_tokens": max_new_tokens, "rollout.batch_size": batch_size, "seed": seed}
    # harness evolution in every round, compared on 6 validation tasks and the whole test split, at the
    # completion budget coevo evolve has always had: the main job's schedule (AEGIS in round 0 only),
    # its 64-token budget and its 50-task test comparison are not this command's defaults
    cli = ["mode=harness_only", "evolution.early_rounds=0", "evolution.every=1", "rollout.max_new_tokens=96",
           "val_limit=6", "test_limit=null", "test=" + ("false" if test_limit == 0 else "true")]
    if test_limit:
        cli.append(f"test_limit={test_limit}")
    if env_name is not None:  # a built-in env's config file brings its arguments; an import path starts with none
        cli += ([f"env={env_name}"] if (CONFIGS / "env" / f"{env_name}.yaml").is_file()
                else ["~env", f"env.name={json.dumps(env_name)}"])
    cli += [f"{key}={json.dumps(value)}" for key, value in options.items() if value is not None]
    cli += [f"++env.args.{key}={value}" for key, value in map(split_env_arg, env_args)]
    out = out or Path("runs") / time.strftime(f"evolve-{(env_name or 'config').rsplit(':', 1)[-1]}-%Y%m%d-%H%M%S")
    try:
        cfg = compose_run_config([*cli, *overrides], out)
    except Exception as err:  # noqa: BLE001 - Hydra's override and composition errors name the key
        raise typer.BadParameter(str(err), param_hint="--override") from None
    k, repeats = cfg.eval_attempts, max(cfg.rollout.attempts, cfg.eval_attempts, cfg.evolution.critic_attempts)
    if repeats > 1 and cfg.rollout.temperature == 0:
        console.print(f"[yellow]note: greedy decoding makes the {repeats} attempts of a task identical; pass "
                      "--temperature[/yellow]")
    try:
        run_dir = run(cfg)
    except ValueError as err:  # a config value no component accepts: the message names the field
        raise typer.BadParameter(str(err)) from None
    finished = load_run(run_dir)
    summary = evolve_summary(finished, finished.start, k, cfg.env.name)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    (run_dir / "summary.md").write_text(evolve_markdown(summary))
    for name, row in summary["splits"].items():
        at_k = f"   pass@{k} {row[f'pass@{k}'][0]:.3f} -> {row[f'pass@{k}'][1]:.3f}" if k > 1 else ""
        console.print(f"{name} pass@1 {row['pass@1'][0]:.3f} -> {row['pass@1'][1]:.3f}{at_k}   ({row['tasks']} tasks)")
    console.print(f"edits: {len(summary['shipped'])} shipped, {len(summary['rejected'])} rejected, "
                  f"{len(summary['undecided'])} undecided   ({run_dir / 'summary.md'})")


@app.command("stream")
def stream_cmd(
    env_name: str = typer.Option("reasoning", "--env", help="environment whose tasks carry capability annotations: "
                                 "a built-in name or package.module:ClassName"),
    env_args: list[str] = typer.Option([], "--env-arg", help="constructor argument KEY=VALUE (YAML value), repeatable"),
    axis: str = typer.Option("tools", help="tools | skills | agents (capabilities released stage by stage; agents: "
                             "specialists of a lead agent, by the env's tool_owners map)"),
    stages: int = typer.Option(3, min=1, help="stages S (clipped to the number of capabilities on the axis)"),
    protocols: list[str] = typer.Option(["deployment", "self_evolving"], "--protocol",
                                        help="deployment | self_evolving, repeatable"),
    model: str = typer.Option("smollm2", help="smollm2 | tiny | scripted | gold | a local model directory"),
    backend: str = typer.Option("transformers", help="transformers (CPU/GPU) | vllm (GPU)"),
    device: str = typer.Option("cpu", help="torch device for the transformers backend"),
    harness: str = typer.Option("base", help="starting harness: built-in name or YAML path"),
    temperature: float | None = typer.Option(None, min=0.0, help="override the harness's sampling temperature"),
    max_new_tokens: int | None = typer.Option(None, min=1, help="override the harness's completion budget"),
    rounds_per_stage: int = typer.Option(1, min=0, help="self-evolving: AEGIS rounds on each stage's adaptation split"),
    attempts: int = typer.Option(1, "--k", "--attempts", min=1, help="episodes per task (pass@1 is their mean)"),
    adapt_limit: int = typer.Option(8, min=1, help="adaptation tasks per cohort"),
    eval_limit: int = typer.Option(16, min=1, help="evaluation tasks per cohort"),
    max_steps: int = typer.Option(RolloutConfig.max_steps, min=1, help="model calls per episode at most (a "
                                  "harness step budget below it is raised to it)"),
    batch_size: int = typer.Option(RolloutConfig.batch_size, min=1, help="model calls per generate() batch"),
    seed: int = typer.Option(0, help="sampling seed and task sample"),
    out: Path | None = typer.Option(None, help="output directory (default runs/stream-<env>-<axis>-<time>)"),
) -> None:
    """Release an env's capabilities along an axis in stages and evaluate retention and adaptation
    under the deployment and self-evolving protocols: the pass matrix, FWT/BWT, tokens and a figure."""
    from coevo.safety.secrets import start_redaction
    from coevo.streams import PROTOCOLS, run_stream
    from coevo.streams.axes import get_axis, tool_owners
    from coevo.streams.config import StreamConfig

    env_cls = resolve_env(env_name)
    try:
        get_axis(axis)
    except ValueError as err:  # an unknown axis: said before the model loads
        raise typer.BadParameter(str(err), param_hint="--axis") from None
    bad = [p for p in protocols if p not in PROTOCOLS]
    if bad:
        raise typer.BadParameter(f"protocol must be one of {list(PROTOCOLS)}, got {bad}", param_hint="--protocol")
    try:
        config = StreamConfig(axis=axis, stages=stages, protocols=tuple(protocols), rounds_per_stage=rounds_per_stage,
                              adapt_limit=adapt_limit, eval_limit=eval_limit, seed=seed,
                              rollout=RolloutConfig(attempts=attempts, max_steps=max_steps, batch_size=batch_size),
                              evolution=EvolutionConfig(gate="seesaw", critic_attempts=attempts))
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None
    start = with_sampling(load_harness(harness), temperature, max_new_tokens, attempts, max_steps)
    start_redaction()  # before the env: a variable it unsets after reading stays redacted from the files
    env = env_cls(**parse_env_args(env_args))
    if axis == "agents":
        try:
            tool_owners(env)
        except ValueError as err:  # no ownership map: said before the model loads
            raise typer.BadParameter(str(err), param_hint="--axis") from None
    out = out or Path("runs") / time.strftime(f"stream-{env.name}-{axis}-%Y%m%d-%H%M%S")
    try:
        with console.status(f"loading model {model}"):
            policy = cli_policy(model, backend, device, None, env_name, seed, env=env, delegate=axis == "agents")
        say_prompt_size(policy, start, env, "train", max_steps)
        try:
            result = run_stream(env, policy, out, config, base=start)
        except ValueError as err:  # a stream that cannot be built from this env's annotations
            raise typer.BadParameter(str(err)) from None
    finally:
        env.close()
    console.print(f"stream: {result.out_dir / 'metrics.json'}  figure: {result.out_dir / 'stream.png'}")


@config_app.command("show")
def config_show_cmd(
    group: str | None = typer.Argument(None, help="one config group (trainer, rollout, ...); all when omitted"),
    overrides: list[str] = typer.Option([], "--override", "-o", help="a Hydra override, e.g. experiment=smoke"),
) -> None:
    """The composed defaults of configs/train.yaml as YAML, each field with its help."""
    from coevo.config.show import show

    try:
        text = show(group, overrides)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="GROUP") from None
    typer.echo(text)


@app.command("export")
def export_cmd(
    run_dir: Path = typer.Argument(..., help="a run directory written by train.py"),
    fmt: str = typer.Option("jsonl", "--format",
                            help="sft (chat messages) | grpo (token ids, masks, advantages) | jsonl"),
    out: Path | None = typer.Option(None, help="output file (default RUN_DIR/export-<format>.jsonl)"),
    rounds: list[int] = typer.Option([], "--round", help="keep traces of this round, repeatable"),
    harness_ids: list[str] = typer.Option([], "--harness", help="keep traces of this harness id, repeatable"),
    min_reward: float | None = typer.Option(None, help="keep traces with reward >= this"),
    max_reward: float | None = typer.Option(None, help="keep traces with reward <= this"),
    passed: bool | None = typer.Option(None, "--passed/--failed", help="keep only passing (or failing) traces"),
    partial: bool = typer.Option(False, help="export what is intact when the buffer lost traces its checkpoint counts"),
) -> None:
    """Write a run's buffered traces in a format TRL's trainers and SFT tooling read."""
    from coevo.report.export import export

    out = out or run_dir / f"export-{fmt}.jsonl"
    try:
        n = export(run_dir, out, fmt, rounds=rounds or None, harness_ids=harness_ids or None,
                   min_reward=min_reward, max_reward=max_reward, passed=passed, partial=partial)
    except RunDirError as err:
        damaged(err)
    except (ValueError, FileNotFoundError) as err:
        raise typer.BadParameter(str(err)) from None
    console.print(f"exported {n} records to {out}")


@app.command("report")
def report_cmd(
    run_dir: Path = typer.Argument(..., help="a run directory written by train.py"),
    out: Path | None = typer.Option(None, help="where to write (default RUN_DIR/report)"),
) -> None:
    """Figures (pass rate per round, lineage tree, per-task matrix, time breakdown) and summary.md."""
    from coevo.report.data import damage
    from coevo.report.summary import write_report

    try:
        path = write_report(run_dir, out)
    except RunDirError as err:
        damaged(err)
    except (ValueError, FileNotFoundError) as err:
        raise typer.BadParameter(str(err), param_hint="RUN_DIR") from None
    console.print(f"report: {path / 'summary.md'}")
    problems = damage(run_dir)  # the report reads the records; what else the run keeps may be damaged
    for problem in problems:
        typer.echo(f"error: {problem}", err=True)
    if problems:
        raise typer.Exit(1)


def damaged(err: Exception) -> None:
    """A run file that changed after it was committed: the message (file, recovery) on stderr, exit 1
    (not a usage error: the command was right, the run directory is not)."""
    typer.echo(f"error: {err}", err=True)
    raise typer.Exit(1)


@app.callback()
def options(debug: bool = typer.Option(False, "--debug", help="show the stack trace of an error instead of its "
                                      "one-line message (the same as HYDRA_FULL_ERROR=1)")) -> None:
    if debug:
        os.environ["HYDRA_FULL_ERROR"] = "1"


def main(argv: list[str] | None = None) -> None:
    """Run the command line. An error the user can fix (a bad option or config value, a missing
    dependency, an unreadable run directory) is one line, ``error: ...``, on stderr with exit
    status 2 (1 for a run directory that cannot be used as it is), never a stack trace or a help
    panel; ``--debug`` shows the trace. Without arguments: the help."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        app(["--help"], prog_name="coevo")
        return
    with reported_as_one_line():
        try:
            status = app(argv, prog_name="coevo", standalone_mode=False)
        except typer.TyperException as err:  # option parsing and typer.BadParameter (click's exceptions)
            if debugging():
                raise
            command = getattr(getattr(err, "ctx", None), "command_path", "coevo")
            message = err.format_message() if hasattr(err, "format_message") else str(err)
            print(f"{one_line(message)} (see {command} --help)", file=sys.stderr, flush=True)
            raise SystemExit(getattr(err, "exit_code", USAGE_EXIT)) from None
        except typer.Abort:
            raise SystemExit(130) from None
    if isinstance(status, int) and status:  # typer.Exit(code) returns its code without standalone mode
        raise SystemExit(status)


if __name__ == "__main__":
    main()
