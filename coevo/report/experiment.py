"""What the experiment scripts share: arms compared with paired intervals, tables, bars, outputs.

An experiment here compares arms (training modes, harness forms, settings) on one fixed set of
sealed tasks over the same seeds. Each arm is a score matrix [seeds, tasks] whose rows are in the
same seed order and whose columns are in the same task order, so every difference between two
arms is a paired task bootstrap (``coevo.report.stats``). The scripts under ``scripts/`` are
recipes over these: they run or read the arms, build the matrices and say what the tables mean.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from coevo.report.stats import points

if TYPE_CHECKING:
    from matplotlib.axes import Axes

ARMS = ("static", "harness_only", "model_only", "coevolve")
"""The co-evolution ablation's arms in report order: nothing evolves, the harness evolves, the
weights train, both do."""
DIFFERENCES = (("harness_only", "static"), ("model_only", "static"), ("coevolve", "harness_only"),
               ("coevolve", "static"))
"""(a, b) pairs reported as a - b: what each half adds alone, what training adds to an evolving
harness, and the total effect."""


def paired_differences(scores: Mapping[str, np.ndarray], pairs: Sequence[tuple[str, str]],
                       rng: np.random.Generator) -> dict[str, dict[str, Any]]:
    """``{"a - b": {"seeds": n, "points": [mean, lo, hi]}}`` for every pair whose arms both have
    scores, over the first ``n`` seeds both arms hold (rows are in one seed order), in points."""
    out = {}
    for a, b in pairs:
        if a in scores and b in scores:
            if scores[a].shape[1] != scores[b].shape[1]:
                raise ValueError(f"{a} and {b} were scored on different numbers of tasks; a paired "
                                 "difference needs the same tasks in the same order")
            n = min(len(scores[a]), len(scores[b]))
            out[f"{a} - {b}"] = {"seeds": n, "points": points(scores[a][:n] - scores[b][:n], rng)}
    return out


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A Markdown table: one header row, a rule, then the rows (cells written with ``str``)."""
    line = lambda cells: "| " + " | ".join(str(c) for c in cells) + " |"  # noqa: E731
    if any(len(r) != len(header) for r in rows):
        raise ValueError(f"every row needs {len(header)} cells, like the header")
    return "\n".join([line(header), "|" + "---|" * len(header), *map(line, rows)])


def ci_bars(ax: Axes, labels: Sequence[str], estimates: Sequence[Sequence[float]], *, width: float = 0.72,
            offset: float = 0.0, label: str | None = None) -> None:
    """Bars of ``[mean, lo, hi]`` estimates with their interval as error bars, one per label."""
    ax.bar([i + offset for i in range(len(labels))], [v[0] for v in estimates], width=width,
           yerr=[[v[0] - v[1] for v in estimates], [v[2] - v[0] for v in estimates]], capsize=3, label=label)
    ax.set_xticks(range(len(labels)), labels, fontsize=8)


def write_outputs(out: Path, name: str, text: str, summary: Mapping[str, object]) -> None:
    """``out/name.md`` (the report) and ``out/name.json`` (the summary it was written from), and
    the report on the console."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.md").write_text(text)
    (out / f"{name}.json").write_text(json.dumps(summary, indent=1, default=str))
    print(text)
