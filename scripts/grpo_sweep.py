"""Which LoRA rank, learning rate, KL weight and group size? One round's buffered groups trained
under each setting from the same starting weights, then scored on the validation split.

    python scripts/grpo_sweep.py RUN_DIR [--round 0] [--steps 4] [--step-traces 24] [--limit 115] \
        [--setting NAME:key=value,key=value ...] [--out DIR]

RUN_DIR is a finished ``train.py`` run that trained (``model_only`` or ``coevolve``) and kept its
replay buffer. Every setting starts from the run's starting weights (a fresh LoRA adapter from the
run's model seed), takes ``--steps`` optimizer steps on the round's buffered groups with their cached
behaviour log-probs (the round's own rollouts, the Critic's re-runs left out; minibatches of
``--step-traces`` as the loop takes them), and is scored by pass@1 on the run's validation split
under the run's starting harness, against the same split under the untrained weights. Holding the
data fixed isolates the trainer's settings from rollout noise (every setting sees the same traces);
the cost is that it measures one round's worth of learning, not a run's.

A setting is ``NAME:key=value,...`` with keys ``lr``, ``beta`` (KL weight to the adapter-disabled
reference), ``lora_r`` (alpha = 2r, as the presets), ``group`` (the first G attempts of each task;
at most the run's attempts). Unset keys keep the run's values.

Writes ``DIR/grpo_sweep.md`` and ``.json`` (default DIR: RUN_DIR/../sweep).
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from coevo.report.experiment import markdown_table, write_outputs
from coevo.report.stats import interval, points

KEYS = {"lr": float, "beta": float, "lora_r": int, "group": int}
STEP_COLUMNS = ("approx_kl", "clip_fraction", "grad_norm", "entropy", "kl")
"""The last GRPO step's figures each setting's row shows, in table order."""
"""Setting key → its type; what a setting may change."""


def parse_setting(text: str) -> tuple[str, dict]:
    """``"NAME:lr=1e-4,lora_r=4"`` → (NAME, {"lr": 1e-4, "lora_r": 4}); a ValueError names bad keys."""
    name, _, body = text.partition(":")
    values = {}
    for part in filter(None, body.split(",")):
        key, _, value = part.partition("=")
        if key not in KEYS:
            raise ValueError(f"setting {text!r}: unknown key {key!r}; choose from {sorted(KEYS)}")
        values[key] = KEYS[key](value)
    if not name:
        raise ValueError(f"setting {text!r}: give it a name, NAME:key=value,...")
    return name, values


def first_attempts(traces: list, versions: list[int], group: int) -> tuple[list, list[int]]:
    """The first ``group`` traces of each task (in buffer order: attempt order), with their versions."""
    seen: dict[str, int] = {}
    kept = []
    for t, v in zip(traces, versions, strict=True):
        seen[t.task_id] = seen.get(t.task_id, 0) + 1
        if seen[t.task_id] <= group:
            kept.append((t, v))
    return [t for t, _ in kept], [v for _, v in kept]


def main(argv: Sequence[str] | None = None) -> dict:
    from coevo.agent.rollouts import RolloutService
    from coevo.buffers import ReplayBuffer
    from coevo.config.schema import load_run_config
    from coevo.envs.load import make_env
    from coevo.loop.builders import build_policy, start_harness
    from coevo.loop.round_grpo import CRITIC, step_batches
    from coevo.policy.load import load_model
    from coevo.trainers.grpo import GRPOTrainer, apply_lora

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", type=Path)
    ap.add_argument("--round", type=int, default=0, help="the round whose buffered groups every setting trains on")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--step-traces", type=int, default=24, help="traces of groups with a spread per step (0: all)")
    ap.add_argument("--limit", type=int, default=115, help="validation tasks scored")
    ap.add_argument("--setting", action="append", default=[], help="NAME:key=value,... (repeat)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    settings = dict(parse_setting(s) for s in args.setting) or {"run's": {}}
    out = args.out or args.run.parent / "sweep"
    out.mkdir(parents=True, exist_ok=True)

    cfg = load_run_config(args.run)
    buffer = ReplayBuffer(args.run / "buffer", capacity=cfg.buffer.capacity)
    entries = [e for e in buffer.query(round=args.round) if e.variant != CRITIC]
    if not entries:
        raise SystemExit(f"{args.run}: no buffered rollouts of round {args.round}")
    traces, versions = buffer.load(entries), [e.model_version for e in entries]
    buffer.close()
    env = make_env(cfg.env.name, cfg.env.args)
    tasks = env.tasks("val")[: args.limit]
    harness = start_harness(cfg)

    def score(model, tok, label: str) -> dict[str, float]:
        policy, _ = build_policy(cfg, model, tok)
        policy.model_version = label  # no prefix cache crosses weights
        rollouts = RolloutService(policy, env, batch_size=cfg.rollout.batch_size, max_steps=cfg.rollout.max_steps,
                                  workers=cfg.rollout.workers, seed=cfg.seed)
        done = rollouts.run(harness, tasks, attempts=1, phase="eval", round=10**6, label=label)
        return {t.task_id: float(np.mean([tr.passed for tr in done.traces if tr.task_id == t.task_id])) for t in tasks}

    def fresh(lora_r: int):
        model, tok = load_model(cfg.model.name, device="cpu", dtype=cfg.model.dtype)
        return apply_lora(model, r=lora_r, alpha=2 * lora_r, dropout=cfg.model.lora_dropout), tok

    t0 = time.perf_counter()
    model, tok = fresh(cfg.model.lora_r)
    results = {"untrained": {"values": {}, "pass": score(model, tok, "untrained"), "steps": [], "seconds": 0.0}}
    print(f"untrained: val pass@1 {np.mean(list(results['untrained']['pass'].values())):.3f} "
          f"({time.perf_counter() - t0:.0f} s)", flush=True)
    for name, values in settings.items():
        t0 = time.perf_counter()
        group = values.get("group", cfg.rollout.attempts)
        if group > cfg.rollout.attempts:
            raise SystemExit(f"setting {name}: group {group} > the run's {cfg.rollout.attempts} attempts")
        part, part_versions = first_attempts(traces, versions, group)
        model, tok = fresh(values.get("lora_r", cfg.model.lora_r))
        trainer_cfg = dataclasses.replace(cfg.trainer, lr=values.get("lr", cfg.trainer.lr),
                                          beta=values.get("beta", cfg.trainer.beta))
        # the run's schedule (linear decay over all its rounds' steps): these are its first round's steps
        trainer = GRPOTrainer(model, trainer_cfg, pad_id=tok.pad_token_id,
                              total_steps=max(args.steps, cfg.rounds * cfg.trainer.steps_per_round),
                              loss_horizon=cfg.rollout.max_new_tokens)
        steps = [trainer.step(batch, versions=v).to_dict()
                 for batch, v in step_batches(part, part_versions, args.steps, args.step_traces or None,
                                              seed=f"{cfg.seed}-{args.round}")]
        trained = time.perf_counter() - t0
        results[name] = {"values": values, "pass": score(trainer.unwrapped, tok, name), "steps": steps,
                         "seconds": trained}
        print(f"{name} {values}: val pass@1 {np.mean(list(results[name]['pass'].values())):.3f}, "
              f"KL {steps[-1].get('approx_kl')}, clip {steps[-1].get('clip_fraction')} "
              f"({trained:.0f} s training, {time.perf_counter() - t0 - trained:.0f} s scoring)", flush=True)
    close = getattr(env, "close", None)
    if close is not None:
        close()

    rng = np.random.default_rng(0)
    ids = sorted(results["untrained"]["pass"])
    base = np.asarray([[results["untrained"]["pass"][t] for t in ids]])
    rows = {}
    for name, r in results.items():
        p = np.asarray([[r["pass"][t] for t in ids]])
        last = r["steps"][-1] if r["steps"] else {}
        rows[name] = {"values": r["values"], "pass": points(p, rng),
                      "vs_untrained": points(p - base, rng),
                      **{k: last.get(k) for k in (*STEP_COLUMNS, "zero_variance_fraction")},
                      "seconds": r["seconds"]}
    command = " ".join(["python scripts/grpo_sweep.py", str(args.run), "--round", str(args.round), "--steps",
                        str(args.steps), "--step-traces", str(args.step_traces), "--limit", str(args.limit),
                        *[f"--setting {s}" for s in args.setting]])
    summary = {"run": str(args.run), "round": args.round, "tasks": len(ids), "traces": len(traces), "rows": rows}
    write_outputs(out, "grpo_sweep", report_text(summary, command), summary)
    return summary


def report_text(summary: dict, command: str) -> str:
    num = lambda v: "" if v is None else f"{v:.3g}"  # noqa: E731
    rows = [[name, ", ".join(f"{k}={v}" for k, v in row["values"].items()) or "the run's", interval(row["pass"]),
             interval(row["vs_untrained"], signed=True), *(num(row[k]) for k in STEP_COLUMNS), f"{row['seconds']:.0f}"]
            for name, row in summary["rows"].items()]
    return "\n\n".join([
        f"# GRPO settings on round {summary['round']}'s {summary['traces']} buffered traces "
        f"({summary['tasks']} validation tasks)", f"```bash\n{command}\n```",
        markdown_table(["setting", "changed", "val pass@1 (%)", "− untrained (paired)", "approx KL", "clip fraction",
                        "grad norm", "entropy", "KL to reference", "s training"], rows),
        "Intervals: paired task bootstrap, 95%. Step figures: each setting's last step.\n"])


if __name__ == "__main__":
    main()
