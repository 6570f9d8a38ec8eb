"""The report's four figures, drawn from a ``Run`` (``coevo.report.data``) on an Agg canvas.

matplotlib is imported inside the drawing functions only, and figures are drawn without pyplot, so
importing this module (the loop imports the report every round) costs nothing and no global
backend is switched.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from coevo.harness.harness import Harness
from coevo.harness.scaffold import demonstration_count
from coevo.report.data import TIME_KEYS, Run, lineage_layout, matrix_source, short, task_matrix
from coevo.report.result import run_result
from coevo.rundir.records import LINEAGE_HOWS

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

FIGURES = ("result.png", "pass_rate.png", "lineage.png", "task_matrix.png", "time_breakdown.png")
"""The figures' file names, in the order ``write_figures`` draws them."""

SCAFFOLD_FIGURE = "scaffold.png"
"""Drawn besides ``FIGURES`` for a run that ran episodes without the scaffolding (``rollout.unscaffolded_attempts``)."""


def figures_for(run: Run) -> tuple[str, ...]:
    """The file names of the figures ``write_figures`` draws for ``run``."""
    return FIGURES + ((SCAFFOLD_FIGURE,) if any(r.unscaffolded for r in run.records) else ())


def write_figures(run: Run, out: Path) -> None:
    """Draw ``figures_for(run)`` into the directory ``out``."""
    draws = (_draw_result, _draw_pass_rate, _draw_lineage, _draw_task_matrix, _draw_time, _draw_scaffold)
    for name, draw in zip(figures_for(run), draws, strict=False):
        _save(draw(run), out / name)


def _figure(width: float, height: float) -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Figure, path: Path) -> None:
    fig.savefig(path, format="png", bbox_inches="tight")


def round_axis(ax: Axes, rounds: Sequence[int]) -> None:
    """Whole-number round ticks (every round while they fit), half a round of margin each side: every
    figure with rounds on an axis draws it through this, so none shows a tick at round 0.5."""
    from matplotlib.ticker import MaxNLocator

    ax.set_xlim(min(rounds) - 0.5, max(rounds) + 0.5)
    if len(rounds) <= 30:
        ax.set_xticks(list(rounds))
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("round")


def _draw_result(run: Run) -> Figure:
    """The run's result at a glance: the starting and the final agent's pass@1 on the same held-out
    tasks (95% intervals), beside train pass, tool use and mean reward by round with the rounds
    whose harness edit shipped marked."""
    result = run_result(run.records, run.start)
    fig = _figure(11, 4.2)
    bars, curve = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, 2.2]})
    if result.start is not None and result.end is not None:
        values = [result.start, result.end]
        heights = [100 * v[0] for v in values]
        errors = [[100 * (v[0] - v[1]) for v in values], [100 * (v[2] - v[0]) for v in values]]
        bars.bar([0, 1], heights, yerr=errors, capsize=6, color=["0.6", "tab:green"], width=0.6)
        for x, h in enumerate(heights):
            bars.annotate(f"{h:.0f}%", (x, h), xytext=(8, 2), textcoords="offset points", fontsize=9)
        bars.set_xticks([0, 1], ["start", "end"])
        assert result.change is not None
        c = [100 * x for x in result.change]
        bars.set_title(f"pass@1, {result.tasks} held-out {result.split} tasks\n"
                       f"change {c[0]:+.0f} points [{c[1]:+.0f}, {c[2]:+.0f}]", fontsize=10)
    else:
        bars.text(0.5, 0.5, "not evaluated at both ends", ha="center", va="center", transform=bars.transAxes)
        bars.set_xticks([])
    bars.set_ylim(0, 105)
    bars.set_ylabel("pass@1 (%)")
    rounds = result.rounds
    curve.plot(rounds, [100 * v for v in result.train_pass], "-o", color="tab:blue", label="train pass")
    curve.plot(rounds, [100 * v for v in result.tool_use], "-s", color="tab:purple", label="train tool use")
    curve.plot(rounds, [100 * v for v in result.reward], "--", color="tab:olive", label="mean reward (x100)")
    ends = [rounds[0] - 1, rounds[-1] + 1]  # the held-out evaluations beside the rounds: before and after
    if result.start is not None and result.end is not None:
        curve.plot(ends, [100 * result.start[0], 100 * result.end[0]], "*", ms=14, color="tab:green",
                   label=f"{result.split} pass@1")
        curve.plot(ends, [100 * result.start_tool_use, 100 * result.end_tool_use], "*", ms=10, color="tab:purple",
                   mfc="none", label=f"{result.split} tool use")
    marks = ["^", "v", "D", "s", "p", "h", "*", "<", ">"]
    for i, (r, edits) in enumerate(result.shipped):  # each shipped edit its own colour and mark
        color = f"C{(i + 3) % 10}"
        curve.axvline(r + 0.5, color=color, lw=1.2, alpha=0.7)
        curve.plot(r + 0.5, 104, marks[i % len(marks)], ms=9, color=color, clip_on=False,
                   label=f"shipped after round {r}: {short(edits, 48)}")
    curve.set_ylim(-3, 108)
    curve.set_xlim(ends[0] - 0.5, ends[1] + 0.5)
    curve.set_xticks([ends[0], *rounds, ends[1]], ["start", *map(str, rounds), "end"])
    curve.set_xlabel("round")
    curve.set_ylabel("%")
    curve.grid(alpha=0.3)
    curve.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7)  # beside the axes, off the curves
    curve.set_title("by round (train) and at both ends (held-out)", fontsize=10)
    return fig


def _draw_pass_rate(run: Run) -> Figure:
    fig = _figure(9, 5)
    ax = fig.add_subplot()
    rounds = run.rounds
    train = [r.train.pass_rate for r in run.records]
    ax.plot(rounds, train, "-o", color="tab:blue", label="train pass rate", zorder=2)
    variants = list(dict.fromkeys(v for r in run.records for v in r.by_variant))
    if len(variants) > 1:
        for i, v in enumerate(variants):
            pts = [(r.round, r.by_variant[v].pass_rate) for r in run.records if v in r.by_variant]
            ax.plot(*zip(*pts, strict=True), "--", lw=1, alpha=0.6, color=f"C{(i + 4) % 10}", label=f"train · {v}")
    val = [(r.round, r.val.pass_at_1) for r in run.records if r.val is not None]
    if val:
        ax.plot(*zip(*val, strict=True), "-s", color="tab:green", label="val pass@1")
    test = [(r.round, r.test.pass_at_1) for r in run.records if r.test is not None]
    if test:
        ax.plot(*zip(*test, strict=True), "*", ms=16, color="tab:red", label="test pass@1", linestyle="none")
    shipped_label, rejected_label = "shipped edit", "rejected edits (count)"
    for r, y in zip(run.records, train, strict=False):
        shipped = [v for v in r.verdicts if v.ship]
        if shipped:
            ax.plot(r.round, y, "^", ms=12, color="tab:orange", zorder=3, label=shipped_label)
            shipped_label = "_"
            text = "\n".join(short((f"{v.variant}: " if len(variants) > 1 else "") + v.describe_edits(), 36)
                              for v in shipped)
            ax.annotate(text, (r.round, y), xytext=(6, 10), textcoords="offset points", fontsize=7)
        rejected = r.edit_counts()["rejected"]
        if rejected:
            ax.plot(r.round, -0.05, "x", ms=9, mew=2, color="tab:gray", label=rejected_label)
            rejected_label = "_"
            ax.annotate(str(rejected), (r.round, -0.05), xytext=(6, -3), textcoords="offset points", fontsize=8)
    ax.set_ylim(-0.1, 1.1)
    round_axis(ax, rounds)
    ax.set_ylabel("pass rate")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    ax.set_title(f"Pass rate per round ({', '.join(run.modes)})")
    return fig


def _draw_lineage(run: Run) -> Figure:
    layout = lineage_layout(run.lineage)
    width = max((x for x, _ in layout.values()), default=0) + 1
    depth = max((d for _, d in layout.values()), default=0) + 1
    fig = _figure(max(6.0, 2.4 * width), max(3.0, 1.3 * depth + 1))
    ax = fig.add_subplot()
    ax.set_axis_off()
    if not layout:
        ax.text(0.5, 0.5, "no lineage recorded", ha="center", va="center")
        return fig
    entries = {e.id: e for e in reversed(run.lineage)}  # first entry wins, as in the layout
    variants = list(dict.fromkeys(e.variant for e in run.lineage))
    colour = {v: f"C{i % 10}" for i, v in enumerate(variants)}
    markers = dict(zip(LINEAGE_HOWS, "soD^v", strict=True))  # start, shipped, spawned, selected, released
    for hid, (x, d) in layout.items():
        parent = entries[hid].parent_id
        if parent in layout:
            px, pd = layout[parent]
            ax.plot([px, x], [-pd, -d], "-", color="0.6", lw=1, zorder=1)
    for hid, (x, d) in layout.items():
        e = entries[hid]
        ax.plot(x, -d, markers[e.how], ms=10, color=colour[e.variant], zorder=2)
        edit = "start" if e.how == "start" else short("; ".join(e.edits) or e.how, 28)
        when = "start" if e.round < 0 else f"r{e.round}"
        ax.annotate(f"{hid[:8]} · {when}\n{edit}", (x, -d), xytext=(0, -12), textcoords="offset points",
                    ha="center", va="top", fontsize=7)
    for v in variants:
        ax.plot([], [], "o", color=colour[v], label=v)
    ax.legend(title="variant", loc="upper right", fontsize=8)
    ax.set_xlim(-0.6, width - 0.4)
    ax.set_ylim(-(depth - 1) - 0.7, 0.4)
    ax.set_title("Harness lineage (■ start, ● shipped, ◆ spawned, ▲ selected, ▼ released)")
    return fig


def _draw_task_matrix(run: Run) -> Figure:
    import matplotlib

    task_ids, rounds, values = task_matrix(run)
    n_tasks, n_rounds = len(task_ids), len(rounds)
    fig = _figure(max(5.0, 0.35 * n_rounds + 3), max(3.0, 0.16 * n_tasks + 1.5))
    ax = fig.add_subplot()
    source = matrix_source(run)
    title = "Per-task pass rate (" + ("val pass@1 per evaluated round" if source == "val" else "train batches") + ")"
    ax.set_title(title)
    if not n_tasks:
        ax.set_axis_off()
        ax.text(0.5, 0.5, "no task outcomes recorded", ha="center", va="center")
        return fig
    cmap = matplotlib.colormaps["RdYlGn"].with_extremes(bad="0.85")
    image = ax.imshow(np.ma.masked_invalid(values), cmap=cmap, vmin=0.0, vmax=1.0, aspect="auto",
                      interpolation="nearest")
    step = max(1, math.ceil(n_tasks / 150))  # every task labelled up to 150 rows (6 pt at 0.16 in a row)
    ax.set_yticks(range(0, n_tasks, step), [task_ids[i] for i in range(0, n_tasks, step)],
                  fontsize=max(4, min(9, 700 // max(n_tasks, 1))))
    xstep = max(1, math.ceil(n_rounds / 40))
    ax.set_xticks(range(0, n_rounds, xstep), [str(rounds[j]) for j in range(0, n_rounds, xstep)], fontsize=8)
    ax.set_xlabel("round")
    ax.set_ylabel("task")
    fig.colorbar(image, ax=ax, label="pass rate (grey: not run)", fraction=0.05)
    return fig


def _draw_time(run: Run) -> Figure:
    fig = _figure(max(6.0, 0.3 * len(run.records) + 4), 4.5)
    ax = fig.add_subplot()
    bottom = np.zeros(len(run.records))
    for i, key in enumerate(TIME_KEYS):
        heights = np.array([float(r.seconds.get(key, 0.0)) for r in run.records])
        ax.bar(run.rounds, heights, bottom=bottom, color=f"C{i}", label=key, width=0.8)
        bottom += heights
    round_axis(ax, run.rounds)
    ax.set_ylabel("seconds")
    ax.legend(fontsize=8, bbox_to_anchor=(1.01, 1), loc="upper left")
    ax.set_title("Time per round by phase")
    return fig


def scaffold_lanes(harnesses: Sequence[Harness | None]) -> list[tuple[str, list[bool]]]:
    """(layer, held by each harness) for every scaffold layer any of ``harnesses`` (the base harness
    at the start and after each round; None where its file is missing) held: the forced prefill, then
    demonstration 1, 2, ... (the nearest the task last: the one shed first)."""
    prefill = [h is not None and any(p.kind == "tool_choice" for p in h.processors) for h in harnesses]
    demos = [demonstration_count(h) if h is not None else 0 for h in harnesses]
    lanes = [("forced prefill", prefill)] if any(prefill) else []
    return lanes + [(f"demonstration {k}", [n >= k for n in demos]) for k in range(1, max(demos, default=0) + 1)]


def _draw_scaffold(run: Run) -> Figure:
    """The scaffold lineage on the round axis: each layer the base harness held (the forced prefill,
    each demonstration) as a lane from the round that added it to the round that shed it; below, how
    the model behaved without the outermost layer (tool use, pass rate: the weights taking the
    layer over) beside the scaffolded pass rate, and the prompt tokens an episode cost on a second
    axis. Each shipped edit has its own mark and legend entry."""
    fig = _figure(12, 6.5)
    lanes_ax, curve = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [1, 2.2]})
    rounds = run.rounds
    ids = [run.start.variants.get("base", "") if run.start is not None else ""]  # the start, then each round's
    ids += [r.variants.get("base", "") for r in run.records]
    paths = [run.run_dir / "lineage" / f"{i}.yaml" for i in ids]
    lanes = scaffold_lanes([Harness.load(p) if p.is_file() else None for p in paths])
    for y, (_, held) in enumerate(reversed(lanes)):  # held[0]: the start; held[k + 1]: after round k
        for k, (before, h) in enumerate(zip(held[:-1], held[1:], strict=True)):
            if before and k < len(rounds):  # the harness round k ran with
                lanes_ax.barh(y, 1.0, left=rounds[k] - 0.5, height=0.5, color="tab:purple", alpha=0.35)
            if h != before:  # shipped after round k, between it and the next
                lanes_ax.plot(rounds[k] + 0.5, y, "P" if h else "X", ms=9, color="tab:purple" if h else "tab:red",
                              clip_on=False)
    lanes_ax.set_yticks(range(len(lanes)), [name for name, _ in reversed(lanes)], fontsize=8)
    lanes_ax.set_ylim(-0.7, max(len(lanes), 1) - 0.3)
    lanes_ax.set_title("scaffold layers of the harness each round ran with (+ added, x shed after the round)",
                       fontsize=10)
    lanes_ax.grid(alpha=0.3, axis="x")
    marks = ["^", "v", "D", "s", "p", "h", "*", "<", ">"]
    shipped = [(r.round, v) for r in run.records for v in r.verdicts if v.ship]
    for i, (n, v) in enumerate(shipped):
        color = f"C{(i + 3) % 10}"
        for ax in (lanes_ax, curve):
            ax.axvline(n + 0.5, color=color, lw=1, alpha=0.6)
        curve.plot(n + 0.5, 102, marks[i % len(marks)], ms=9, color=color, clip_on=False,
                   label=f"shipped after round {n}: {short(v.describe_edits(), 44)}")
    train = [r.train for r in run.records]
    curve.plot(rounds, [100 * t.pass_rate for t in train], "-o", color="tab:blue", label="pass, scaffolded")
    bare = [(r.round, r.unscaffolded) for r in run.records if r.unscaffolded is not None]
    if bare:
        curve.plot([n for n, _ in bare], [100 * u.pass_rate for _, u in bare], "--s", color="tab:blue",
                   label="pass, without the outermost layer")
        curve.plot([n for n, _ in bare], [100 * u.tool_use_rate for _, u in bare], "--s", color="tab:purple",
                   label="tool use, without the outermost layer")
    curve.set_ylim(-5, 105)
    curve.set_ylabel("% of the round's train episodes")
    curve.grid(alpha=0.3)
    tokens = curve.twinx()
    prompts = all(t.prompt_tokens for t in train)
    per_episode = [(t.prompt_tokens if prompts else t.tokens) / t.n_traces for t in train]
    tokens.plot(rounds, per_episode, ":", color="0.35", marker=".",
                label="prompt tokens per episode" if prompts else "tokens per episode (prompt + completion)")
    tokens.set_ylim(0, 1.15 * max(per_episode, default=1.0))
    tokens.set_ylabel("prompt tokens per episode" if prompts else "tokens per episode")
    handles = curve.get_legend_handles_labels()[0] + tokens.get_legend_handles_labels()[0]
    labels = curve.get_legend_handles_labels()[1] + tokens.get_legend_handles_labels()[1]
    curve.legend(handles, labels, fontsize=7, loc="upper left", bbox_to_anchor=(1.08, 1.0))  # off the data
    round_axis(curve, rounds)
    curve.set_title("the weights taking the outermost layer over, and what an episode's prompt costs", fontsize=10)
    return fig
