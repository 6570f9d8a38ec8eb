"""The report of a co-evolution run: PNG figures and a Markdown summary drawn from its run directory.

A report is drawn from ``rounds.jsonl`` and ``lineage.jsonl`` alone (docs/run-directory.md), so
it can be made mid-run, after a crash or on another machine. The records are the dataclasses of
``coevo.rundir.records``, read and validated by ``load_run`` (``coevo.report.data``, with the numbers the
figures and the summary share); the figures are ``coevo.report.figures``. This module holds the
tables: ``summary_markdown`` and ``round_table``, the end-of-round terminal table the loop prints.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rich.markup import escape
from rich.table import Table

from coevo.report.data import INSIDE_KEYS, TIME_KEYS, Run, load_run, outside_share, short, time_totals
from coevo.report.figures import figures_for, write_figures
from coevo.report.result import result_lines, run_result
from coevo.rundir.records import RoundRecord
from coevo.safety.secrets import redact_text


def write_report(run_dir: str | Path, out_dir: str | Path | None = None) -> Path:
    """Write the figures (``figures_for``) and ``summary.md`` into ``out_dir`` (default ``run_dir/report``)."""
    run = load_run(run_dir)
    out = Path(out_dir) if out_dir is not None else run.run_dir / "report"
    out.mkdir(parents=True, exist_ok=True)
    write_figures(run, out)
    (out / "summary.md").write_text(redact_text(summary_markdown(run)))  # its inputs are redacted already
    return out


# ------------------------------------------------------------------------------------------ tables
def _rate(x: float | None) -> str:
    return "—" if x is None else f"{x:.3f}"


def _loss(record: RoundRecord) -> str:
    step = record.grpo.last_step if record.grpo is not None else None
    loss = step.loss if step is not None else None
    return "—" if loss is None else f"{loss:.4f}"


def _infra(record: RoundRecord) -> int | None:
    """Infrastructure failures of the round's rollouts (None for a record that did not count them)."""
    return None if record.infra_failures is None else record.infra_failures.count


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def round_table(record: RoundRecord) -> Table:
    """The end-of-round terminal table: one row per variant (harness id, train pass on its share
    of the batch, that variant's shipped/rejected verdicts), the round's totals in the footer and
    its val pass@1, spawned variants, GRPO loss and seconds in the caption, then AEGIS's warnings,
    one a line (a failed meta-agent call among them: why a round judged no edit)."""
    total = record.edit_counts()
    table = Table(title=f"round {record.round} ({record.mode})", show_footer=True)
    footers = ("round", "", _rate(record.train.pass_rate), str(record.train.n_traces),
               str(total["shipped"]), str(total["rejected"]))
    columns = ("variant", "harness", "train pass", "traces", "shipped", "rejected")
    for name, footer in zip(columns, footers, strict=False):
        table.add_column(name, footer=footer, justify="left" if name in ("variant", "harness") else "right")
    for variant, harness_id in record.variants.items():
        stats = record.by_variant.get(variant)
        counts = record.edit_counts(variant)
        table.add_row(variant, harness_id[:12], _rate(stats.pass_rate if stats else None),
                      str(stats.n_traces) if stats else "0", str(counts["shipped"]), str(counts["rejected"]))
    infra = _infra(record)
    table.caption = (f"val pass@1 {_rate(record.val.pass_at_1 if record.val else None)} · "
                     f"spawned {total['spawned']} · "
                     f"GRPO loss {_loss(record)} · {record.seconds.get('total', 0.0):.1f} s"
                     + (f" · infrastructure failures {infra}" if infra else "")
                     + "".join(f"\nwarning: {escape(w)}" for w in record.warnings))  # a warning may quote [...]
    return table


def _infra_line(records: Sequence[RoundRecord]) -> list[str]:
    """The summary's line on infrastructure failures (none for runs that did not count them)."""
    counted = [(r.round, _infra(r)) for r in records if _infra(r) is not None]
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
    all_counts = [r.edit_counts() for r in recs]
    lines = [
        f"# Run report: {run.run_dir.name}",
        "",
        *[f"- {line}" for line in result_lines(run_result(recs, run.start))],
        "- figure: [result.png](result.png)",
        "",
        "## Run",
        "",
        f"- run dir: `{run.run_dir}`",
        f"- mode: {', '.join(run.modes)}",
        f"- rounds: {len(recs)} (rounds {recs[0].round}–{recs[-1].round})",
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
    for r, c in zip(recs, all_counts, strict=False):
        variants = ", ".join(f"{n}={h[:8]}" for n, h in r.variants.items())
        lines.append(f"| {r.round} | {_rate(r.train.pass_rate)} | "
                     f"{_rate(r.val.pass_at_1 if r.val else None)} | {c['shipped']} | {c['spawned']} | "
                     f"{c['rejected']} | {variants} | {_loss(r)} | {r.seconds.get('total', 0.0):.1f} |")
    lines += ["", "## Edits", ""]
    rows = [(r, v) for r in recs for v in r.verdicts]
    if rows:
        lines += ["| round | variant | edits | gate | verdict | fail→pass | pass→fail | reason |",
                  "|---|---|---|---|---|---|---|---|"]
        lines += [f"| {r.round} | {v.variant} | {_cell(v.describe_edits())} | {v.gate} | "
                  f"{r.verdict_status(v)} | {len(v.fail_to_pass)} | {len(v.pass_to_fail)} | "
                  f"{_cell(short(v.reason, 120))} |" for r, v in rows]
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
    last_val = next((r for r in reversed(recs) if r.val is not None), None)
    last_test = next((r for r in reversed(recs) if r.test is not None), None)
    for label, rec, e in (("validation", last_val, last_val and last_val.val),
                          ("test", last_test, last_test and last_test.test)):
        if rec is None or e is None:
            lines.append(f"- {label}: not evaluated")
        else:
            lines.append(f"- {label} (round {rec.round}, {len(e.outcomes)} tasks): pass@1 "
                         f"{_rate(e.pass_at_1)}, pass@{e.k} {_rate(e.pass_at_k)}")
    lines += ["", "## Meta-agent tokens", ""]
    ledger = recs[-1].meta_tokens
    stages = {k: v for k, v in ledger.items() if isinstance(v, dict)}
    if stages:
        lines += ["| stage | calls | cached | prompt tokens | completion tokens | seconds |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {name} | {u.get('calls', 0)} | {u.get('cached', 0)} | {u.get('prompt_tokens', 0)} | "
                  f"{u.get('completion_tokens', 0)} | {u.get('seconds', 0.0):.1f} |" for name, u in stages.items()]
        lines.append("")
    lines.append(f"Total meta-agent tokens (cumulative): {ledger.get('total_tokens', 0)}")
    lines += ["", "## Figures", ""]
    lines += [f"- [{name[:-4].replace('_', ' ')}]({name})" for name in figures_for(run)]
    return "\n".join(lines) + "\n"
