"""What ``coevo evolve`` reports from its run directory: the starting against the final harness per
split (pass@1, and pass@k when k > 1) and every judged edit with its verdict, as JSON and Markdown."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from coevo.report.data import Run
    from coevo.rundir.records import StartRecord


def evolve_summary(run: Run, start: StartRecord, k: int, env_name: str) -> dict:
    """What ``coevo evolve`` reports from its run directory (``run``: ``coevo.report.data.load_run``;
    ``start``: its ``StartRecord``): pass@1 and pass@k of the starting → the final harness per
    split, and every judged edit with its verdict (shipped ones with their flips, rejected ones with
    the reason, the statistical gate's evidence: counts, statistic, episodes)."""
    from coevo.agent.outcomes import pass_rates

    last = run.records[-1]
    splits = {}
    for name in ("val", "test"):
        before, after = getattr(start, name), getattr(last, name)
        if before is None or after is None:
            continue
        (b1, bk), (a1, ak) = pass_rates(before.outcomes), pass_rates(after.outcomes)
        splits[name] = {"tasks": len(before.outcomes), "pass@1": [b1, a1], f"pass@{k}": [bk, ak]}
    verdicts = [v for r in run.records for v in r.verdicts]
    edits = [{"round": v.round, "variant": v.variant, "edits": [e.describe() for e in v.proposal.edits],
              "cluster": v.proposal.cluster, "gate": v.gate, "reason": v.reason,
              "fail_to_pass": v.fail_to_pass, "pass_to_fail": v.pass_to_fail,
              "evidence": v.evidence.to_dict() if v.evidence is not None else None}
             for v in verdicts]
    return {"env": env_name, "k": k, "rounds": len(run.records), "splits": splits,
            "shipped": [e for e, v in zip(edits, verdicts, strict=False) if v.ship],
            "rejected": [e for e, v in zip(edits, verdicts, strict=False) if not v.ship and not v.undecided],
            "undecided": [e for e, v in zip(edits, verdicts, strict=False) if v.undecided],
            "meta_tokens": last.meta_tokens}


def evolve_markdown(summary: dict) -> str:
    k = summary["k"]
    lines = [f"# coevo evolve: {summary['env']}", "",
             f"{summary['rounds']} rounds (mode=harness_only); the starting → the final harness "
             "(routed variants).", "",
             "| split | tasks | pass@1 before | pass@1 after |"
             + (f" pass@{k} before | pass@{k} after |" if k > 1 else ""),
             "|---|---|---|---|" + ("---|---|" if k > 1 else "")]
    for name, row in summary["splits"].items():  # pass@k only when it is not pass@1
        at_k = f" {row[f'pass@{k}'][0]:.3f} | {row[f'pass@{k}'][1]:.3f} |" if k > 1 else ""
        lines.append(f"| {name} | {row['tasks']} | {row['pass@1'][0]:.3f} | {row['pass@1'][1]:.3f} |{at_k}")
    groups = (("Shipped", summary["shipped"]), ("Rejected", summary["rejected"]),
              ("Undecided", summary.get("undecided", [])))
    for title, rows in groups:
        lines += ["", f"## {title} edits ({len(rows)})", ""]
        lines += [f"- round {e['round']} [{e['variant']}] {'; '.join(e['edits'])} (cluster {e['cluster']}): "
                  f"{e['reason']}" for e in rows] or ["none"]
    lines += ["", f"meta-agent tokens: {summary['meta_tokens']}", ""]
    return "\n".join(lines)
