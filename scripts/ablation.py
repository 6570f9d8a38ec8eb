"""The co-evolution ablation: static vs harness-only vs model-only vs co-evolution, several seeds.

    python scripts/ablation.py [--preset efficacy|protocol|tiny] [--seeds 0 1 2]
                               [--modes static harness_only model_only coevolve]
                               [--out runs/ablation-<preset>] [-- extra Hydra overrides]

Every (mode, seed) is one ``train.py`` run of the preset's experiment config (same env, same
train/val/test split, same seed across the four arms; the seed changes sampling and batch order),
in its own run directory ``<out>/<mode>-s<seed>``, so an interrupted ablation resumes where it
stopped: finished runs are read back, a killed one resumes from its last round. Seeds are the outer
loop, so a partial ablation already compares every arm.

The report (``<out>/ablation.md``, ``<out>/ablation.json``, ``<out>/ablation.png``) gives each
arm's test pass@1 and pass@k with a 95% bootstrap interval, and for each difference that says what
a half adds (harness_only - static, model_only - static, coevolve - harness_only, coevolve - static)
a *paired* bootstrap (``coevo.report.stats``): the arms ran on the same test tasks with the same seeds, so task-level
differences are resampled together (tasks drawn with replacement, the same draw for every seed),
which removes the between-task variance that unpaired intervals would carry. The figure shows the
learning curves (train pass rate and tool-use rate per round) and the test pass rates.

Presets: ``efficacy`` (100 sealed test tasks, 3 seeds, groups of 8, four rounds that evolve in
rounds 0 and 1 and train in each, 4 GRPO passes a round; run with ``--jobs 2``), ``protocol`` (a
one-round check of the protocol, ~45 min), ``tiny``
(the tiny random model on the arithmetic env; the test suite runs it in about a minute).
``--against DIR`` reports each arm against the same arm and seeds in another ablation directory
(a run with one override changed), paired, with each side's GRPO signal per round.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from coevo.report.data import load_run
from coevo.report.experiment import ARMS, DIFFERENCES, ci_bars, markdown_table, paired_differences, write_outputs
from coevo.report.figures import round_axis
from coevo.report.stats import interval, points
from coevo.rundir.records import RoundRecord

ROOT = Path(__file__).resolve().parents[1]
MODES = ARMS
METRICS = ("pass_at_1", "pass_at_k")
LONGEST_FIRST = ("coevolve", "model_only", "harness_only", "static")
"""The order runs are started in: every seed of the longest arm first (the arms that train take
longest), so no long run starts last beside nothing."""
PRESETS: dict[str, list[str]] = {
    "efficacy": ["experiment=efficacy"],
    "protocol": ["experiment=ablation"],
    "tiny": ["experiment=smoke", "env.args.n_tasks=40", "env.args.max_operand=4", "rounds=2", "val_limit=0",
             "test=true", "test_limit=6", "eval_attempts=2", "trainer.steps_per_round=2"],
}
"""Preset → the Hydra overrides every arm gets (before the user's own, which win)."""


# ------------------------------------------------------------------------------------ runs
def run_one(mode: str, seed: int, out: Path, overrides: Sequence[str], threads: int | None = None
            ) -> list[RoundRecord]:
    """Run (or resume, or just read) one arm; returns its round records (the last holds the test).
    With ``threads`` the run gets that many intra-op threads and writes its console to
    ``<run_dir>.log`` (runs side by side would interleave it)."""
    run_dir = out / f"{mode}-s{seed}"
    cmd = [sys.executable, str(ROOT / "train.py"), *overrides, f"mode={mode}", f"seed={seed}",
           f"name={out.name}-{mode}-s{seed}", f"hydra.run.dir={run_dir}"]
    start = time.perf_counter()
    if not (run_dir / "report" / "summary.md").is_file():
        print(f"[ablation] {mode} seed {seed}: {' '.join(cmd[1:])}", flush=True)
        if threads is None:
            subprocess.run(cmd, cwd=ROOT, check=True)
        else:
            env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
            with open(out / f"{mode}-s{seed}.log", "a") as log:
                subprocess.run(cmd, cwd=ROOT, check=True, env=env, stdout=log, stderr=subprocess.STDOUT)
    records = load_run(run_dir).records
    if records[-1].test is None:
        raise RuntimeError(f"{run_dir}: the final round has no test evaluation (the preset must set test=true)")
    print(f"[ablation] {mode} seed {seed}: test pass@1 {records[-1].test.pass_at_1:.3f} "
          f"({time.perf_counter() - start:.0f} s)", flush=True)
    return records


# ------------------------------------------------------------------------------------ statistics
def task_matrix(runs: Sequence[list[RoundRecord]], metric: str) -> tuple[list[str], np.ndarray]:
    """(task ids, [seeds, tasks]) of one arm's per-task test score: pass@1 is the task's share of
    passing attempts, pass@k whether any attempt passed. Task ids are sorted so arms line up."""
    tasks = sorted(runs[0][-1].test.outcomes)
    rows = []
    for records in runs:
        outcomes = records[-1].test.outcomes
        if sorted(outcomes) != tasks:
            raise ValueError("the seeds of an arm were tested on different tasks; the ablation needs one sealed test split")
        rows.append([float(np.mean(outcomes[t])) if metric == "pass_at_1" else float(any(outcomes[t]))
                     for t in tasks])
    return tasks, np.asarray(rows)


def summarise(results: dict[str, list[list[RoundRecord]]], seed: int = 0) -> dict:
    """Per-arm rates and paired differences (in points), each with its 95% bootstrap interval."""
    rng = np.random.default_rng(seed)
    arms: dict[str, dict] = {}
    matrices: dict[tuple[str, str], np.ndarray] = {}
    for mode, runs in results.items():
        arms[mode] = {"seeds": len(runs), "k": runs[0][-1].test.k,
                      "minutes": float(np.mean([sum(r.seconds.get("total", 0.0) for r in rec) / 60 for rec in runs]))}
        for metric in METRICS:
            tasks, m = task_matrix(runs, metric)
            matrices[(mode, metric)] = m
            arms[mode]["tasks"] = len(tasks)
            arms[mode][metric] = points(m, rng)
        arms[mode]["test_tool_use"] = 100 * float(np.mean([rec[-1].test.tool_use_rate for rec in runs]))
        arms[mode]["curves"] = {key: [100 * float(np.mean([getattr(rec[r].train, key) for rec in runs]))
                                      for r in range(len(runs[0]))]
                                for key in ("pass_rate", "tool_use_rate")}
    diffs: dict[str, dict] = {}
    for metric in METRICS:
        by_arm = {mode: matrices[(mode, metric)] for mode in results}
        for name, d in paired_differences(by_arm, DIFFERENCES, rng).items():
            diffs.setdefault(name, {"seeds": d["seeds"]})[metric] = d["points"]
    return {"arms": arms, "differences": diffs}


def against(results: dict[str, list[list[RoundRecord]]], seeds: Sequence[int], other: Path, seed: int = 0) -> dict:
    """Each arm against the same arm and seeds in another ablation directory ``other`` (a run with
    one override changed, e.g. ``buffer.critic_traces=false``): the paired test pass@1 difference
    (this − other), and per round of each side the share of GRPO groups with equal rewards and the
    GRPO minutes, which say what the changed setting did to the training signal and its cost."""
    rng = np.random.default_rng(seed)
    out = {}
    for mode, runs in results.items():
        theirs = []
        for s in seeds:
            run_dir = other / f"{mode}-s{s}"
            if not (run_dir / "report" / "summary.md").is_file():
                raise SystemExit(f"--against {other}: {run_dir.name} has not finished there")
            theirs.append(load_run(run_dir).records)
        mine_m, theirs_m = task_matrix(runs, "pass_at_1")[1], task_matrix(theirs, "pass_at_1")[1]
        if mine_m.shape != theirs_m.shape:
            raise SystemExit(f"--against {other}: {mode} was tested on other tasks there")

        def signal(recs: list[list[RoundRecord]], scores: np.ndarray) -> dict[str, list[float | None]]:
            zero = [[r.grpo.zero_variance_fraction if r.grpo else None for r in rec] for rec in recs]
            by_round = zip(*zero, strict=False)  # only the rounds every seed reached
            return {"zero_variance_by_round": [None if None in col else float(np.mean(col)) for col in by_round],
                    "grpo_minutes": float(np.mean([sum(r.seconds.get("grpo", 0.0) for r in rec) / 60 for rec in recs])),
                    "pass_at_1": points(scores, rng)}
        out[mode] = {"seeds": len(seeds), "this": signal(runs, mine_m), "other": signal(theirs, theirs_m),
                     "difference": points(mine_m - theirs_m, rng)}
    return out


# ------------------------------------------------------------------------------------ report
def report_text(summary: dict, command: str, wall_minutes: float) -> str:
    arms, diffs = summary["arms"], summary["differences"]
    k = next(iter(arms.values()))["k"]
    at_k = k > 1  # with one attempt per test task pass@k is pass@1: one column
    rates = ("pass_at_1", "pass_at_k") if at_k else ("pass_at_1",)
    arrow = lambda values: " → ".join(f"{v:.0f}" for v in values)  # noqa: E731
    arm_table = markdown_table(
        ["arm", "seeds", "test tasks", "test pass@1 (%)", *([f"test pass@{k} (%)"] if at_k else []),
         "test tool use (%)", "train pass by round (%)", "train tool use by round (%)", "minutes per run"],
        [[mode, a["seeds"], a["tasks"], *(interval(a[r]) for r in rates), f"{a['test_tool_use']:.1f}",
          arrow(a["curves"]["pass_rate"]), arrow(a["curves"]["tool_use_rate"]), f"{a['minutes']:.1f}"]
         for mode, a in arms.items()])
    diff_table = markdown_table(
        ["difference (points, paired bootstrap 95% CI)", "seeds", "pass@1", *([f"pass@{k}"] if at_k else [])],
        [[name, d["seeds"], *(interval(d[r], signed=True) for r in rates)] for name, d in diffs.items()])
    parts = [f"`{command}`", arm_table, *([diff_table] if diffs else [])]
    if summary.get("against"):
        zero = lambda v: ", ".join("-" if x is None else f"{x:.2f}" for x in v)  # noqa: E731
        parts += [f"Against {summary['against_dir']} (same arm, same seeds):", markdown_table(
            ["arm", "seeds", "test pass@1 here (%)", "there (%)", "here − there (paired)",
             "equal-reward share of groups by round, here", "there", "GRPO minutes here", "there"],
            [[mode, a["seeds"], interval(a["this"]["pass_at_1"]), interval(a["other"]["pass_at_1"]),
              interval(a["difference"], signed=True), zero(a["this"]["zero_variance_by_round"]),
              zero(a["other"]["zero_variance_by_round"]), f"{a['this']['grpo_minutes']:.1f}",
              f"{a['other']['grpo_minutes']:.1f}"] for mode, a in summary["against"].items()])]
    parts.append(f"wall clock: {wall_minutes:.1f} min (runs already finished are read back, not re-run)")
    return "\n\n".join(parts) + "\n"


def figure(summary: dict, path: Path) -> None:
    """Learning curves (train pass rate, tool-use rate per round) and test pass rates with their CIs."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    arms = summary["arms"]
    fig = Figure(figsize=(12, 3.6))
    FigureCanvasAgg(fig)
    for i, (key, title) in enumerate((("pass_rate", "train pass rate"), ("tool_use_rate", "train tool use"))):
        ax = fig.add_subplot(1, 3, i + 1)
        for mode, a in arms.items():
            ax.plot(range(len(a["curves"][key])), a["curves"][key], marker="o", label=mode)
        round_axis(ax, range(max(len(a["curves"][key]) for a in arms.values())))
        ax.set_ylabel("%")
        ax.set_title(f"{title} (mean over seeds)")
        if i == 0:
            ax.legend(fontsize=8)
    ax = fig.add_subplot(1, 3, 3)
    k = next(iter(arms.values()))["k"]
    series = (("pass@1", "pass_at_1"), (f"pass@{k}", "pass_at_k")) if k > 1 else (("pass@1", "pass_at_1"),)
    width = 0.72 / len(series)  # with k = 1, pass@k is pass@1: one bar per arm, not two equal ones
    for i, (label, key) in enumerate(series):
        ci_bars(ax, list(arms), [a[key] for a in arms.values()], width=width,
                offset=(i - (len(series) - 1) / 2) * width, label=label)
    ax.set_ylabel("test pass rate (%)")
    ax.set_title("sealed test split (95% bootstrap CI)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: Sequence[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="efficacy")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    ap.add_argument("--out", type=Path, default=None, help="default: runs/ablation-<preset>")
    ap.add_argument("--jobs", type=int, default=1,
                    help="runs side by side, each with cores/jobs intra-op threads and its console in "
                         "<out>/<mode>-s<seed>.log (the efficacy preset at 3 rounds took 52.7 min with --jobs 2 on 2 cores; "
                         "docs/PERF.md)")
    ap.add_argument("--against", type=Path, default=None,
                    help="another ablation directory: each arm against the same arm and seeds there (paired)")
    ap.add_argument("overrides", nargs="*", help="extra Hydra overrides for every run (after --)")
    args = ap.parse_args(argv)
    out = args.out or ROOT / "runs" / f"ablation-{args.preset}"
    out.mkdir(parents=True, exist_ok=True)
    overrides = [*PRESETS[args.preset], *args.overrides]
    results: dict[str, list[list[dict]]] = {}
    began = time.perf_counter()
    if args.jobs < 1:
        raise SystemExit(f"--jobs must be >= 1, got {args.jobs}")
    # Longest arms first (every seed of one before the next), so that side-by-side jobs end together rather than one
    # cheap run waiting on a long one; the report keeps the canonical arm order.
    runs = [(mode, seed) for mode in sorted(args.modes, key=LONGEST_FIRST.index) for seed in args.seeds]
    threads = max(1, (os.cpu_count() or 1) // args.jobs) if args.jobs > 1 else None
    with ThreadPoolExecutor(args.jobs) as pool:
        records = list(pool.map(lambda ms: run_one(*ms, out, overrides, threads), runs))
    for mode in args.modes:
        results[mode] = [recs for (m, _seed), recs in zip(runs, records, strict=False) if m == mode]
    summary = summarise(results)
    if args.against is not None:
        summary |= {"against": against(results, args.seeds, args.against), "against_dir": str(args.against)}
    command = " ".join(["python scripts/ablation.py", "--preset", args.preset, "--seeds", *map(str, args.seeds),
                        *(["--against", str(args.against)] if args.against else []),
                        *(["--", *args.overrides] if args.overrides else [])])
    text = report_text(summary, command, (time.perf_counter() - began) / 60)
    write_outputs(out, "ablation", text, {"command": command, **summary})
    figure(summary, out / "ablation.png")
    print(f"figure: {out / 'ablation.png'}")
    return summary


if __name__ == "__main__":
    main()
