"""Did GRPO improve the model? Test pass@1 before and after training, per-step learning figures.

    python scripts/learning_curve.py RUN_DIR [RUN_DIR ...] [--out DIR]

Each RUN_DIR is one ``train.py`` run with ``test=true`` (one per seed, the same config): its
``start.json`` holds the sealed test split under the starting model, its last round record the
same tasks under the trained one. The difference after − before is a paired task bootstrap (the
same tasks in both, resampled together across seeds; ``coevo.report.stats.bootstrap``). Every GRPO step's
figures (``grpo.steps`` of the round records) are tabled and drawn: reward mean/std of the step's
traces, the share of zero-variance groups, ratio mean and clip fraction, approximate KL to the
behaviour policy, the sampled-token entropy and the gradient norm: what tells a practitioner
whether learning is happening, and if not, what limits it.

Writes ``DIR/learning_curve.md``, ``.json`` and ``.png`` (default DIR: the first run's parent).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from coevo.report.data import load_run
from coevo.report.experiment import ci_bars, markdown_table, write_outputs
from coevo.report.stats import interval, points
from coevo.rundir.records import Evaluation, StartRecord

STEP_FIGURES = ("reward_mean", "reward_std", "zero_variance_fraction", "ratio_mean", "clip_fraction", "approx_kl",
                "entropy", "grad_norm", "loss", "sequences")


def _scores(evaluation: Evaluation, tasks: list[str]) -> list[float]:
    """Per task pass@1: the share of its attempts that passed."""
    return [float(np.mean(evaluation.outcomes[t])) for t in tasks]


def collect(run_dirs: Sequence[Path]) -> dict:
    """Before/after matrices [seeds, tasks], tool use, and every step's figures, per seed."""
    before, after, tool_use, steps, train = [], [], [], [], []
    tasks: list[str] | None = None
    for run_dir in run_dirs:
        run = load_run(run_dir)
        start = StartRecord.from_dict(json.loads((run_dir / "start.json").read_text()), str(run_dir / "start.json"))
        end = run.records[-1].test
        if start.test is None or end is None:
            raise SystemExit(f"{run_dir}: the run did not evaluate the test split (train.py test=true)")
        if tasks is None:
            tasks = sorted(start.test.outcomes)
        if sorted(start.test.outcomes) != tasks or sorted(end.outcomes) != tasks:
            raise SystemExit(f"{run_dir}: tested on other tasks than {run_dirs[0]}; the seeds need one sealed split")
        before.append(_scores(start.test, tasks))
        after.append(_scores(end, tasks))
        tool_use.append((start.test.tool_use_rate, end.tool_use_rate))
        steps.append([row | {"round": rec.round} for rec in run.records if rec.grpo is not None
                      for row in (step.to_dict() for step in rec.grpo.steps)])
        train.append([rec.train.pass_rate for rec in run.records])
    return {"tasks": tasks or [], "before": np.asarray(before), "after": np.asarray(after), "tool_use": tool_use,
            "steps": steps, "train": train}


def summarise(data: dict, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    before, after = data["before"], data["after"]
    n_steps = min(len(s) for s in data["steps"])
    curves = {key: [float(np.mean([s[i][key] for s in data["steps"]])) for i in range(n_steps)] for key in STEP_FIGURES}
    return {
        "seeds": len(before), "tasks": len(data["tasks"]),
        "before": points(before, rng),
        "after": points(after, rng),
        "difference": points(after - before, rng),
        "tool_use": [[100 * b, 100 * a] for b, a in data["tool_use"]],
        "steps": n_steps, "curves": curves,
        "train_pass_by_round": [[100 * p for p in seed_rates] for seed_rates in data["train"]],
    }


def report_text(summary: dict, command: str) -> str:
    return "\n\n".join([
        f"# GRPO learning curve ({summary['seeds']} seeds, {summary['tasks']} sealed test tasks)",
        f"```bash\n{command}\n```",
        markdown_table(["test pass@1 (%)", "before", "after", "after - before (paired bootstrap 95% CI)"],
                       [["mean over seeds", interval(summary["before"]), interval(summary["after"]),
                         interval(summary["difference"], signed=True)]]),
        "Test tool use (%) before → after, per seed: " + ", ".join(f"{b:.0f} → {a:.0f}" for b, a in summary["tool_use"]),
        "Train pass rate (%) by round, per seed: "
        + "; ".join(" → ".join(f"{p:.0f}" for p in rates) for rates in summary["train_pass_by_round"]),
        "Per GRPO step (mean over seeds):",
        markdown_table(["step", *STEP_FIGURES], [[i + 1, *(f"{summary['curves'][k][i]:.3g}" for k in STEP_FIGURES)]
                                                 for i in range(summary["steps"])])]) + "\n"


def figure(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(1, 4, figsize=(16, 3.6))
    steps = range(1, summary["steps"] + 1)
    c = summary["curves"]
    axes[0].plot(steps, c["reward_mean"], marker="o", label="reward mean")
    axes[0].plot(steps, c["zero_variance_fraction"], marker=".", label="zero-variance groups")
    axes[0].set_title("train reward per GRPO step")
    axes[1].plot(steps, c["clip_fraction"], label="clip fraction")
    axes[1].plot(steps, c["approx_kl"], label="approx KL (behaviour)")
    axes[1].plot(steps, c["ratio_mean"], label="ratio mean")
    axes[1].set_title("off-policy reuse")
    axes[2].plot(steps, c["entropy"], label="entropy (sampled tokens)")
    axes[2].plot(steps, c["grad_norm"], label="grad norm")
    axes[2].set_title("policy")
    for ax in axes[:3]:
        ax.set_xlabel("optimizer step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend(fontsize=7)
    ci_bars(axes[3], ["before", "after"], [summary["before"], summary["after"]])
    axes[3].set_title(f"test pass@1, {summary['tasks']} tasks (95% CI)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: Sequence[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", type=Path, nargs="+", help="run directories, one per seed")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    out = args.out or args.runs[0].parent
    out.mkdir(parents=True, exist_ok=True)
    summary = summarise(collect(args.runs))
    text = report_text(summary, " ".join(["python scripts/learning_curve.py", *map(str, args.runs)]))
    write_outputs(out, "learning_curve", text, summary)
    figure(summary, out / "learning_curve.png")
    return summary


if __name__ == "__main__":
    main()
