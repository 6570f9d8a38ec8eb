"""The co-evolution ablation: static vs harness-only vs model-only vs co-evolution, several seeds.

    python scripts/ablation.py [--seeds 0 1 2] [--modes static harness_only model_only coevolve]
                               [--out runs/ablation] [-- extra Hydra overrides]

Every (mode, seed) is one ``train.py`` run with ``experiment=ablation`` (same env, same
train/val/test split; the seed changes sampling and batch order), in its own run directory
``<out>/<mode>-s<seed>``, so an interrupted ablation resumes where it stopped: finished runs are
read back, a killed one resumes from its last round. At the end it reads each run's final test
evaluation and writes ``<out>/ablation.md`` (test pass@1 and pass@k, mean ± std over seeds) and
``<out>/ablation.png``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODES = ("static", "harness_only", "model_only", "coevolve")


def run_one(mode: str, seed: int, out: Path, extra: list[str]) -> dict:
    """Run (or resume, or just read) one arm; returns its final record."""
    run_dir = out / f"{mode}-s{seed}"
    cmd = [sys.executable, str(ROOT / "train.py"), "experiment=ablation", f"mode={mode}", f"seed={seed}",
           f"name=ablation-{mode}-s{seed}", f"hydra.run.dir={run_dir}", *extra]
    start = time.perf_counter()
    done = run_dir / "report" / "summary.md"
    if not done.is_file():
        print(f"[ablation] {mode} seed {seed}: {' '.join(cmd[1:])}", flush=True)
        subprocess.run(cmd, cwd=ROOT, check=True)
    last = json.loads((run_dir / "rounds.jsonl").read_text().splitlines()[-1])
    if not last.get("test"):
        raise RuntimeError(f"{run_dir}: the final round has no test evaluation (experiment=ablation sets test=true)")
    print(f"[ablation] {mode} seed {seed}: test pass@1 {last['test']['pass_at_1']:.3f} "
          f"({time.perf_counter() - start:.0f} s)", flush=True)
    return last


def mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def table(results: dict[str, list[dict]]) -> str:
    k = next(iter(results.values()))[0]["test"]["k"]
    lines = [f"| mode | seeds | test pass@1 | test pass@{k} | train pass (last round) | minutes per run |",
             "|---|---|---|---|---|---|"]
    for mode, recs in results.items():
        p1 = mean_std([100 * r["test"]["pass_at_1"] for r in recs])
        pk = mean_std([100 * r["test"]["pass_at_k"] for r in recs])
        tr = mean_std([100 * r["train"]["pass_rate"] for r in recs])
        minutes = statistics.fmean(r["minutes"] for r in recs)
        lines.append(f"| {mode} | {len(recs)} | {p1[0]:.1f} ± {p1[1]:.1f} | {pk[0]:.1f} ± {pk[1]:.1f} | "
                     f"{tr[0]:.1f} ± {tr[1]:.1f} | {minutes:.1f} |")
    return "\n".join(lines)


def figure(results: dict[str, list[dict]], path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.5, 3.6))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    modes = list(results)
    for offset, key, label in ((-0.18, "pass_at_1", "pass@1"), (0.18, "pass_at_k", "pass@k")):
        stats = [mean_std([100 * r["test"][key] for r in results[m]]) for m in modes]
        ax.bar([i + offset for i in range(len(modes))], [s[0] for s in stats], width=0.36,
               yerr=[s[1] for s in stats], capsize=3, label=label)
    ax.set_xticks(range(len(modes)), modes)
    ax.set_ylabel("test pass rate (%)")
    ax.set_title("coevo ablation (mean ± std over seeds)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "ablation")
    ap.add_argument("overrides", nargs="*", help="extra Hydra overrides for every run (after --)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, list[dict]] = {}
    began = time.perf_counter()
    for seed in args.seeds:  # seeds outermost: a partial ablation already compares every mode
        for mode in args.modes:
            record = run_one(mode, seed, args.out, args.overrides)
            run_dir = args.out / f"{mode}-s{seed}"
            record["minutes"] = sum(json.loads(line)["seconds"].get("total", 0.0)
                                    for line in (run_dir / "rounds.jsonl").read_text().splitlines()) / 60
            results.setdefault(mode, []).append(record)
    text = table(results)
    command = " ".join(["python scripts/ablation.py", "--seeds", *map(str, args.seeds), *(
        ["--", *args.overrides] if args.overrides else [])])
    report = (f"`{command}`\n\n{text}\n\nwall clock: {(time.perf_counter() - began) / 60:.1f} min "
              f"(runs already finished are read back, not re-run)\n")
    (args.out / "ablation.md").write_text(report)
    figure(results, args.out / "ablation.png")
    print(report)
    print(f"figure: {args.out / 'ablation.png'}")


if __name__ == "__main__":
    main()
