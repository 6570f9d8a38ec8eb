"""The report of a co-evolution run: PNG figures and a Markdown summary drawn from its run directory.

A report is drawn from ``rounds.jsonl`` and ``lineage.jsonl`` alone (docs/run-directory.md), so
it can be made mid-run, after a crash or on another machine. ``load_run`` validates every line
up front: a truncated or foreign file fails with its path, line and field instead of a KeyError
deep inside a plot. The numbers the figures and the summary share (edit counts, the per-task
matrix, the lineage layout, the time totals) are pure functions of a ``Run`` so they can be
checked against slow twins; ``round_table`` is the end-of-round terminal table the loop prints.

matplotlib is imported inside ``write_report`` only, and figures are drawn on an Agg canvas
without pyplot, so importing this module (the loop does, every round) costs nothing and no
global backend is switched.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rich.markup import escape
from rich.table import Table

from coevo.config import MODES
from coevo.harness.edits import Edit
from coevo.secrets import redact_text

TIME_KEYS = ("rollout", "logprobs", "digest", "plan", "critic", "grpo", "eval", "checkpoint", "other")
"""The time breakdown of a round, in the order the figure stacks it."""

INSIDE_KEYS = ("rollout", "logprobs", "critic", "grpo", "eval")
"""Phases spent in model forward/backward/generation (the Critic re-runs candidates, eval generates)."""

LINEAGE_HOWS = ("start", "shipped", "spawned", "selected")
FIGURES = ("pass_rate.png", "lineage.png", "task_matrix.png", "time_breakdown.png")

_NUM = (int, float)
_ROUND_FIELDS = ("round", "mode", "model_version", "seconds", "train", "val", "test", "variants", "by_variant",
                 "evolve", "grpo", "meta_tokens", "buffer")
_LINEAGE_FIELDS = ("id", "parent_id", "round", "variant", "how", "edits", "hypothesis")


@dataclass
class Run:
    """A run directory's parsed records (sorted by round) and harness lineage (file order)."""

    run_dir: Path
    records: list[dict[str, Any]]
    lineage: list[dict[str, Any]]

    @property
    def rounds(self) -> list[int]:
        return [r["round"] for r in self.records]

    @property
    def modes(self) -> list[str]:
        """Distinct modes in round order (one, unless the directory was resumed under another mode)."""
        return list(dict.fromkeys(r["mode"] for r in self.records))


# ---------------------------------------------------------------------------------------- loading
def load_run(run_dir: str | Path) -> Run:
    """Parse and validate ``rounds.jsonl`` and ``lineage.jsonl`` of ``run_dir``.

    Raises ValueError naming the file and line for malformed JSON, a missing required field, a
    value of the wrong type or a repeated round, and a ValueError saying the run has no completed
    round yet when ``rounds.jsonl`` is missing or empty (a run killed in its first round).
    A missing ``lineage.jsonl`` reads as an empty lineage.
    """
    root = Path(run_dir)
    if not root.is_dir():
        raise ValueError(f"run directory {str(root)!r} does not exist")
    rounds_path = root / "rounds.jsonl"
    rows = _read_jsonl(rounds_path) if rounds_path.is_file() else []
    if not rows:
        raise ValueError(f"run {str(root)!r} has no completed round yet ({rounds_path} is missing or empty)")
    records: list[dict[str, Any]] = []
    seen: dict[int, int] = {}
    for line, row in rows:
        where = f"{rounds_path}:{line}"
        record = check_record(row, where)
        if record["round"] in seen:
            raise ValueError(f"{where}: round {record['round']} repeats the record on line {seen[record['round']]}")
        seen[record["round"]] = line
        records.append(record)
    records.sort(key=lambda r: r["round"])
    lineage_path = root / "lineage.jsonl"
    rows = _read_jsonl(lineage_path) if lineage_path.is_file() else []
    lineage = [_check_lineage(row, f"{lineage_path}:{line}") for line, row in rows]
    return Run(run_dir=root, records=records, lineage=lineage)


def _read_jsonl(path: Path) -> list[tuple[int, Any]]:
    """(1-based line number, parsed value) of every non-blank line."""
    out = []
    for number, text in enumerate(path.read_text().splitlines(), start=1):
        if not text.strip():
            continue
        try:
            out.append((number, json.loads(text)))
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{number}: malformed JSON ({e.msg} at column {e.colno})") from None
    return out


def _field(obj: Mapping[str, Any], key: str, kinds: type | tuple[type, ...], where: str, path: str,
           nullable: bool = False) -> Any:
    """``obj[key]`` checked against ``kinds`` (bool is never a number here)."""
    name = f"{path}.{key}" if path else key
    if key not in obj:
        raise ValueError(f"{where}: required field {name!r} is missing")
    value = obj[key]
    if value is None and nullable:
        return None
    kinds = kinds if isinstance(kinds, tuple) else (kinds,)
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        expected = " or ".join(k.__name__ for k in kinds) + (" or null" if nullable else "")
        raise ValueError(f"{where}: field {name!r} must be {expected}, got {type(value).__name__}")
    return value


def _object(value: Any, where: str, what: str) -> dict[str, Any]:
    """``value`` if it is a JSON object; a malformed file is bad input, hence ValueError."""
    if not isinstance(value, dict):
        raise ValueError(f"{where}: {what} must be a JSON object, got {type(value).__name__}")  # noqa: TRY004
    return value


def _check_outcomes(obj: Mapping[str, Any], where: str, path: str) -> None:
    outcomes = _field(obj, "outcomes", dict, where, path)
    for task_id, attempts in outcomes.items():
        if not isinstance(attempts, list) or not all(isinstance(a, bool) for a in attempts):
            raise ValueError(f"{where}: field '{path}.outcomes.{task_id}' must be a list of booleans")


def _check_eval(record: Mapping[str, Any], split: str, where: str) -> None:
    obj = _field(record, split, dict, where, "", nullable=True)
    if obj is None:
        return
    for key in ("pass_at_1", "pass_at_k"):
        _field(obj, key, _NUM, where, split)
    _field(obj, "k", int, where, split)
    _check_outcomes(obj, where, split)


def _check_verdict(v: Any, where: str, path: str) -> None:
    _object(v, where, f"field {path!r}")
    _field(v, "variant", str, where, path)
    _field(v, "ship", bool, where, path)
    _field(v, "gate", str, where, path)
    _field(v, "reason", str, where, path)
    _field(v, "candidate_id", str, where, path, nullable=True)
    for key in ("fail_to_pass", "pass_to_fail"):
        _field(v, key, list, where, path)
    # optional: verdicts written before the statistical gate have neither
    if "undecided" in v:
        _field(v, "undecided", bool, where, path)
        if v["undecided"] and v["ship"]:
            raise ValueError(f"{where}: field '{path}' is both shipped and undecided")
    if "evidence" in v:
        evidence = _field(v, "evidence", dict, where, path, nullable=True)
        if evidence is not None:
            for key in ("pairs", "wins", "losses", "episodes"):
                _field(evidence, key, int, where, f"{path}.evidence")
            _field(evidence, "log_lr", _NUM, where, f"{path}.evidence")
    proposal = _field(v, "proposal", dict, where, path)
    for i, edit in enumerate(_field(proposal, "edits", list, where, f"{path}.proposal")):
        try:
            Edit.from_dict(dict(edit))
        except (TypeError, ValueError) as e:
            raise ValueError(f"{where}: field '{path}.proposal.edits[{i}]' is not an edit ({e})") from None


def check_record(record: Any, where: str = "record") -> dict[str, Any]:
    """Validate one RoundRecord (docs/run-directory.md); ``where`` prefixes every error message."""
    _object(record, where, "a round record")
    for key in _ROUND_FIELDS:
        if key not in record:
            raise ValueError(f"{where}: required field {key!r} is missing")
    _field(record, "round", int, where, "")
    _field(record, "model_version", int, where, "")
    if _field(record, "mode", str, where, "") not in MODES:
        raise ValueError(f"{where}: field 'mode' must be one of {MODES}, got {record['mode']!r}")
    seconds = _field(record, "seconds", dict, where, "")
    for key in seconds:
        _field(seconds, key, _NUM, where, "seconds")
    train = _field(record, "train", dict, where, "")
    _field(train, "pass_rate", _NUM, where, "train")
    _field(train, "n_traces", int, where, "train")
    _check_outcomes(train, where, "train")
    _check_eval(record, "val", where)
    _check_eval(record, "test", where)
    for name in _field(record, "variants", dict, where, ""):
        _field(record["variants"], name, str, where, "variants")
    for name in _field(record, "by_variant", dict, where, ""):
        stats = _field(record["by_variant"], name, dict, where, "by_variant")
        _field(stats, "pass_rate", _NUM, where, f"by_variant.{name}")
        _field(stats, "n_traces", int, where, f"by_variant.{name}")
    evolve = _field(record, "evolve", dict, where, "", nullable=True)
    if evolve is not None:
        for i, v in enumerate(_field(evolve, "verdicts", list, where, "evolve")):
            _check_verdict(v, where, f"evolve.verdicts[{i}]")
        _field(evolve, "shipped", list, where, "evolve")
        _field(evolve, "spawned", list, where, "evolve")
        if not all(isinstance(w, str) for w in _field(evolve, "warnings", list, where, "evolve")):
            raise ValueError(f"{where}: field 'evolve.warnings' must be a list of strings")
    grpo = _field(record, "grpo", dict, where, "", nullable=True)
    if grpo is not None and "loss" in grpo:
        _field(grpo, "loss", _NUM, where, "grpo")
    _field(record, "meta_tokens", dict, where, "")
    _field(record, "buffer", dict, where, "", nullable=True)
    infra = record.get("infra_failures")  # optional: records written before rounds counted them lack it
    if infra is not None:
        _object(infra, where, "field 'infra_failures'")
        if _field(infra, "count", int, where, "infra_failures") < 0:
            raise ValueError(f"{where}: field 'infra_failures.count' must be >= 0")
        for source in _field(infra, "by_source", dict, where, "infra_failures"):
            _field(infra["by_source"], source, int, where, "infra_failures.by_source")
    return record


def infra_count(record: Mapping[str, Any]) -> int | None:
    """Infrastructure failures of the round's rollouts (None for a record that did not count them)."""
    infra = record.get("infra_failures")
    return None if infra is None else int(infra["count"])


def _check_lineage(entry: Any, where: str) -> dict[str, Any]:
    _object(entry, where, "a lineage entry")
    for key in _LINEAGE_FIELDS:
        if key not in entry:
            raise ValueError(f"{where}: required field {key!r} is missing")
    _field(entry, "id", str, where, "")
    _field(entry, "parent_id", str, where, "", nullable=True)
    _field(entry, "round", int, where, "")
    _field(entry, "variant", str, where, "")
    _field(entry, "hypothesis", str, where, "")
    if _field(entry, "how", str, where, "") not in LINEAGE_HOWS:
        raise ValueError(f"{where}: field 'how' must be one of {LINEAGE_HOWS}, got {entry['how']!r}")
    if not all(isinstance(e, str) for e in _field(entry, "edits", list, where, "")):
        raise ValueError(f"{where}: field 'edits' must be a list of strings")
    return entry


# ------------------------------------------------------------------------------------ derived data
def round_warnings(record: Mapping[str, Any]) -> list[str]:
    """AEGIS's warnings of the round: failed meta-agent calls, pathology alerts, variants lost to
    infrastructure failures (none when AEGIS did not run)."""
    return list(record["evolve"]["warnings"]) if record.get("evolve") else []


def verdicts(record: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The round's Critic verdicts (none when AEGIS did not run: model_only and static rounds)."""
    return list(record["evolve"]["verdicts"]) if record.get("evolve") else []


def verdict_status(record: Mapping[str, Any], verdict: Mapping[str, Any]) -> str:
    """``shipped``, ``spawned`` (not shipped, but kept as a new variant this round), ``undecided``
    (the statistical gate wants more evidence; judged again later) or ``rejected``."""
    if verdict["ship"]:
        return "shipped"
    if verdict.get("undecided"):
        return "undecided"
    spawned_ids = {record["variants"].get(name) for name in (record.get("evolve") or {}).get("spawned", [])}
    if verdict["candidate_id"] is not None and verdict["candidate_id"] in spawned_ids:
        return "spawned"
    return "rejected"


def edit_counts(record: Mapping[str, Any], variant: str | None = None) -> dict[str, int]:
    """Verdicts of the round (of one ``variant`` when given) by status."""
    counts = {"shipped": 0, "spawned": 0, "rejected": 0, "undecided": 0}
    for v in verdicts(record):
        if variant is None or v["variant"] == variant:
            counts[verdict_status(record, v)] += 1
    return counts


def describe_edits(verdict: Mapping[str, Any]) -> str:
    """The proposal's edits in ``Edit.describe()`` form, joined by '; '."""
    return "; ".join(Edit.from_dict(dict(e)).describe() for e in verdict["proposal"]["edits"])


def matrix_source(run: Run) -> str:
    """``val`` when any round evaluated validation (tasks held fixed across rounds), else ``train``."""
    return "val" if any(r["val"] is not None for r in run.records) else "train"


def _natural(task_id: str) -> tuple[list[Any], str]:
    """Sort key ordering digit runs by value (t2 before t10); the id itself breaks ties (t01 vs t1)."""
    return [int(p) if i % 2 else p for i, p in enumerate(re.split(r"(\d+)", task_id))], task_id


def task_matrix(run: Run) -> tuple[list[str], list[int], np.ndarray]:
    """(task ids, rounds, values): values[i, j] is the pass rate of task i's attempts in round j.

    Outcomes come from ``matrix_source(run)``; the columns are the rounds that have them (every
    round for train, the evaluated rounds for val). Tasks are in natural id order. A task absent
    from a round (or with no attempts) is NaN.
    """
    source = matrix_source(run)
    columns = [(r["round"], r[source]["outcomes"]) for r in run.records if r[source] is not None]
    task_ids = sorted({t for _, outcomes in columns for t in outcomes}, key=_natural)
    row = {t: i for i, t in enumerate(task_ids)}
    values = np.full((len(task_ids), len(columns)), np.nan)
    for j, (_, outcomes) in enumerate(columns):
        for task_id, attempts in outcomes.items():
            if attempts:
                values[row[task_id], j] = sum(attempts) / len(attempts)
    return task_ids, [r for r, _ in columns], values


def lineage_layout(lineage: Sequence[Mapping[str, Any]]) -> dict[str, tuple[int, int]]:
    """harness id → (x, depth): depth = number of ancestors found in the lineage, x = order of
    appearance (by round, then file order) among the harnesses at that depth. A repeated id keeps
    its first entry; a parent missing from the lineage makes its child a root."""
    first: dict[str, Mapping[str, Any]] = {}
    for entry in lineage:
        first.setdefault(entry["id"], entry)
    depth: dict[str, int] = {}
    for hid in first:
        seen, parent = {hid}, first[hid]["parent_id"]
        while parent in first and parent not in seen:
            seen.add(parent)
            parent = first[parent]["parent_id"]
        depth[hid] = len(seen) - 1
    ids = list(first)
    order = sorted(range(len(ids)), key=lambda i: (first[ids[i]]["round"], i))
    next_x: dict[int, int] = {}
    layout: dict[str, tuple[int, int]] = {}
    for i in order:
        d = depth[ids[i]]
        layout[ids[i]] = (next_x.get(d, 0), d)
        next_x[d] = next_x.get(d, 0) + 1
    return layout


def time_totals(run: Run) -> dict[str, float]:
    """Seconds per phase (``TIME_KEYS``) summed over the rounds; a phase a round lacks counts 0."""
    return {k: float(sum(r["seconds"].get(k, 0.0) for r in run.records)) for k in TIME_KEYS}


def outside_share(totals: Mapping[str, float]) -> float:
    """Share of the summed breakdown spent outside model forward/backward/generation (``INSIDE_KEYS``)."""
    total = sum(totals[k] for k in TIME_KEYS)
    return 1.0 - sum(totals[k] for k in INSIDE_KEYS) / total if total > 0 else 0.0


# ------------------------------------------------------------------------------------------ tables
def _rate(x: float | None) -> str:
    return "—" if x is None else f"{x:.3f}"


def _loss(record: Mapping[str, Any]) -> str:
    grpo = record.get("grpo") or {}
    return f"{grpo['loss']:.4f}" if "loss" in grpo else "—"


def _short(text: str, n: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def round_table(record: Mapping[str, Any]) -> Table:
    """The end-of-round terminal table: one row per variant (harness id, train pass on its share
    of the batch, that variant's shipped/rejected verdicts), the round's totals in the footer and
    its val pass@1, spawned variants, GRPO loss and seconds in the caption, then AEGIS's warnings,
    one a line (a failed meta-agent call among them: why a round judged no edit)."""
    check_record(dict(record), f"round record {record.get('round', '?')}")
    total = edit_counts(record)
    table = Table(title=f"round {record['round']} ({record['mode']})", show_footer=True)
    footers = ("round", "", _rate(record["train"]["pass_rate"]), str(record["train"]["n_traces"]),
               str(total["shipped"]), str(total["rejected"]))
    for name, footer in zip(("variant", "harness", "train pass", "traces", "shipped", "rejected"), footers):
        table.add_column(name, footer=footer, justify="left" if name in ("variant", "harness") else "right")
    for variant, harness_id in record["variants"].items():
        stats = record["by_variant"].get(variant)
        counts = edit_counts(record, variant)
        table.add_row(variant, harness_id[:12], _rate(stats["pass_rate"] if stats else None),
                      str(stats["n_traces"]) if stats else "0", str(counts["shipped"]), str(counts["rejected"]))
    val = record["val"]
    infra = infra_count(record)
    table.caption = (f"val pass@1 {_rate(val['pass_at_1'] if val else None)} · spawned {total['spawned']} · "
                     f"GRPO loss {_loss(record)} · {record['seconds'].get('total', 0.0):.1f} s"
                     + (f" · infrastructure failures {infra}" if infra else "")
                     + "".join(f"\nwarning: {escape(w)}" for w in round_warnings(record)))  # a warning may quote [...]
    return table


def _infra_line(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """The summary's line on infrastructure failures (none for runs that did not count them)."""
    counted = [(r["round"], infra_count(r)) for r in records if infra_count(r) is not None]
    if not counted:
        return []
    rounds = ", ".join(f"round {r}: {n}" for r, n in counted if n)
    return [f"- infrastructure failures (policy, environment or tool crashes; in no GRPO group or failure "
            f"cluster): {sum(n for _, n in counted)} traces" + (f" ({rounds})" if rounds else "")]


def summary_markdown(run: Run) -> str:
    """The run's summary for people (the figures are linked, not embedded)."""
    recs = run.records
    totals = time_totals(run)
    grand = sum(totals.values())
    all_counts = [edit_counts(r) for r in recs]
    lines = [
        f"# Run report: {run.run_dir.name}",
        "",
        f"- run dir: `{run.run_dir}`",
        f"- mode: {', '.join(run.modes)}",
        f"- rounds: {len(recs)} (rounds {recs[0]['round']}–{recs[-1]['round']})",
        (f"- edits: {sum(c['shipped'] for c in all_counts)} shipped, {sum(c['spawned'] for c in all_counts)} "
         f"spawned, {sum(c['rejected'] for c in all_counts)} rejected"
         + (f", {undecided} undecided (judged again with more evidence)"
            if (undecided := sum(c['undecided'] for c in all_counts)) else "")),
        *_infra_line(recs),
        "",
        "## Rounds",
        "",
        "| round | train pass | val pass@1 | shipped | spawned | rejected | variants | GRPO loss | seconds |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r, c in zip(recs, all_counts):
        variants = ", ".join(f"{n}={h[:8]}" for n, h in r["variants"].items())
        lines.append(f"| {r['round']} | {_rate(r['train']['pass_rate'])} | "
                     f"{_rate(r['val']['pass_at_1'] if r['val'] else None)} | {c['shipped']} | {c['spawned']} | "
                     f"{c['rejected']} | {variants} | {_loss(r)} | {r['seconds'].get('total', 0.0):.1f} |")
    lines += ["", "## Edits", ""]
    rows = [(r, v) for r in recs for v in verdicts(r)]
    if rows:
        lines += ["| round | variant | edits | gate | verdict | fail→pass | pass→fail | reason |",
                  "|---|---|---|---|---|---|---|---|"]
        lines += [f"| {r['round']} | {v['variant']} | {_cell(describe_edits(v))} | {v['gate']} | "
                  f"{verdict_status(r, v)} | {len(v['fail_to_pass'])} | {len(v['pass_to_fail'])} | "
                  f"{_cell(_short(v['reason'], 120))} |" for r, v in rows]
    else:
        lines.append("No edits were judged.")
    lines += ["", "## Time", "", "| phase | seconds | share |", "|---|---|---|"]
    lines += [f"| {k} | {totals[k]:.1f} | {100 * totals[k] / grand if grand else 0.0:.1f}% |" for k in TIME_KEYS]
    lines += [
        f"| total | {grand:.1f} | 100.0% |",
        "",
        (f"Time outside model forward/backward/generation: {100 * outside_share(totals):.1f}% "
         f"(inside = {' + '.join(INSIDE_KEYS)} seconds; shares are of the summed breakdown)."),
        "",
        "## Final figures",
        "",
    ]
    last_val = next((r for r in reversed(recs) if r["val"] is not None), None)
    last_test = next((r for r in reversed(recs) if r["test"] is not None), None)
    for label, rec, split in (("validation", last_val, "val"), ("test", last_test, "test")):
        if rec is None:
            lines.append(f"- {label}: not evaluated")
        else:
            e = rec[split]
            lines.append(f"- {label} (round {rec['round']}, {len(e['outcomes'])} tasks): pass@1 "
                         f"{_rate(e['pass_at_1'])}, pass@{e['k']} {_rate(e['pass_at_k'])}")
    lines += ["", "## Meta-agent tokens", ""]
    ledger = recs[-1]["meta_tokens"]
    stages = {k: v for k, v in ledger.items() if isinstance(v, dict)}
    if stages:
        lines += ["| stage | calls | cached | prompt tokens | completion tokens | seconds |", "|---|---|---|---|---|---|"]
        lines += [f"| {name} | {u.get('calls', 0)} | {u.get('cached', 0)} | {u.get('prompt_tokens', 0)} | "
                  f"{u.get('completion_tokens', 0)} | {u.get('seconds', 0.0):.1f} |" for name, u in stages.items()]
        lines.append("")
    lines.append(f"Total meta-agent tokens (cumulative): {ledger.get('total_tokens', 0)}")
    lines += ["", "## Figures", ""]
    lines += [f"- [{name[:-4].replace('_', ' ')}]({name})" for name in FIGURES]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------- figures
def write_report(run_dir: str | Path, out_dir: str | Path | None = None) -> Path:
    """Write the four figures and ``summary.md`` into ``out_dir`` (default ``run_dir/report``)."""
    run = load_run(run_dir)
    out = Path(out_dir) if out_dir is not None else run.run_dir / "report"
    out.mkdir(parents=True, exist_ok=True)
    for name, draw in zip(FIGURES, (_draw_pass_rate, _draw_lineage, _draw_task_matrix, _draw_time)):
        _save(draw(run), out / name)
    (out / "summary.md").write_text(redact_text(summary_markdown(run)))  # its inputs are redacted already
    return out


def _figure(width: float, height: float) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Any, path: Path) -> None:
    fig.savefig(path, format="png", bbox_inches="tight")


def _round_axis(ax: Any, rounds: Sequence[int]) -> None:
    """Whole-number round ticks (every round while they fit), half a round of margin each side."""
    from matplotlib.ticker import MaxNLocator

    ax.set_xlim(min(rounds) - 0.5, max(rounds) + 0.5)
    if len(rounds) <= 30:
        ax.set_xticks(list(rounds))
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("round")


def _draw_pass_rate(run: Run) -> Any:
    fig = _figure(9, 5)
    ax = fig.add_subplot()
    rounds = run.rounds
    train = [r["train"]["pass_rate"] for r in run.records]
    ax.plot(rounds, train, "-o", color="tab:blue", label="train pass rate", zorder=2)
    variants = list(dict.fromkeys(v for r in run.records for v in r["by_variant"]))
    if len(variants) > 1:
        for i, v in enumerate(variants):
            pts = [(r["round"], r["by_variant"][v]["pass_rate"]) for r in run.records if v in r["by_variant"]]
            ax.plot(*zip(*pts), "--", lw=1, alpha=0.6, color=f"C{(i + 4) % 10}", label=f"train · {v}")
    val = [(r["round"], r["val"]["pass_at_1"]) for r in run.records if r["val"] is not None]
    if val:
        ax.plot(*zip(*val), "-s", color="tab:green", label="val pass@1")
    test = [(r["round"], r["test"]["pass_at_1"]) for r in run.records if r["test"] is not None]
    if test:
        ax.plot(*zip(*test), "*", ms=16, color="tab:red", label="test pass@1", linestyle="none")
    shipped_label, rejected_label = "shipped edit", "rejected edits (count)"
    for r, y in zip(run.records, train):
        shipped = [v for v in verdicts(r) if v["ship"]]
        if shipped:
            ax.plot(r["round"], y, "^", ms=12, color="tab:orange", zorder=3, label=shipped_label)
            shipped_label = "_"
            text = "\n".join(_short((f"{v['variant']}: " if len(variants) > 1 else "") + describe_edits(v), 36)
                             for v in shipped)
            ax.annotate(text, (r["round"], y), xytext=(6, 10), textcoords="offset points", fontsize=7)
        rejected = edit_counts(r)["rejected"]
        if rejected:
            ax.plot(r["round"], -0.05, "x", ms=9, mew=2, color="tab:gray", label=rejected_label)
            rejected_label = "_"
            ax.annotate(str(rejected), (r["round"], -0.05), xytext=(6, -3), textcoords="offset points", fontsize=8)
    ax.set_ylim(-0.1, 1.1)
    _round_axis(ax, rounds)
    ax.set_ylabel("pass rate")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    ax.set_title(f"Pass rate per round ({', '.join(run.modes)})")
    return fig


def _draw_lineage(run: Run) -> Any:
    layout = lineage_layout(run.lineage)
    width = max((x for x, _ in layout.values()), default=0) + 1
    depth = max((d for _, d in layout.values()), default=0) + 1
    fig = _figure(max(6.0, 2.4 * width), max(3.0, 1.3 * depth + 1))
    ax = fig.add_subplot()
    ax.set_axis_off()
    if not layout:
        ax.text(0.5, 0.5, "no lineage recorded", ha="center", va="center")
        return fig
    entries = {e["id"]: e for e in reversed(run.lineage)}  # first entry wins, as in the layout
    variants = list(dict.fromkeys(e["variant"] for e in run.lineage))
    colour = {v: f"C{i % 10}" for i, v in enumerate(variants)}
    markers = {"start": "s", "shipped": "o", "spawned": "D", "selected": "^"}
    for hid, (x, d) in layout.items():
        parent = entries[hid]["parent_id"]
        if parent in layout:
            px, pd = layout[parent]
            ax.plot([px, x], [-pd, -d], "-", color="0.6", lw=1, zorder=1)
    for hid, (x, d) in layout.items():
        e = entries[hid]
        ax.plot(x, -d, markers[e["how"]], ms=10, color=colour[e["variant"]], zorder=2)
        edit = "start" if e["how"] == "start" else _short("; ".join(e["edits"]) or e["how"], 28)
        when = "start" if e["round"] < 0 else f"r{e['round']}"
        ax.annotate(f"{hid[:8]} · {when}\n{edit}", (x, -d), xytext=(0, -12), textcoords="offset points",
                    ha="center", va="top", fontsize=7)
    for v in variants:
        ax.plot([], [], "o", color=colour[v], label=v)
    ax.legend(title="variant", loc="upper right", fontsize=8)
    ax.set_xlim(-0.6, width - 0.4)
    ax.set_ylim(-(depth - 1) - 0.7, 0.4)
    ax.set_title("Harness lineage (■ start, ● shipped, ◆ spawned)")
    return fig


def _draw_task_matrix(run: Run) -> Any:
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


def _draw_time(run: Run) -> Any:
    fig = _figure(max(6.0, 0.3 * len(run.records) + 4), 4.5)
    ax = fig.add_subplot()
    bottom = np.zeros(len(run.records))
    for i, key in enumerate(TIME_KEYS):
        heights = np.array([float(r["seconds"].get(key, 0.0)) for r in run.records])
        ax.bar(run.rounds, heights, bottom=bottom, color=f"C{i}", label=key, width=0.8)
        bottom += heights
    _round_axis(ax, run.rounds)
    ax.set_ylabel("seconds")
    ax.legend(fontsize=8, bbox_to_anchor=(1.01, 1), loc="upper left")
    ax.set_title("Time per round by phase")
    return fig
