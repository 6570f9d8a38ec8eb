"""The ``coevo`` command line: evaluate a harness, and inspect or compare harness specs."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from coevo.config import EvolutionConfig, RolloutConfig
from coevo.harness import PROCESSORS, Harness, format_diff
from coevo.harness.defaults import BUILTIN_HARNESSES
from coevo.harness.hooks import HOOK_ORDER, Dimension

app = typer.Typer(help="coevo: harness-model co-evolution for LLM agents.", no_args_is_help=True, add_completion=False)
harness_app = typer.Typer(help="Inspect and compare harness specs.", no_args_is_help=True)
app.add_typer(harness_app, name="harness")
config_app = typer.Typer(help="Show the composed configuration with every field's help.", no_args_is_help=True)
app.add_typer(config_app, name="config")
console = Console()
ENV_HELP = ("environment: reasoning | textworld_express | arithmetic, or the import path package.module:ClassName "
            "of your own (docs/environments.md)")


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


def with_sampling(h: Harness, temperature: float | None, max_new_tokens: int | None, attempts: int) -> Harness:
    """``h`` with the sampling overrides of ``--temperature``/``--max-new-tokens``, and a note when
    greedy decoding would make the ``attempts`` of a task identical (pass@k would be pass@1)."""
    overrides = {"temperature": temperature, "max_new_tokens": max_new_tokens}
    for param, value in overrides.items():
        if value is None:
            continue
        if "sampling" not in h:
            raise typer.BadParameter("the harness has no 'sampling' processor to set",
                                     param_hint=f"--{param.replace('_', '-')}")
        h = h.set_param("sampling", param, value)
    if attempts > 1 and "sampling" in h and h.get("sampling").config["temperature"] == 0:
        console.print(f"[yellow]note: greedy decoding makes the {attempts} attempts identical; pass --temperature[/yellow]")
    return h


def parse_env_args(pairs: list[str]) -> dict[str, object]:
    """``["n_per_dataset=10", "games=[coin]"]`` -> keyword arguments (values parsed as YAML)."""
    import yaml

    kwargs: dict[str, object] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.isidentifier():
            raise typer.BadParameter(f"expected KEY=VALUE, got {pair!r}", param_hint="--env-arg")
        kwargs[key] = yaml.safe_load(value)
    return kwargs


def resolve_env(name: str):
    """The env class for ``--env``: a built-in name or ``package.module:ClassName``."""
    from coevo.envs.load import env_class

    try:
        return env_class(name)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--env") from None


def build_policy(model: str, backend: str, device: str, adapter: str | None, env_name: str, seed: int):
    """The policy for ``coevo eval``: ``scripted`` (the env's scripted solver), or a model name
    or path served by transformers or vLLM."""
    from coevo.agent.policy import ScriptedPolicy
    from coevo.envs.load import scripted_solver

    if model == "scripted":
        solver = scripted_solver(env_name)
        if solver is None:
            raise typer.BadParameter(f"env {env_name!r} has no scripted solver; use a model", param_hint="--model")
        return ScriptedPolicy(solver, model_version=f"scripted-{env_name}")
    if backend == "transformers":
        from coevo.policy.load import transformers_policy

        return transformers_policy(model, device=device, adapter=adapter, seed=seed)
    if backend == "vllm":
        from coevo.policy.smollm2 import converted_dir
        from coevo.policy.vllm import ColocatedEngine, VLLMPolicy

        from transformers import AutoTokenizer

        path = str(converted_dir()) if model == "smollm2" else model
        if not Path(path).is_dir():
            raise typer.BadParameter("vllm serves smollm2 or a local model directory", param_hint="--model")
        return VLLMPolicy(ColocatedEngine(path, seed=seed), AutoTokenizer.from_pretrained(path),
                          model_version=Path(path).name)
    raise typer.BadParameter(f"backend must be transformers or vllm, got {backend!r}", param_hint="--backend")


@app.command("eval")
def eval_cmd(
    env_name: str = typer.Option("reasoning", "--env", help=ENV_HELP),
    env_args: list[str] = typer.Option([], "--env-arg", help="constructor argument KEY=VALUE (YAML value), repeatable"),
    model: str = typer.Option("smollm2", help="smollm2 | tiny | scripted | a local model directory"),
    backend: str = typer.Option("transformers", help="transformers (CPU/GPU) | vllm (GPU)"),
    device: str = typer.Option("cpu", help="torch device for the transformers backend"),
    adapter: Optional[str] = typer.Option(None, help="PEFT adapter directory to load on the model"),
    harness: str = typer.Option("base", help="built-in harness name or YAML path"),
    split: str = typer.Option("val", help="train | val | test"),
    attempts: int = typer.Option(1, "--k", "--attempts", min=1, help="attempts per task: reports pass@1 and pass@k"),
    temperature: Optional[float] = typer.Option(None, help="override the harness's sampling temperature"),
    limit: Optional[int] = typer.Option(None, min=1, help="evaluate only the first N tasks of the split"),
    batch_size: int = typer.Option(RolloutConfig.batch_size, min=1, help="model calls per generate() batch"),
    seed: int = typer.Option(0, help="sampling seed"),
    out: Optional[Path] = typer.Option(None, help="output directory (default runs/eval-<env>-<time>)"),
) -> None:
    """Evaluate a harness with a policy on one split: pass@1 and pass@k, a JSON and a Markdown report."""
    from coevo.envs.base import SPLITS
    from coevo.evaluate import evaluate, write_eval

    if split not in SPLITS:
        raise typer.BadParameter(f"split must be one of {list(SPLITS)}, got {split!r}", param_hint="--split")
    env_cls = resolve_env(env_name)
    h = with_sampling(load_harness(harness), temperature, None, attempts)
    try:
        env = env_cls(**parse_env_args(env_args))
    except (TypeError, ValueError) as err:
        raise typer.BadParameter(f"{env_name}: {err}", param_hint="--env-arg") from None
    try:
        n = len(env.tasks(split)[:limit]) * attempts
        with console.status(f"loading model {model}"):
            policy = build_policy(model, backend, device, adapter, env_name, seed)
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console) as progress:
            bar = progress.add_task(f"{env_name}/{split} episodes", total=n)
            report, traces = evaluate(h, policy, env, split, attempts=attempts, limit=limit, batch_size=batch_size,
                                      on_trace=lambda _t: progress.advance(bar))
    finally:
        close = getattr(env, "close", None)
        if close is not None:
            close()
    out = out or Path("runs") / time.strftime(f"eval-{env.name}-%Y%m%d-%H%M%S")
    write_eval(out, h, report, traces)
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
    env_name: str = typer.Option("reasoning", "--env", help=ENV_HELP),
    env_args: list[str] = typer.Option([], "--env-arg", help="constructor argument KEY=VALUE (YAML value), repeatable"),
    model: str = typer.Option("smollm2", help="smollm2 | tiny | scripted | a local model directory"),
    backend: str = typer.Option("transformers", help="transformers (CPU/GPU) | vllm (GPU)"),
    device: str = typer.Option("cpu", help="torch device for the transformers backend"),
    harness: str = typer.Option("base", help="starting harness: built-in name or YAML path"),
    meta: str = typer.Option("rule", help="meta-agent backend: rule | openai | hf, or package.module:factory"),
    meta_url: Optional[str] = typer.Option(None, help="openai backend: base URL of the endpoint"),
    meta_model: Optional[str] = typer.Option(None, help="openai: model name; hf: model name or path"),
    rounds: int = typer.Option(3, min=1, help="evolution rounds (one train batch each)"),
    batch_tasks: int = typer.Option(8, min=1, help="train tasks per round"),
    attempts: int = typer.Option(2, "--k", "--attempts", min=1, help="attempts per task (pass@k in the gates)"),
    temperature: Optional[float] = typer.Option(None, help="override the harness's sampling temperature"),
    gate: str = typer.Option("stat", help="stat (paired re-runs, sequential test; undecided edits are judged again) "
                             "| seesaw | performance | both"),
    max_variants: int = typer.Option(EvolutionConfig.max_variants, min=1, help="harness variants K"),
    max_proposals: int = typer.Option(EvolutionConfig.max_proposals, min=1,
                                      help="proposals judged per variant per round"),
    val_limit: Optional[int] = typer.Option(None, min=1, help="validation tasks for the before/after comparison"),
    test_limit: Optional[int] = typer.Option(None, min=0, help="test tasks for the before/after comparison (0: skip)"),
    max_steps: int = typer.Option(32, min=1, help="model calls per episode at most"),
    max_new_tokens: Optional[int] = typer.Option(None, min=1, help="override the harness's completion budget"),
    batch_size: int = typer.Option(RolloutConfig.batch_size, min=1, help="model calls per generate() batch"),
    seed: int = typer.Option(0, help="sampling seed"),
    out: Optional[Path] = typer.Option(None, help="output directory (default runs/evolve-<env>-<time>)"),
) -> None:
    """Evolve the harness with AEGIS on the train split (no weight updates), then compare the
    starting and evolved harnesses by pass@1 and pass@k (k = --k) on validation and test.
    Writes rounds.jsonl, the harnesses, summary.json and summary.md (every edit with its verdict)."""
    import json

    from coevo.evolution.critic import GATES, Critic
    from coevo.evolution.driver import batches, rollout_fn, routed_outcomes, run_round, session_tools
    from coevo.evolution.engine import AEGIS
    from coevo.evolution.reference import ReferenceStore, build_references
    from coevo.meta import BACKENDS, make_meta_agent, meta_agent_factory

    env_cls = resolve_env(env_name)
    if gate not in GATES:
        raise typer.BadParameter(f"gate must be one of {list(GATES)}, got {gate!r}", param_hint="--gate")
    if meta not in BACKENDS:
        if ":" not in meta:
            raise typer.BadParameter(f"meta must be one of {sorted(BACKENDS)} or package.module:factory, got {meta!r}",
                                     param_hint="--meta")
        try:
            meta_agent_factory(meta)
        except ValueError as err:
            raise typer.BadParameter(str(err), param_hint="--meta") from None
    if meta == "openai" and not (meta_url and meta_model):
        raise typer.BadParameter("the openai backend needs --meta-url and --meta-model", param_hint="--meta")
    start = with_sampling(load_harness(harness), temperature, max_new_tokens, attempts)
    env = env_cls(**parse_env_args(env_args))
    out = out or Path("runs") / time.strftime(f"evolve-{env.name}-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    try:
        with console.status(f"loading model {model}"):
            policy = build_policy(model, backend, device, None, env_name, seed)
        train = env.tasks("train")
        plan = batches(train, batch_tasks)[:rounds]
        used = {t.task_id for b in plan for t in b}
        refs = build_references(env, [t for t in train if t.task_id not in used], ReferenceStore(out / "references"))
        agent = make_meta_agent(meta, url=meta_url, model=meta_model, cache_dir=out / "meta_cache")
        critic = Critic(rollout_fn(policy, env, batch_size=batch_size, max_steps=max_steps), k=attempts, gate=gate)
        train_tasks = {t.task_id: t for t in train}
        aegis = AEGIS(start, agent, critic, tasks=train_tasks, critic_pool=train_tasks, references=refs,
                      tools=session_tools(env, train[0]), max_variants=max_variants,
                      max_proposals=max_proposals)
        splits = {"val": env.tasks("val")[:val_limit], "test": env.tasks("test")[:test_limit]}
        splits = {name: tasks for name, tasks in splits.items() if tasks}

        def measure(when: str) -> dict[str, dict[str, list[bool]]]:
            with console.status(f"{when}: pass@{attempts} on " + ", ".join(f"{len(t)} {n}" for n, t in splits.items())):
                return {name: routed_outcomes(aegis, tasks, policy, env, attempts=attempts, batch_size=batch_size,
                                              max_steps=max_steps) for name, tasks in splits.items()}

        before = measure("starting harness")
        table = Table(title=f"AEGIS on {env_name} ({meta} meta-agent, {gate} gate, k={attempts})")
        for col in ("round", "train pass", "clusters", "verdicts", "shipped", "harness", "warnings", "seconds"):
            table.add_column(col)
        verdicts_all = []
        with (out / "rounds.jsonl").open("w") as log:
            for r, batch in enumerate(plan):
                began = time.perf_counter()
                with console.status(f"round {r}: {len(batch)} tasks x {attempts} attempts, then AEGIS"):
                    traces, report = run_round(aegis, batch, policy, env, round=r, attempts=attempts,
                                               batch_size=batch_size, max_steps=max_steps)
                log.write(json.dumps(report.to_dict(), default=str) + "\n")
                log.flush()
                verdicts_all += report.verdicts
                for cid in report.shipped:
                    next(h for h in aegis.variants.harnesses.values() if h.id == cid).save(out / "lineage" / f"{cid}.yaml")
                rate = sum(t.passed for t in traces) / len(traces)
                clusters = ", ".join(f"{c.cause}:{c.count}" for d in report.digests for c in d.clusters) or "-"
                verdicts = ", ".join("ship" if v.ship else "undecided" if v.undecided else v.gate
                                     for v in report.verdicts) or "-"
                table.add_row(str(r), f"{rate:.2f}", clusters, verdicts, str(len(report.shipped)),
                              aegis.harness().id, str(len(report.warnings)), f"{time.perf_counter() - began:.0f}")
                console.print(f"round {r}: train pass {rate:.2f}; {verdicts}")
                for warning in report.warnings:  # e.g. a failed meta-agent call: the round went on without it
                    console.print(f"round {r}: warning: {warning}", markup=False, style="yellow", soft_wrap=True)
        after = measure("evolved harness")
    finally:
        close = getattr(env, "close", None)
        if close is not None:
            close()
    for name, h in aegis.variants.harnesses.items():
        h.save(out / f"harness-{name}.yaml")
    (out / "aegis_state.json").write_text(json.dumps(aegis.state_dict(), indent=1, default=str))
    console.print(table)
    summary = evolve_summary(env_name, attempts, len(plan), before, after, verdicts_all, agent.ledger.as_dict())
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    (out / "summary.md").write_text(evolve_markdown(summary))
    for name, row in summary["splits"].items():
        console.print(f"{name} pass@1 {row['pass@1'][0]:.3f} -> {row['pass@1'][1]:.3f}   pass@{attempts} "
                      f"{row[f'pass@{attempts}'][0]:.3f} -> {row[f'pass@{attempts}'][1]:.3f}   ({row['tasks']} tasks)")
    console.print(f"edits: {len(summary['shipped'])} shipped, {len(summary['rejected'])} rejected, "
                  f"{len(summary['undecided'])} undecided   ({out / 'summary.md'})")


def evolve_summary(env_name: str, k: int, rounds: int, before: dict[str, dict[str, list[bool]]],
                   after: dict[str, dict[str, list[bool]]], verdicts: list, tokens: dict) -> dict:
    """What ``coevo evolve`` reports: pass@1 and pass@k before → after per split, and every
    judged edit with its verdict (shipped ones with their flips, rejected ones with the reason,
    the statistical gate's evidence: counts, statistic, episodes)."""
    from coevo.evaluate import pass_rates

    splits = {}
    for name, outcomes in before.items():
        (b1, bk), (a1, ak) = pass_rates(outcomes), pass_rates(after[name])
        splits[name] = {"tasks": len(outcomes), "pass@1": [b1, a1], f"pass@{k}": [bk, ak]}
    edits = [{"round": v.round, "variant": v.variant, "edits": [e.describe() for e in v.proposal.edits],
              "cluster": v.proposal.cluster, "gate": v.gate, "reason": v.reason,
              "fail_to_pass": v.fail_to_pass, "pass_to_fail": v.pass_to_fail, "evidence": v.evidence}
             for v in verdicts]
    return {"env": env_name, "k": k, "rounds": rounds, "splits": splits,
            "shipped": [e for e, v in zip(edits, verdicts) if v.ship],
            "rejected": [e for e, v in zip(edits, verdicts) if not v.ship and not v.undecided],
            "undecided": [e for e, v in zip(edits, verdicts) if v.undecided], "meta_tokens": tokens}


def evolve_markdown(summary: dict) -> str:
    k = summary["k"]
    lines = [f"# coevo evolve: {summary['env']}", "",
             f"{summary['rounds']} rounds; routed variants before → after.", "",
             f"| split | tasks | pass@1 before | pass@1 after | pass@{k} before | pass@{k} after |",
             "|---|---|---|---|---|---|"]
    for name, row in summary["splits"].items():
        lines.append(f"| {name} | {row['tasks']} | {row['pass@1'][0]:.3f} | {row['pass@1'][1]:.3f} | "
                     f"{row[f'pass@{k}'][0]:.3f} | {row[f'pass@{k}'][1]:.3f} |")
    groups = (("Shipped", summary["shipped"]), ("Rejected", summary["rejected"]),
              ("Undecided", summary.get("undecided", [])))
    for title, rows in groups:
        lines += ["", f"## {title} edits ({len(rows)})", ""]
        lines += [f"- round {e['round']} [{e['variant']}] {'; '.join(e['edits'])} (cluster {e['cluster']}): "
                  f"{e['reason']}" for e in rows] or ["none"]
    lines += ["", f"meta-agent tokens: {summary['meta_tokens']}", ""]
    return "\n".join(lines)


@app.command("stream")
def stream_cmd(
    env_name: str = typer.Option("reasoning", "--env", help="environment whose tasks carry capability annotations: "
                                 "a built-in name or package.module:ClassName"),
    env_args: list[str] = typer.Option([], "--env-arg", help="constructor argument KEY=VALUE (YAML value), repeatable"),
    axis: str = typer.Option("tools", help="tools | skills (capabilities released stage by stage; agents: not yet)"),
    stages: int = typer.Option(3, min=1, help="stages S (clipped to the number of capabilities on the axis)"),
    protocols: list[str] = typer.Option(["deployment", "self_evolving"], "--protocol",
                                        help="deployment | self_evolving, repeatable"),
    model: str = typer.Option("smollm2", help="smollm2 | tiny | scripted | a local model directory"),
    backend: str = typer.Option("transformers", help="transformers (CPU/GPU) | vllm (GPU)"),
    device: str = typer.Option("cpu", help="torch device for the transformers backend"),
    harness: str = typer.Option("base", help="starting harness: built-in name or YAML path"),
    temperature: Optional[float] = typer.Option(None, help="override the harness's sampling temperature"),
    max_new_tokens: Optional[int] = typer.Option(None, min=1, help="override the harness's completion budget"),
    rounds_per_stage: int = typer.Option(1, min=0, help="self-evolving: AEGIS rounds on each stage's adaptation split"),
    attempts: int = typer.Option(1, "--k", "--attempts", min=1, help="episodes per task (pass@1 is their mean)"),
    adapt_limit: int = typer.Option(8, min=1, help="adaptation tasks per cohort"),
    eval_limit: int = typer.Option(16, min=1, help="evaluation tasks per cohort"),
    max_steps: int = typer.Option(32, min=1, help="model calls per episode at most"),
    batch_size: int = typer.Option(RolloutConfig.batch_size, min=1, help="model calls per generate() batch"),
    seed: int = typer.Option(0, help="sampling seed and task sample"),
    out: Optional[Path] = typer.Option(None, help="output directory (default runs/stream-<env>-<axis>-<time>)"),
) -> None:
    """Release an env's capabilities along an axis in stages and evaluate retention and adaptation
    under the deployment and self-evolving protocols: the pass matrix, FWT/BWT, tokens and a figure."""
    from coevo.streams import PROTOCOLS, run_stream
    from coevo.streams.axes import get_axis

    env_cls = resolve_env(env_name)
    try:
        get_axis(axis)
    except ValueError as err:  # agents: annotated but not runnable yet; said before the model loads
        raise typer.BadParameter(str(err), param_hint="--axis") from None
    bad = [p for p in protocols if p not in PROTOCOLS]
    if bad:
        raise typer.BadParameter(f"protocol must be one of {list(PROTOCOLS)}, got {bad}", param_hint="--protocol")
    start = with_sampling(load_harness(harness), temperature, max_new_tokens, attempts)
    env = env_cls(**parse_env_args(env_args))
    out = out or Path("runs") / time.strftime(f"stream-{env.name}-{axis}-%Y%m%d-%H%M%S")
    try:
        with console.status(f"loading model {model}"):
            policy = build_policy(model, backend, device, None, env_name, seed)
        try:
            result = run_stream(env, policy, out, axis=axis, stages=stages, protocols=protocols, base=start,
                                rounds_per_stage=rounds_per_stage, attempts=attempts, adapt_limit=adapt_limit,
                                eval_limit=eval_limit, batch_size=batch_size, max_steps=max_steps, seed=seed)
        except ValueError as err:  # a stream that cannot be built from this env's annotations
            raise typer.BadParameter(str(err)) from None
    finally:
        close = getattr(env, "close", None)
        if close is not None:
            close()
    console.print(f"stream: {result.out_dir / 'metrics.json'}  figure: {result.out_dir / 'stream.png'}")


@config_app.command("show")
def config_show_cmd(
    group: Optional[str] = typer.Argument(None, help="one config group (trainer, rollout, ...); all when omitted"),
    overrides: list[str] = typer.Option([], "--override", "-o", help="a Hydra override, e.g. experiment=smoke"),
) -> None:
    """The composed defaults of configs/train.yaml as YAML, each field with its help."""
    from coevo.config_show import show

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
    out: Optional[Path] = typer.Option(None, help="output file (default RUN_DIR/export-<format>.jsonl)"),
    rounds: list[int] = typer.Option([], "--round", help="keep traces of this round, repeatable"),
    harness_ids: list[str] = typer.Option([], "--harness", help="keep traces of this harness id, repeatable"),
    min_reward: Optional[float] = typer.Option(None, help="keep traces with reward >= this"),
    max_reward: Optional[float] = typer.Option(None, help="keep traces with reward <= this"),
    passed: Optional[bool] = typer.Option(None, "--passed/--failed", help="keep only passing (or failing) traces"),
) -> None:
    """Write a run's buffered traces in a format TRL's trainers and SFT tooling read."""
    from coevo.export import export

    out = out or run_dir / f"export-{fmt}.jsonl"
    try:
        n = export(run_dir, out, fmt, rounds=rounds or None, harness_ids=harness_ids or None,
                   min_reward=min_reward, max_reward=max_reward, passed=passed)
    except (ValueError, FileNotFoundError) as err:
        raise typer.BadParameter(str(err)) from None
    console.print(f"exported {n} records to {out}")


@app.command("report")
def report_cmd(
    run_dir: Path = typer.Argument(..., help="a run directory written by train.py"),
    out: Optional[Path] = typer.Option(None, help="where to write (default RUN_DIR/report)"),
) -> None:
    """Figures (pass rate per round, lineage tree, per-task matrix, time breakdown) and summary.md."""
    from coevo.report import write_report

    try:
        path = write_report(run_dir, out)
    except (ValueError, FileNotFoundError) as err:
        raise typer.BadParameter(str(err), param_hint="RUN_DIR") from None
    console.print(f"report: {path / 'summary.md'}")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
