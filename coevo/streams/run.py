"""``run_stream``: build one axis's stream from an env, run the protocols, write the results.

Output directory:

- ``stream.json``: the stream (capabilities released per stage, cohorts and their splits) and the arguments;
- ``matrix-<protocol>.csv`` / ``.json``: the pass-rate matrix a_{i,j} (stage × cohort, empty above
  the diagonal) of each protocol, with FWT, BWT and tokens per stage in the JSON;
- ``metrics.json``: every protocol's metrics and the task-specific reference ã_j;
- ``outcomes.jsonl``: one line per (protocol, stage, cohort, task) with the attempts and tokens;
- ``harnesses/``: the harness of each stage (and variant) as YAML; ``evolve.jsonl``: AEGIS reports;
- ``stream.png``: a heatmap per protocol, FWT/BWT in each title.

Every file is written with secret environment values redacted, as a run directory is
(``coevo.safety.secrets``): the JSON files here, harness YAML by ``Harness.to_yaml``, references by
``ReferenceStore.put``, each self-evolving stage's run directory by the loop.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from coevo.agent.policy import Policy
from coevo.envs.base import Env
from coevo.evolution.critic import Critic
from coevo.evolution.meta_agent import MetaAgent
from coevo.evolution.reference import ReferenceStore, build_references
from coevo.harness.defaults import base_harness
from coevo.harness.harness import Harness
from coevo.loop.builders import build_rollouts
from coevo.meta.rule import RuleMetaAgent
from coevo.report.progress import NullProgress, RichProgress
from coevo.safety.secrets import redact, secret_env_values
from coevo.streams.axes import agents_harness, get_axis, tool_owners, with_agent_capabilities
from coevo.streams.config import StreamConfig
from coevo.streams.construct import ADAPT_SPLIT, Stream, build_stream, hash_order
from coevo.streams.metrics import (
    Matrix,
    backward_transfer,
    final_pass_rate,
    forward_transfer,
    pass_matrix,
    reference_rates,
    stage_tokens,
)
from coevo.streams.outcomes import ProtocolResult
from coevo.streams.protocols import (
    deployment,
    self_evolving,
    stage_harnesses,
    task_specific_reference,
)

Progress = RichProgress | NullProgress


@dataclass
class StreamRun:
    """What ``run_stream`` returns: the stream, each protocol's result (and ``reference``), metrics."""

    stream: Stream
    results: dict[str, ProtocolResult]
    metrics: dict[str, Any]
    out_dir: Path


def protocol_metrics(result: ProtocolResult, reference: list[float | None]) -> dict[str, Any]:
    matrix = pass_matrix(result.outcomes, result.n_stages)
    return {
        "matrix": matrix,
        "fwt": forward_transfer(matrix, reference),
        "bwt": backward_transfer(matrix),
        "final_pass_rate": final_pass_rate(matrix),
        "eval_tokens": stage_tokens(result.outcomes, result.n_stages),
        "adapt_tokens": list(result.adapt_tokens),
        "critic_episodes": list(result.critic_episodes),
        "harness_ids": result.harness_ids,
    }


def run_stream(
    env: Env,
    policy: Policy,
    out_dir: str | Path,
    config: StreamConfig | None = None,
    *,
    base: Harness | None = None,
    meta: MetaAgent | None = None,
    critic: Critic | None = None,
    progress: Progress | None = None,
) -> StreamRun:
    """Build the ``config.axis`` stream of ``env`` (train + ``eval_splits`` tasks) into its stages,
    run the task-specific reference and the protocols, and write the files listed in the module
    docstring into ``out_dir``. ``config``: ``StreamConfig`` (its defaults when None); ``base``: the
    starting harness (default ``base_harness()``). Self-evolving only: ``meta`` (default the rule
    meta-agent) and ``critic`` (default the Critic of ``config.evolution`` re-running with
    ``policy`` on ``env``), both handed to the same builders the main job uses."""
    c = config or StreamConfig()
    spec = get_axis(c.axis)
    progress = progress or RichProgress()
    out = Path(out_dir)
    base = base or base_harness()
    tasks = env.tasks(ADAPT_SPLIT) + [t for split in c.eval_splits for t in env.tasks(split)]
    axis_harness = spec.harness
    if c.axis == "agents":  # entities own the tools: tasks need the specialists owning their tools
        owner = tool_owners(env)
        tasks = with_agent_capabilities(tasks, owner)
        axis_harness = partial(agents_harness, owner=owner)
    stream = build_stream(tasks, prefix=spec.prefix, stages=c.stages, eval_splits=c.eval_splits,
                          adapt_limit=c.adapt_limit, eval_limit=c.eval_limit, seed=c.seed)
    stage_harnesses(stream, base, axis_harness, c.distractors_per_stage)  # bad axis settings fail before any episode
    out.mkdir(parents=True, exist_ok=True)
    attempts = c.rollout.attempts
    args = {"env": env.name, "axis": c.axis, "stages": c.stages, "protocols": list(c.protocols), "base": base.id,
            "rounds_per_stage": c.rounds_per_stage, "attempts": attempts, "adapt_limit": c.adapt_limit,
            "eval_limit": c.eval_limit, "eval_splits": list(c.eval_splits),
            "distractors_per_stage": c.distractors_per_stage, "gate": c.evolution.gate, "seed": c.seed,
            "model_version": policy.model_version}
    _write_json(out / "stream.json", {"args": args, **stream.summary()})
    progress.message(f"{c.axis} stream of {env.name}: {stream.n_stages} stages, cohorts "
                     f"{[len(cohort) for cohort in stream.evaluate]} evaluation tasks")

    rollouts = build_rollouts(c.rollout, policy, env, seed=c.seed, progress=progress)
    results: dict[str, ProtocolResult] = {
        "reference": task_specific_reference(stream, base, axis_harness, rollouts, attempts=attempts)}
    if "deployment" in c.protocols:
        results["deployment"] = deployment(stream, base, axis_harness, rollouts, attempts=attempts,
                                           distractors_per_stage=c.distractors_per_stage)
    if "self_evolving" in c.protocols:
        references = _references(env, stream, c.references_per_stage, c.seed, out / "references")
        results["self_evolving"] = self_evolving(
            stream, base, axis_harness, rollouts, meta or RuleMetaAgent(), out / "self_evolving", c.evolution,
            critic=critic, rounds_per_stage=c.rounds_per_stage, attempts=attempts, references=references,
            distractors_per_stage=c.distractors_per_stage, seed=c.seed)

    reference = reference_rates(results["reference"].outcomes, stream.n_stages)
    metrics: dict[str, Any] = {
        "axis": c.axis, "stages": stream.n_stages, "released": [list(r) for r in stream.released],
        "reference": {"pass_rate": reference,
                      "eval_tokens": stage_tokens(results["reference"].outcomes, stream.n_stages)},
    }
    for name in c.protocols:
        metrics[name] = protocol_metrics(results[name], reference)
        _write_matrix(out, name, metrics[name], stream)
    _write_json(out / "metrics.json", metrics)
    _write_outcomes(out, results)
    _write_harnesses(out, results)
    draw_stream(out / "stream.png", {name: metrics[name] for name in c.protocols}, stream)
    _summary_table(progress, metrics, c.protocols)
    return StreamRun(stream, results, metrics, out)


def _references(env: Env, stream: Stream, per_stage: int, seed: int, path: Path) -> dict[str, Any]:
    """Gold trajectories (where tasks have gold actions) of each cohort's adaptation split plus up
    to ``per_stage`` more of its train tasks. AEGIS quotes them as demonstrations only for tasks it
    is not judging in that round, and ``self_evolving`` hides those of unreleased cohorts."""
    picked = []
    for cohort, adapt in zip(stream.cohorts, stream.adapt, strict=True):
        used = {t.task_id for t in adapt}
        spare = [t for t in hash_order(cohort, seed) if t.split == ADAPT_SPLIT and t.task_id not in used]
        picked += list(adapt) + spare[:per_stage]
    return build_references(env, picked, ReferenceStore(path)) if picked else {}


def _write_json(path: Path, data: Any) -> None:
    """``data`` as JSON, atomically, with secret values redacted (task ids, capability names and
    AEGIS reports come from the env's tasks, which may quote a key)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(redact(data), indent=1, default=str))
    tmp.replace(path)


def _write_matrix(out: Path, protocol: str, metrics: dict[str, Any], stream: Stream) -> None:
    matrix: Matrix = metrics["matrix"]
    with (out / f"matrix-{protocol}.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["stage", *[f"cohort_{j}" for j in range(stream.n_stages)]])
        for i, row in enumerate(matrix):
            writer.writerow([i, *["" if v is None else f"{v:.6g}" for v in row]])
    data = {"protocol": protocol, "released": [list(r) for r in stream.released],
            **{k: metrics[k] for k in ("matrix", "fwt", "bwt", "final_pass_rate", "eval_tokens", "adapt_tokens")}}
    _write_json(out / f"matrix-{protocol}.json", data)


def _write_outcomes(out: Path, results: dict[str, ProtocolResult]) -> None:
    """outcomes.jsonl and evolve.jsonl, redacted as ``_write_json`` is."""
    secrets = secret_env_values()
    with (out / "outcomes.jsonl").open("w") as f:
        for name, result in results.items():
            for o in result.outcomes:
                f.write(json.dumps(redact({"protocol": name, **o.to_dict()}, secrets)) + "\n")
    with (out / "evolve.jsonl").open("w") as f:
        for name, result in results.items():
            for report in result.evolve_reports:
                f.write(json.dumps(redact({"protocol": name, **report}, secrets), default=str) + "\n")


def _write_harnesses(out: Path, results: dict[str, ProtocolResult]) -> None:
    for name, result in results.items():
        for s, variants in enumerate(result.harnesses):
            for variant, harness in variants.items():
                harness.save(out / "harnesses" / f"{name}-stage{s}-{variant}.yaml")


def _fmt(value: float | None, signed: bool = True) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:+.3f}" if signed else f"{value:.3f}"


def draw_stream(path: Path, per_protocol: dict[str, dict[str, Any]], stream: Stream) -> Path:
    """One heatmap of a_{i,j} per protocol (grey: undefined), FWT and BWT in the titles."""
    import matplotlib
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.colors import Normalize
    from matplotlib.figure import Figure

    n = stream.n_stages
    fig = Figure(figsize=(max(4.0, 1.0 + 0.9 * n) * len(per_protocol) + 1.0, max(3.5, 1.2 + 0.7 * n)), dpi=100)
    FigureCanvasAgg(fig)
    cmap = matplotlib.colormaps["RdYlGn"].with_extremes(bad="0.85")
    axes = fig.subplots(1, len(per_protocol), squeeze=False)[0]
    image = None
    labels = [f"{s}: +{', '.join(r)[:24]}" for s, r in enumerate(stream.released)]
    for k, (ax, (name, m)) in enumerate(zip(axes, per_protocol.items(), strict=True)):
        values = np.array([[np.nan if v is None else v for v in row] for row in m["matrix"]], dtype=float)
        image = ax.imshow(np.ma.masked_invalid(values), cmap=cmap, norm=Normalize(0.0, 1.0), interpolation="nearest")
        for i in range(n):
            for j in range(n):
                if not np.isnan(values[i, j]):
                    dark = not 0.2 <= values[i, j] <= 0.8  # the ends of RdYlGn are dark
                    ax.text(j, i, f"{values[i, j]:.2f}", ha="center", va="center", fontsize=8,
                            color="white" if dark else "black")
        ax.set_xticks(range(n), [str(j) for j in range(n)])
        ax.set_yticks(range(n), labels if k == 0 else [""] * n, fontsize=7)  # rows are shared: label them once
        ax.set_xlabel("cohort (stage introduced)")
        if k == 0:
            ax.set_ylabel("stage (capabilities released)")
        ax.set_title(f"{name}\nFWT {_fmt(m['fwt'])}  BWT {_fmt(m['bwt'])}", fontsize=10)
    if image is not None:
        fig.colorbar(image, ax=list(axes), label="pass@1 (grey: not defined)", fraction=0.04)
    fig.savefig(path, format="png", bbox_inches="tight")
    return path


def _summary_table(progress: Progress, metrics: dict[str, Any], protocols: Sequence[str]) -> None:
    if not isinstance(progress, RichProgress):  # no console to print to
        return
    console = progress.console
    from rich.table import Table

    table = Table(title=f"{metrics['axis']} stream, {metrics['stages']} stages")
    for col in ("protocol", "FWT", "BWT", "final pass@1", "eval tokens", "adapt tokens"):
        table.add_column(col)
    for name in protocols:
        m = metrics[name]
        table.add_row(name, _fmt(m["fwt"]), _fmt(m["bwt"]), _fmt(m["final_pass_rate"], signed=False),
                      str(sum(m["eval_tokens"])), str(sum(m["adapt_tokens"])))
    ref = ", ".join(_fmt(v, signed=False) for v in metrics["reference"]["pass_rate"])
    table.caption = f"task-specific reference per cohort: {ref}"
    console.print(table)
