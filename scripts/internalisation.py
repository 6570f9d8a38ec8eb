"""Did the weights learn what the harness had to force? The trained and the frozen model under the
run's harness, and under the same harness without its scaffolding.

    python scripts/internalisation.py RUN_DIR [RUN_DIR ...] [--limit 100] [--out DIR]

Each RUN_DIR is a ``train.py`` run that trained a LoRA adapter (``model_only`` or ``coevolve``),
one per seed. Its final harness (``harness-base.yaml``) is evaluated on the sealed test split in
three forms: as it is, without its ``tool_choice`` processor (the forced tool-call prefill), and
without its ``few_shot`` demonstrations. Each form runs with the trained weights (the run's last
checkpoint) and with the frozen ones (the same model with the adapter disabled): the tool-use rate
says whether the model calls the tool on its own, pass@1 whether that pays. Differences trained −
frozen are paired task bootstraps over seeds (``coevo.report.stats.bootstrap``).

Writes ``DIR/internalisation.md`` and ``.json`` (default DIR: the first run's parent).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from contextlib import nullcontext
from pathlib import Path

import numpy as np

from coevo.agent.rollouts import RolloutService, tool_use_rate
from coevo.envs.load import make_env
from coevo.harness.harness import Harness
from coevo.loop.build import build_policy, to_config
from coevo.policy.load import load_model
from coevo.report.stats import bootstrap
from coevo.rundir import checkpoint

SCAFFOLDS = {"as run": None, "without tool_choice": "tool_choice", "without demonstrations": "few_shot"}
"""Harness form → the processor kind removed from the run's harness (None: the harness as it ran)."""


def harness_forms(h: Harness) -> dict[str, Harness]:
    """The run's harness and its forms without each scaffold it holds."""
    forms = {}
    for form, kind in SCAFFOLDS.items():
        names = [p.name for p in h.processors if p.kind == kind] if kind else []
        if kind and not names:
            continue  # the harness never had that scaffold
        stripped = h
        for name in names:
            stripped = stripped.remove(name)
        forms[form] = stripped
    return forms


def evaluate_run(run_dir: Path, limit: int) -> dict[str, dict[str, dict]]:
    """form → weights (trained | frozen) → per-task pass@1 and tool use on the run's test split."""
    from omegaconf import OmegaConf

    from coevo.config.schema import TrainConfig

    # the run's own config.yaml, typed by the schema (it was written from a TrainConfig)
    cfg = to_config(OmegaConf.merge(OmegaConf.structured(TrainConfig), OmegaConf.load(run_dir / "config.yaml")))
    latest = checkpoint.latest(run_dir / "checkpoint")
    if latest is None:
        raise SystemExit(f"{run_dir}: no committed round to read trained weights from")
    model, tok = load_model(cfg.model.name, device="cpu", dtype=cfg.model.dtype, seed=cfg.model.init_seed,
                            adapter=str(latest / "trainer" / "model"))
    if not hasattr(model, "disable_adapter"):
        raise SystemExit(f"{run_dir}: the run trained no LoRA adapter; the frozen model is not recoverable from it")
    env = make_env(cfg.env.name, cfg.env.args)
    tasks = env.tasks("test")[:limit]
    policy, _ = build_policy(cfg, model, tok)
    rollouts = RolloutService(policy, env, batch_size=cfg.rollout.batch_size, max_steps=cfg.rollout.max_steps,
                              workers=cfg.rollout.workers, seed=cfg.seed)
    variant = next(iter(sorted(run_dir.glob("harness-*.yaml"))))
    out: dict[str, dict[str, dict]] = {}
    for form, h in harness_forms(Harness.load(variant)).items():
        for weights in ("trained", "frozen"):
            policy.model_version = f"internalisation-{weights}"  # a new version: no prefix cache crosses weights
            with model.disable_adapter() if weights == "frozen" else nullcontext():
                done = rollouts.run(h, tasks, attempts=1, phase="test", round=10**6, label=f"{form}, {weights}")
            by_task = {t.task_id: [tr for tr in done.traces if tr.task_id == t.task_id] for t in tasks}
            out.setdefault(form, {})[weights] = {
                "pass": {k: float(np.mean([tr.passed for tr in v])) for k, v in by_task.items()},
                "tool_use": {k: tool_use_rate(v) for k, v in by_task.items()}}
            print(f"{run_dir.name}: {form}, {weights}: pass@1 {np.mean(list(out[form][weights]['pass'].values())):.3f}"
                  f", tool use {np.mean(list(out[form][weights]['tool_use'].values())):.3f}", flush=True)
    close = getattr(env, "close", None)
    if close is not None:
        close()
    return out


def summarise(per_seed: list[dict[str, dict[str, dict]]], seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    table = {}
    for form in per_seed[0]:
        tasks = sorted(per_seed[0][form]["trained"]["pass"])
        row = {}
        for metric in ("pass", "tool_use"):
            m = {w: np.asarray([[s[form][w][metric][t] for t in tasks] for s in per_seed]) for w in ("trained", "frozen")}
            row[metric] = {"trained": [100 * v for v in bootstrap(m["trained"], rng)],
                           "frozen": [100 * v for v in bootstrap(m["frozen"], rng)],
                           "difference": [100 * v for v in bootstrap(m["trained"] - m["frozen"], rng)]}
        table[form] = row | {"tasks": len(tasks)}
    return {"seeds": len(per_seed), "forms": table}


def report_text(summary: dict, command: str) -> str:
    ci = lambda v, sign="": f"{v[0]:{sign}.1f} [{v[1]:{sign}.1f}, {v[2]:{sign}.1f}]"  # noqa: E731
    lines = [f"# Internalisation ({summary['seeds']} seeds, sealed test tasks)", "", "```bash", command, "```", "",
             "| harness | tasks | pass@1 frozen (%) | pass@1 trained (%) | trained − frozen | tool use frozen (%) | "
             "tool use trained (%) | trained − frozen |", "|---|---|---|---|---|---|---|---|"]
    for form, row in summary["forms"].items():
        p, u = row["pass"], row["tool_use"]
        lines.append(f"| {form} | {row['tasks']} | {ci(p['frozen'])} | {ci(p['trained'])} | {ci(p['difference'], '+')} | "
                     f"{ci(u['frozen'])} | {ci(u['trained'])} | {ci(u['difference'], '+')} |")
    return "\n".join(lines) + "\n\nIntervals: paired task bootstrap over seeds, 95%.\n"


def main(argv: Sequence[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", type=Path, nargs="+", help="run directories that trained a LoRA adapter, one per seed")
    ap.add_argument("--limit", type=int, default=100, help="sealed test tasks evaluated")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    out = args.out or args.runs[0].parent
    out.mkdir(parents=True, exist_ok=True)
    summary = summarise([evaluate_run(run, args.limit) for run in args.runs])
    text = report_text(summary, " ".join(["python scripts/internalisation.py", *map(str, args.runs),
                                          "--limit", str(args.limit)]))
    (out / "internalisation.md").write_text(text)
    (out / "internalisation.json").write_text(json.dumps(summary, indent=1))
    print(text)
    return summary


if __name__ == "__main__":
    main()
