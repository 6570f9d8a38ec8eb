"""Did the weights learn what the harness had to force? The trained and the frozen model under the
run's harness, and under the same harness without its scaffolding.

    python scripts/internalisation.py RUN_DIR [RUN_DIR ...] [--limit 100] [--datasets D ...] [--arms] [--out DIR]

Each RUN_DIR is a ``train.py`` run that trained a LoRA adapter (``model_only`` or ``coevolve``),
one per seed. Its final harness (``harness-base.yaml``) is evaluated on the sealed test split in
three forms: as it is, without its ``tool_choice`` processor (the forced tool-call prefill), and
without its ``few_shot`` demonstrations. When the run retired scaffolding (its lineage holds a
harness with more scaffold layers, prefills and demonstrations, than the final one:
``experiment=retire``), that most scaffolded harness is evaluated too, as it was and without its
prefill; named in ``--forms``, the "most scaffolded" form of a run that shed nothing is its final
harness, so a seed that sheds nothing pools as saving nothing. Each form runs with the trained
weights (the run's last checkpoint) and with the frozen ones (the same model with the adapter
disabled): the tool-use rate says whether the model calls the tool on its own, pass@1 whether
that pays, prompt tokens per episode what the harness costs.
Differences trained − frozen are paired task bootstraps over seeds (``coevo.report.stats.bootstrap``).

With ``--datasets D [D ...]`` the same table is measured on the test split of other datasets of
the run's env (transfer: kinds of task the run never trained on), with the run's starting harness
as one more form, so the rows say how much of the harness's and the weights' gain carries over.
The sample holds the same number of tasks from each named dataset (``--limit`` in all; a dataset
with no test task stops the evaluation), and each dataset gets its own table beside the pooled one.

With ``--arms`` the runs are the arms of an ablation (``train.py mode=...``, several seeds each, any
mode): each arm's agent, its final harness with its own weights, and ``static``, the starting harness
with the frozen weights, on the same tasks, with paired differences over the seeds every arm holds
(``coevo.report.experiment``). With ``--datasets`` that is the ablation's transfer table.

Writes ``DIR/internalisation.md`` and ``.json`` (``transfer.*`` with ``--datasets``, ``*-arms.*`` with
``--arms``; default DIR: the first run's parent).
"""

from __future__ import annotations

import argparse
import hashlib
import json
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np

from coevo.agent.rollouts import RolloutService, tool_use_rate
from coevo.buffers.replay import ReplayBuffer
from coevo.config.schema import load_run_config
from coevo.envs.base import skill_of, stratified
from coevo.envs.load import make_env
from coevo.evolution import digest
from coevo.harness.harness import Harness
from coevo.harness.scaffold import (
    demonstration_count,
    scaffold_layers,
    with_one_demonstration_fewer,
)
from coevo.harness.tool_listing import unlisting
from coevo.loop.builders import build_policy
from coevo.policy.load import load_model
from coevo.report.experiment import ARMS, DIFFERENCES, markdown_table, paired_differences, write_outputs
from coevo.report.stats import bootstrap, interval, points
from coevo.rundir import checkpoint

SCAFFOLDS = {"as run": None, "without tool_choice": "tool_choice", "without demonstrations": "few_shot"}
"""Harness form → the processor kind removed from the run's harness (None: the harness as it ran)."""
FEWER = "one demonstration fewer"
"""The form of a harness showing several demonstrations without its last one."""
CALLED = "as run, only the tools it called"
"""The final harness listing only the tools the run's buffered episodes called: every tool listed
costs its line of the system prompt on every call, whether or not the model ever calls it."""


def most_scaffolded(run_dir: Path) -> Harness | None:
    """The base variant's harness with the most scaffold layers in the run's lineage (the
    latest of equals), when it holds more than the final one: the harness before a retirement."""
    rows = [json.loads(line) for line in (run_dir / "lineage.jsonl").read_text().splitlines() if line.strip()]
    chain = [Harness.load(run_dir / "lineage" / f"{row['id']}.yaml") for row in rows if row["variant"] == "base"]
    if not chain:
        return None
    best = max(reversed(chain), key=scaffold_layers)
    final = Harness.load(run_dir / "harness-base.yaml")
    return best if scaffold_layers(best) > scaffold_layers(final) else None


def start_harness(run_dir: Path) -> Harness:
    """The harness the run's base variant started from (its lineage's ``start`` row)."""
    rows = [json.loads(line) for line in (run_dir / "lineage.jsonl").read_text().splitlines() if line.strip()]
    start = next(row for row in rows if row["variant"] == "base" and row["how"] == "start")
    return Harness.load(run_dir / "lineage" / f"{start['id']}.yaml")


def tools_run_called(run_dir: Path) -> set[str]:
    """The tools the episodes in the run's replay buffer (its last rounds' traces) called by a name
    that ran (``coevo.evolution.digest.called_tools``)."""
    with ReplayBuffer(run_dir / "buffer", capacity=1, read_only=True) as buffer:  # read-only: nothing evicted
        return set(digest.called_tools(buffer.load(buffer.entries())))


def only_tools(h: Harness, tools: set[str]) -> Harness | None:
    """``h`` listing only ``tools`` (``coevo.harness.tool_listing.unlisting``); None when that
    changes nothing or would list no tool."""
    edit = unlisting(h, tools)
    return None if edit is None else h.set_param(edit.processor, edit.param, edit.value)


def harness_forms(h: Harness, before: Harness | None = None, called: set[str] | None = None) -> dict[str, Harness]:
    """The run's harness and its forms without each scaffold it holds; with ``before`` (the most
    scaffolded harness of a run that retired scaffolding), that one too, as it was and without its
    prefill; with ``called`` (the tools the run's episodes called), the run's harness listing only
    those."""
    forms = {}
    if before is not None:
        forms["most scaffolded"] = before
        forms["most scaffolded, without tool_choice"] = _without_kind(before, "tool_choice")
    for form, kind in SCAFFOLDS.items():
        names = [p.name for p in h.processors if p.kind == kind] if kind else []
        if kind and not names:
            continue  # the harness never had that scaffold
        if kind == "few_shot" and demonstration_count(h) > 1:  # the step between all and none
            forms[FEWER] = with_one_demonstration_fewer(h)
        forms[form] = _without_kind(h, kind) if kind else h
    narrowed = only_tools(h, called) if called is not None else None
    if narrowed is not None:
        forms[CALLED] = narrowed
    return forms


def _without_kind(h: Harness, kind: str) -> Harness:
    """``h`` without its processors of ``kind``."""
    for name in [p.name for p in h.processors if p.kind == kind]:
        h = h.remove(name)
    return h


def evaluate_run(run_dir: Path, limit: int, datasets: Sequence[str] = (), arm: bool = False,
                 only: Sequence[str] = ()) -> dict[str, dict[str, dict]]:
    """form → weights (trained | frozen) → per-task pass@1, tool use and prompt tokens on the run's
    test split, or with ``datasets`` on the test split of those datasets of the run's env instead
    (transfer: tasks of kinds the run never trained on; the run's starting harness is a form too).
    With ``arm`` only what an ablation arm needs: the starting harness under the frozen weights and
    the final one under the run's own (a run that trained no adapter has only the frozen ones). ``only``:
    just these forms (every form when empty)."""
    # the run's own config.yaml, typed by the schema (fields an earlier version recorded and this one
    # no longer has are left out)
    cfg = load_run_config(run_dir)
    latest = checkpoint.latest(run_dir / "checkpoint")
    if latest is None:
        raise SystemExit(f"{run_dir}: no committed round to read trained weights from")
    adapter = latest / "trainer" / "model"
    trained = adapter.is_dir()
    if not trained and not arm:
        raise SystemExit(f"{run_dir}: the run trained no adapter to compare with the frozen model (--arms reads "
                         "runs of every mode)")
    model, tok = load_model(cfg.model.name, device="cpu", dtype=cfg.model.dtype,
                            adapter=str(adapter) if trained else None)
    if trained and not hasattr(model, "disable_adapter"):
        raise SystemExit(f"{run_dir}: the run trained no LoRA adapter; the frozen model is not recoverable from it")
    env = make_env(cfg.env.name, {**cfg.env.args, "datasets": list(datasets)} if datasets else cfg.env.args)
    try:  # named datasets: the same number of tasks from each (the split lists them dataset by dataset)
        tasks = stratified(env.tasks("test"), datasets, limit) if datasets else env.tasks("test")[:limit]
    except ValueError as err:
        raise SystemExit(f"{run_dir}: --datasets {' '.join(datasets)} --limit {limit}: {err}") from None
    policy, _ = build_policy(cfg, model, tok)
    rollouts = RolloutService(policy, env, batch_size=cfg.rollout.batch_size, max_steps=cfg.rollout.max_steps,
                              workers=cfg.rollout.workers, seed=cfg.seed)
    variant = next(iter(sorted(run_dir.glob("harness-*.yaml"))))
    out: dict[str, dict[str, dict]] = {}
    if arm:
        forms = {"start": start_harness(run_dir), "as run": Harness.load(variant)}
    else:
        final = Harness.load(variant)
        before = most_scaffolded(run_dir)
        if before is None and RETIRED[0] in only and scaffold_layers(final):
            before = final  # asked for by name: a run that shed nothing is its own most scaffolded harness
        # the buffer is read only when the form that needs it is evaluated
        called = tools_run_called(run_dir) if not only or CALLED in only else None
        forms = harness_forms(final, before, called)
        if datasets:
            forms = {"start": start_harness(run_dir), **forms}
    if only:
        unknown = sorted(set(only) - set(forms))
        if unknown:
            raise SystemExit(f"{run_dir}: no form {unknown}; this run's forms are {sorted(forms)}")
        forms = {f: h for f, h in forms.items() if f in only}
    both = ("trained", "frozen") if trained else ("frozen",)
    # an arm needs its starting harness under the frozen weights (static) and its final one under its own
    wanted = {"start": ("frozen",), "as run": ("trained",) if trained else ("frozen",)} if arm else {}
    done: dict[tuple[str, str], dict] = {}  # (harness id, weights) -> scores: each pair evaluated once
    for form, h in forms.items():
        for weights in wanted.get(form, both):
            key = (h.id, weights)  # e.g. the most scaffolded harness without its prefill is the final one
            if key not in done:
                policy.model_version = f"internalisation-{weights}"  # a new version: no prefix cache crosses weights
                with model.disable_adapter() if trained and weights == "frozen" else nullcontext():
                    traces = rollouts.run(h, tasks, attempts=1, phase="test", round=10**6,
                                          label=f"{form}, {weights}").traces
                by_task = {t.task_id: [tr for tr in traces if tr.task_id == t.task_id] for t in tasks}
                done[key] = {
                    "pass": {k: float(np.mean([tr.passed for tr in v])) for k, v in by_task.items()},
                    "tool_use": {k: tool_use_rate(v) for k, v in by_task.items()},
                    "prompt_tokens": {k: float(np.mean([tr.cost.get("prompt_tokens", 0) for tr in v]))
                                      for k, v in by_task.items()}}
                print(f"{run_dir.name}: {form}, {weights}: pass@1 {np.mean(list(done[key]['pass'].values())):.3f}"
                      f", tool use {np.mean(list(done[key]['tool_use'].values())):.3f}", flush=True)
            out.setdefault(form, {})[weights] = done[key]
    close = getattr(env, "close", None)
    if close is not None:
        close()
    if datasets:
        out[SKILLS] = {t.task_id: skill_of(t) for t in tasks}
    return out


SKILLS = "_datasets"  # in a transfer evaluation's result: task id -> the dataset it came from


def per_dataset(results: Sequence[dict], datasets: Sequence[str]) -> dict[str, list[dict]]:
    """dataset -> the results restricted to its tasks (evaluate_run's shape, without SKILLS)."""
    out = {}
    for d in datasets:
        out[d] = [{form: {w: {metric: {t: v for t, v in per_task.items() if r[SKILLS][t] == d}
                                for metric, per_task in scores.items()} for w, scores in weights.items()}
                   for form, weights in r.items() if form != SKILLS} for r in results]
    return out


RETIRED = ("most scaffolded", "most scaffolded, without tool_choice")


def _matrix(per_seed: list[dict], form: str, weights: str, metric: str, tasks: list[str]) -> np.ndarray:
    """[seeds, tasks] of one metric."""
    return np.asarray([[s[form][weights][metric][t] for t in tasks] for s in per_seed])


def summarise(per_seed: list[dict[str, dict[str, dict]]], seed: int = 0, final: str = "as run") -> dict:
    """Per form (those every seed has): pass@1 and tool use, trained and frozen and their paired
    difference, and the trained model's prompt tokens per episode. For runs that retired
    scaffolding, ``retirement``: the ``final`` form (the harness as the run ended, or a form of it)
    against the most scaffolded one (pass@1 paired, prompt tokens saved) and the trained model
    without the prefill (tool use, pass@1 kept)."""
    rng = np.random.default_rng(seed)
    table = {}
    forms = [f for f in per_seed[0] if all(f in s for s in per_seed)]
    tasks = sorted(per_seed[0][forms[0]]["trained"]["pass"])
    for form in forms:
        row: dict = {}
        for metric in ("pass", "tool_use"):
            m = {w: _matrix(per_seed, form, w, metric, tasks) for w in ("trained", "frozen")}
            row[metric] = {"trained": [100 * v for v in bootstrap(m["trained"], rng)],
                           "frozen": [100 * v for v in bootstrap(m["frozen"], rng)],
                           "difference": [100 * v for v in bootstrap(m["trained"] - m["frozen"], rng)]}
        row["prompt_tokens"] = float(_matrix(per_seed, form, "trained", "prompt_tokens", tasks).mean())
        table[form] = row | {"tasks": len(tasks)}
    out: dict = {"seeds": len(per_seed), "forms": table}
    if RETIRED[0] in forms and final in forms:
        most = _matrix(per_seed, RETIRED[0], "trained", "pass", tasks)
        ended = _matrix(per_seed, final, "trained", "pass", tasks)
        tokens = {f: _matrix(per_seed, f, "trained", "prompt_tokens", tasks).mean(axis=1)  # [seeds]
                  for f in (final, RETIRED[0])}
        out["retirement"] = {
            "final": final,
            "final_minus_most_scaffolded": [100 * v for v in bootstrap(ended - most, rng)],
            "prompt_tokens_saved": 1 - table[final]["prompt_tokens"] / table[RETIRED[0]]["prompt_tokens"],
            "per_seed": [{"final_minus_most_scaffolded": 100 * float((ended[k] - most[k]).mean()),
                          "prompt_tokens": [float(tokens[final][k]), float(tokens[RETIRED[0]][k])]}
                         for k in range(len(per_seed))],
        }
        if RETIRED[1] in forms:
            unforced = _matrix(per_seed, RETIRED[1], "trained", "pass", tasks)
            out["retirement"] |= {"unforced_tool_use": table[RETIRED[1]]["tool_use"]["trained"],
                                  "unforced_pass_kept": float(unforced.mean() / most.mean()) if most.mean() else None}
    return out


def summarise_arms(evaluated: Sequence[tuple[str, int, dict]], seed: int = 0) -> dict:
    """The ablation's arms on the evaluated tasks: each arm's agent is its final harness with its own
    weights (the trained adapter where the arm trained one), ``static`` the starting harness with
    the frozen weights. Pass@1 and tool use with paired differences (``DIFFERENCES``) over the seeds
    every arm holds, and prompt tokens per episode. ``evaluated``: (mode, seed, ``evaluate_run(...,
    arm=True)``) per run."""
    rng = np.random.default_rng(seed)
    agents: dict[str, dict[int, dict]] = {}
    for mode, s, ev in evaluated:
        own = ev["as run"]
        agents.setdefault(mode, {})[s] = own["trained"] if "trained" in own else own["frozen"]
        agents.setdefault("static", {}).setdefault(s, ev["start"]["frozen"])
    arms = [m for m in ARMS if m in agents]
    seeds = sorted(set.intersection(*(set(agents[m]) for m in arms)))
    if not seeds:
        raise SystemExit("no seed was run in every arm: paired differences need the same seeds")
    tasks = sorted(agents[arms[0]][seeds[0]]["pass"])
    out: dict = {"seeds": seeds, "tasks": len(tasks), "arms": {}, "differences": {}}
    for metric in ("pass", "tool_use"):
        scores = {m: np.asarray([[agents[m][s][metric][t] for t in tasks] for s in seeds]) for m in arms}
        for m in arms:
            out["arms"].setdefault(m, {})[metric] = points(scores[m], rng)
        for name, d in paired_differences(scores, DIFFERENCES, rng).items():
            out["differences"].setdefault(name, {})[metric] = d["points"]
    for m in arms:
        tokens = [agents[m][s]["prompt_tokens"][t] for s in seeds for t in tasks]
        out["arms"][m]["prompt_tokens"] = float(np.mean(tokens))
    return out


def arms_text(summary: dict, command: str) -> str:
    return "\n\n".join([
        f"# Ablation arms (seeds {', '.join(map(str, summary['seeds']))}; "
        f"{summary['tasks']} tasks)", f"```bash\n{command}\n```",
        markdown_table(["arm (final harness, its own weights)", "pass@1 (%)", "tool use (%)",
                        "prompt tokens per episode"],
                       [[m, interval(a["pass"]), interval(a["tool_use"]), f"{a['prompt_tokens']:.0f}"]
                        for m, a in summary["arms"].items()]),
        markdown_table(["difference (points)", "pass@1", "tool use"],
                       [[name, interval(d["pass"], signed=True), interval(d["tool_use"], signed=True)]
                        for name, d in summary["differences"].items()]),
        "static: the starting harness with the frozen weights. Intervals: paired task bootstrap over seeds, 95%.\n"])


def report_text(summary: dict, command: str) -> str:
    rows = []
    for form, row in summary["forms"].items():
        p, u = row["pass"], row["tool_use"]
        rows.append([form, row["tasks"], interval(p["frozen"]), interval(p["trained"]), interval(p["difference"], True),
                     interval(u["frozen"]), interval(u["trained"]), interval(u["difference"], True),
                     f"{row['prompt_tokens']:.0f}"])
    parts = [f"# Internalisation ({summary['seeds']} seeds, sealed test tasks)", f"```bash\n{command}\n```",
             markdown_table(["harness", "tasks", "pass@1 frozen (%)", "pass@1 trained (%)", "trained − frozen",
                             "tool use frozen (%)", "tool use trained (%)", "trained − frozen",
                             "prompt tokens per episode (trained)"], rows)]
    retired = summary.get("retirement")
    if retired is not None:
        text = (f"Retirement (trained weights): the final harness ({retired['final']}) against the most scaffolded "
                "one, pass@1 "
                f"{interval(retired['final_minus_most_scaffolded'], True)} points with "
                f"{100 * retired['prompt_tokens_saved']:.1f}% fewer prompt tokens per episode")
        seeds = "; ".join(f"{d['final_minus_most_scaffolded']:+.1f} points, {d['prompt_tokens'][0]:.0f} / "
                          f"{d['prompt_tokens'][1]:.0f} tokens" for d in retired["per_seed"])
        text += f" (by seed: {seeds})"
        if "unforced_tool_use" in retired:
            kept = retired["unforced_pass_kept"]
            text += (f"; without the prefill the model calls the tool in {interval(retired['unforced_tool_use'])}% "
                     "of episodes and keeps " + (f"{100 * kept:.0f}%" if kept is not None else "—")
                     + " of the scaffolded pass@1")
        parts.append(text + ".")
    return "\n\n".join(parts) + "\n\nIntervals: paired task bootstrap over seeds, 95%.\n"


def kept(out: Path, run: Path, settings: Any, evaluate: Callable[[], dict]) -> dict:
    """``evaluate()``'s per-task results for ``run``, kept in ``out/evaluations/`` under the run and
    the evaluation's settings: read back when they are there, so an interrupted table, or one that
    adds a run to those already evaluated, evaluates each run once. Keyed by the run's last
    checkpoint too, so a run trained further is evaluated again."""
    latest = checkpoint.latest(run / "checkpoint")
    key = hashlib.sha256(json.dumps([str(run.resolve()), str(latest), settings], default=str).encode()).hexdigest()[:12]
    path = out / "evaluations" / f"{run.name}-{key}.json"
    if path.is_file():
        print(f"{run.name}: read back from {path}", flush=True)
        return json.loads(path.read_text())
    result = evaluate()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result))
    tmp.replace(path)
    return result


def main(argv: Sequence[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", type=Path, nargs="+", help="run directories that trained a LoRA adapter, one per seed "
                    "(with --arms: runs of any mode)")
    ap.add_argument("--limit", type=int, default=100, help="sealed test tasks evaluated")
    ap.add_argument("--datasets", nargs="+", default=[],
                    help="transfer: evaluate on the test split of these datasets of the run's env instead (e.g. "
                         "products leg_counting, which use the same calculator), with the starting harness as a form")
    ap.add_argument("--arms", action="store_true",
                    help="the runs are ablation arms (train.py mode=...): compare each arm's final harness with its "
                         "own weights, and the starting harness with the frozen ones (static), paired over seeds")
    ap.add_argument("--forms", nargs="+", default=[], help="evaluate only these harness forms (e.g. 'as run' "
                    "'one demonstration fewer'); every form by default")
    ap.add_argument("--final", default="as run", help="the form compared with the most scaffolded harness (e.g. "
                    f"{CALLED!r}); the harness as the run ended by default")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    out = args.out or args.runs[0].parent
    command = " ".join(["python scripts/internalisation.py", *map(str, args.runs), "--limit", str(args.limit)]
                       + (["--datasets", *args.datasets] if args.datasets else []) + (["--arms"] if args.arms else [])
                       + (["--forms", *(repr(f) for f in args.forms)] if args.forms else [])
                       + (["--final", repr(args.final)] if args.final != "as run" else []))
    name = "transfer" if args.datasets else "internalisation"
    settings = ("stratified", args.limit, args.datasets)  # "stratified": no earlier first-N evaluation is read back
    if args.arms:
        modes, results = [], []
        for run in args.runs:
            cfg = load_run_config(run)
            modes.append((cfg.mode, cfg.seed))
            results.append(kept(out, run, (*settings, "arm"),
                                lambda run=run: evaluate_run(run, args.limit, args.datasets, arm=True)))
        summary = summarise_arms([(m, s, {f: r for f, r in res.items() if f != SKILLS})
                                  for (m, s), res in zip(modes, results, strict=True)])
        texts = [arms_text(summary, command)]
        if args.datasets:  # each dataset on its own: a zero stays a zero, not averaged into another's rate
            summary["by_dataset"] = {d: summarise_arms([(m, s, r) for (m, s), r in zip(modes, rs, strict=True)])
                                     for d, rs in per_dataset(results, args.datasets).items()}
            texts += [arms_text(sub, f"dataset {d}") for d, sub in summary["by_dataset"].items()]
        write_outputs(out, f"{name}-arms", "\n".join(texts), summary)
        return summary
    results = [kept(out, run, (*settings, args.forms), lambda run=run: evaluate_run(
                                                                              run, args.limit, args.datasets,
                                                                              only=args.forms)) for run in args.runs]
    summary = summarise([{f: r for f, r in res.items() if f != SKILLS} for res in results], final=args.final)
    texts = [report_text(summary, command)]
    if args.datasets:
        summary["by_dataset"] = {d: summarise(rs, final=args.final)
                                 for d, rs in per_dataset(results, args.datasets).items()}
        texts += [report_text(sub, f"dataset {d}") for d, sub in summary["by_dataset"].items()]
    write_outputs(out, name, "\n".join(texts), summary)
    return summary


if __name__ == "__main__":
    main()
