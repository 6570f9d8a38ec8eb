"""coevo's GRPO next to TRL's GRPOTrainer on the same model, prompts, reward and budget.

The peer comparison: coevo should learn at least as fast per step and per second as TRL's
GRPOTrainer, the implementation most users would reach for instead. Both arms start from the same
SmolLM2-135M-Instruct + LoRA weights, see the same single-turn reasoning prompts in the same order
(P prompts x G completions per step) and are scored by coevo's runtime (lenient answer extraction,
then the env's verifier).

    python scripts/peer_trl.py                          # SmolLM2, 20 steps x 4 prompts x 8 completions
    python scripts/peer_trl.py --preset tiny            # the tiny random model: seconds (the test runs it)
    python scripts/peer_trl.py --harness examples/harnesses/lenient_tool_choice_demos.yaml   # the tool path

With ``--harness`` both arms run that harness's multi-call episodes (``--max-steps`` model calls,
default 3): coevo's loop as always, TRL's ``GRPOTrainer`` through its ``rollout_func`` extension
(``coevo.trainers.trl_rollout``: each completion is a coevo episode generated with TRL's current
weights, tool results masked out of TRL's loss), since TRL's own tool loop needs a chat template
with a response schema, which SmolLM2's lacks.

Writes ``<out>/peer_trl.json`` (settings, per-step rows), ``peer_trl.md`` (table), ``peer_trl.png``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import random
import shlex
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from coevo.agent.policy import Policy
from coevo.report.data import load_run
from coevo.report.experiment import markdown_table
from coevo.rundir.records import RoundRecord

ROOT = Path(__file__).resolve().parents[1]

ARMS = ("coevo", "trl")
PRESETS: dict[str, dict[str, Any]] = {
    # the setting: G >= 8 completions per prompt, a short completion budget for 2 CPU cores
    "smollm2": {"model": "smollm2", "steps": 20, "prompts": 4, "generations": 8, "max_new_tokens": 64,
                "keep_truncated": False},
    # seconds on a CPU; a random model never ends a completion within 8 tokens, so truncated ones are kept
    "tiny": {"model": "tiny", "steps": 2, "prompts": 2, "generations": 2, "max_new_tokens": 8,
             "keep_truncated": True},
}
LOSS_TYPES = {"token_mean": "dapo", "sequence_mean": "grpo", "dr_grpo": "dr_grpo"}
"""coevo's trainer.aggregation -> TRL's loss_type with the same token weights (see UNMATCHED); dr_grpo's
horizon is rollout.max_new_tokens in coevo and max_completion_length (set from it) in TRL."""
UNMATCHED = [
    "zero-variance groups: coevo drops them (GRPOTrainer's drop_zero_variance), so its token mean runs over the "
    "tokens of groups with a signal; TRL keeps them at advantage 0 in the denominator of its 'dapo' loss, "
    "which shrinks its gradient by the share of signal tokens before clipping and AdamW",
    "advantage epsilon: coevo (r - mean) / (std + 1e-6), TRL (r - mean) / (std + 1e-4)",
    "behaviour log-probs: coevo's replay buffer scores every completion in a no-grad forward after the "
    "rollout (its cost is in coevo's step time); TRL uses the detached current log-probs (one update per "
    "generation batch makes both ratios 1)",
    "sampling streams: each arm draws its own completions (same temperature and top_p = 1, different "
    "random numbers and decoding code: coevo's prefix-cached engine, TRL's model.generate)",
    "truncation: coevo excludes completions whose finish reason is 'length' (TokenAnnotation); TRL masks "
    "completions whose last token is not EOS or pad (mask_truncated_completions); both keep their rewards "
    "in the group statistics",
]
UNMATCHED_EPISODES = [
    *UNMATCHED[:3],
    "sampling streams: both arms generate with coevo's runtime and engine (TRL's through rollout_func) at "
    "the same temperature, each with its own random numbers",
    "truncation: coevo excludes a trace with a truncated call; TRL gets the same rule through the row's "
    "env_mask (coevo.trainers.trl_rollout.trace_row), both keep the reward in the group statistics",
    "sequences: coevo packs a trace's chained calls into one row and weighs each call as a sequence; TRL's row "
    "is the whole episode (the same tokens, the same token-mean loss); where a call does not extend the ones "
    "before it (a reply re-tokenised differently from its sampled ids, ~1 trace in 16), coevo trains the later "
    "calls as rows of their own and TRL's row ends before them (trace_row's calls_dropped)",
]
"""What differs on multi-call episodes (``--harness``): the first three as above, then these."""


class StepClock(TrainerCallback):
    """Wall seconds of each TRL optimizer step: on_step_begin fires before the step's first
    micro-batch (whose inputs trigger the generation) and on_step_end after the optimizer step, so
    the interval is generation + reward + update, what coevo's round times as rollout + log-probs + GRPO."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self._start = 0.0

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._start = time.perf_counter()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.seconds.append(time.perf_counter() - self._start)


class EchoPolicy(Policy):
    """A coevo Policy whose completion is a given text: coevo's runtime then runs the harness and the
    env's verifier on a completion TRL sampled, so both arms share one reward function. It also keeps
    the requests, which are the chat the harness builds for the task (TRL's prompt)."""

    model_version = "peer"

    def __init__(self, text: str) -> None:
        self.text = text
        self.requests: list[Any] = []

    def generate(self, requests: Sequence[Any]) -> list[Any]:
        from coevo.agent.policy import Generation

        self.requests.extend(requests)
        return [Generation(self.text, [], [], None) for _ in requests]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Flags; those left unset take the preset's value (explicit flags win over the preset)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="smollm2")
    ap.add_argument("--steps", type=int, help="optimizer steps per arm (coevo: rounds of one step)")
    ap.add_argument("--prompts", type=int, help="prompts per step (coevo: batch_tasks)")
    ap.add_argument("--generations", type=int, help="completions per prompt (coevo: rollout.attempts)")
    ap.add_argument("--lr", type=float, help="learning rate (default: configs/trainer/grpo_lora.yaml)")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--max-new-tokens", type=int)
    ap.add_argument("--keep-truncated", action=argparse.BooleanOptionalAction,
                    help="train on completions cut at max-new-tokens too (default: the preset's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--harness", type=Path, help="a harness YAML whose episodes both arms train on (default: the "
                    "lenient harness, single turn, no tools)")
    ap.add_argument("--max-steps", type=int, help="model calls per episode (default: 1; 3 with --harness)")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "peer_trl")
    ap.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    args = ap.parse_args(argv)
    for key, value in PRESETS[args.preset].items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    if args.generations < 2 or args.prompts < 1 or args.steps < 1 or args.max_new_tokens < 1:
        ap.error("--generations must be >= 2 (a GRPO group), --prompts, --steps and --max-new-tokens >= 1")
    if args.max_steps is None:
        args.max_steps = 3 if args.harness else 1
    if args.harness and not args.harness.is_file():
        ap.error(f"--harness {args.harness}: no such file")
    if args.temperature <= 0:
        ap.error("--temperature must be > 0: TRL's GRPOTrainer always samples")
    return args


def write_harness(out: Path) -> Path:
    """The lenient harness with no tools and one model call per episode, as a YAML that
    ``harness.start`` loads (coevo.loop.builders.start_harness then writes the sampling settings in)."""
    from coevo.harness.defaults import lenient_harness
    from coevo.harness.harness import Harness

    h = lenient_harness().set_param("tool_registry", "enabled", []).set_param("step_budget", "max_steps", 1)
    return Harness(h.processors, name="lenient-single-turn").save(out / "harness.yaml")


def compose_config(args: argparse.Namespace, out: Path, harness: Path) -> Any:
    """The main job's config (configs/train.yaml) turned into one GRPO step per round of
    P tasks x G attempts on ``harness``, model_only, nothing evaluated. The buffer holds
    exactly one round, so every step trains on its own completions only, as TRL's does."""
    from hydra import compose, initialize_config_dir

    from coevo.config.schema import register
    from coevo.loop.build import to_config
    from coevo.loop.config_check import check

    completions = args.prompts * args.generations
    overrides = [
        f"model={args.model}", "model.lora=true", "env=reasoning_easy", f"harness.start='{harness}'",
        "trainer=grpo_lora", "trainer.beta=0.0", "trainer.steps_per_round=1", "trainer.step_traces=null",
        "mode=model_only",
        f"rounds={args.steps}", f"batch_tasks={args.prompts}", f"rollout.attempts={args.generations}",
        f"rollout.temperature={args.temperature}", f"rollout.max_new_tokens={args.max_new_tokens}",
        f"rollout.max_steps={args.max_steps}", f"rollout.keep_truncated={str(args.keep_truncated).lower()}",
        f"rollout.batch_size={completions}", f"buffer.capacity={completions}", "val_limit=0", "test=false",
        f"seed={args.seed}", "name=peer_trl", f"run_dir='{out / 'coevo_run'}'", "logger=none",
        *([f"trainer.lr={args.lr}"] if args.lr is not None else []),
    ]
    register()
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = to_config(compose("train", overrides=overrides))
    check(cfg)
    return cfg


def step_batches(cfg: Any) -> tuple[Any, list[list[Any]]]:
    """(env, the task batch of every step): the train split and batches exactly as the coevo loop
    draws them (coevo.loop.round_plan.round_batches), which the TRL arm then reads in the same order."""
    from coevo.envs.load import make_env
    from coevo.evolution.reference import split_reference_pool
    from coevo.loop.round_plan import round_batches

    env = make_env(cfg.env.name, cfg.env.args)
    _, train = split_reference_pool(env.tasks("train"), cfg.evolution.reference_pool, cfg.seed)
    return env, round_batches(train, cfg.batch_tasks, cfg.seed, cfg.rounds)


def score(env: Any, harness: Any, task: Any, text: str) -> tuple[float, bool, list[dict[str, Any]]]:
    """(reward, passed, prompt) of ``text`` as the completion of ``task``'s one model call, through
    coevo's runtime: the harness builds the chat, parses the completion and extracts the answer
    (answer tags, else the last number), the env's verifier scores it. The reward is the verifier's
    score, which coevo trains on: the reasoning-gym scorers give partial credit (basic_arithmetic
    len(expected)/len(answer) when the answer contains the expected one), ``passed`` is full credit."""
    from coevo.agent.episode import Job
    from coevo.agent.runtime import run_episodes

    policy = EchoPolicy(text)
    trace = run_episodes([Job(task, harness)], policy, env, max_steps=1, workers=1)[0]
    if trace.error is not None:
        raise RuntimeError(f"scoring a completion of {task.task_id} failed: {trace.error}")
    return trace.reward, trace.passed, [dict(m) for m in policy.requests[0].messages]


def coevo_reward(env: Any, harness: Any, tasks: dict[str, Any],
                 calls: list[dict[str, Any]]) -> Callable[..., list[float]]:
    """TRL's reward function: ``score`` of each completion; it checks that TRL prompted with the
    chat the harness builds, and logs each call (one per generation batch, i.e. per step)."""

    def coevo_runtime_reward(prompts: list[Any], completions: list[Any], task_id: list[str], **_: Any) -> list[float]:
        rewards, passed = [], []
        for prompt, completion, tid in zip(prompts, completions, task_id, strict=True):
            value, ok, messages = score(env, harness, tasks[tid], completion[-1]["content"])
            if messages != [dict(m) for m in prompt]:
                raise RuntimeError(f"TRL prompted task {tid} with a chat the harness does not build")
            rewards.append(value)
            passed.append(ok)
        calls.append({"task_ids": list(dict.fromkeys(task_id)), "rewards": rewards, "passed": passed})
        return rewards

    return coevo_runtime_reward


def adapter_state(model: Any) -> dict[str, Any]:
    """A detached CPU copy of the LoRA weights (PEFT's adapter state dict)."""
    from peft import get_peft_model_state_dict

    return {k: v.detach().float().cpu().clone() for k, v in get_peft_model_state_dict(model).items()}


def adapter_change(before: dict[str, Any], after: dict[str, Any]) -> float:
    """L2 norm of the adapter's change: exactly 0 when no step moved it."""
    if before.keys() != after.keys():
        raise ValueError("the adapters before and after training have different parameters")
    return math.sqrt(sum(float((after[k] - before[k]).pow(2).sum()) for k in before))


@contextlib.contextmanager
def watch_adapter(seen: dict[str, Any]) -> Iterator[None]:
    """Record the LoRA model that coevo.loop.build.run creates (it applies the adapter itself and keeps
    it): its initial weights start the TRL arm, and the same object holds the trained weights after
    the run. Only observes; apply_lora is restored on exit."""
    import coevo.trainers.grpo as grpo

    original = grpo.apply_lora

    def apply_and_record(model: Any, **kwargs: Any) -> Any:
        lora = original(model, **kwargs)
        seen["model"], seen["initial"] = lora, adapter_state(lora)
        return lora

    grpo.apply_lora = apply_and_record
    try:
        yield
    finally:
        grpo.apply_lora = original


def coevo_row(record: RoundRecord) -> dict[str, Any]:
    """One round record of rounds.jsonl as a step row; its seconds are rollout + behaviour
    log-probs + GRPO (the checkpoint commit and bookkeeping are in seconds_round)."""
    s, grpo = record.seconds, record.grpo
    return {
        "step": record.round + 1,
        "reward": record.train.mean_reward,
        "pass_rate": record.train.pass_rate,
        "seconds": s.get("rollout", 0.0) + s.get("logprobs", 0.0) + s.get("grpo", 0.0),
        "seconds_round": s["total"],
        "generation_seconds": record.generation_seconds,
        "task_ids": list(record.train.outcomes),
        "zero_variance_fraction": grpo.zero_variance_fraction if grpo else None,
        "trained_tokens": grpo.last_step.tokens if grpo and grpo.last_step else None,
        "loss": grpo.last_step.loss if grpo and grpo.last_step else None,
        "harness": record.variants,
    }


def run_coevo(cfg: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """coevo's arm, built and run the way train.py does (coevo.loop.build.run) in mode=model_only.
    Returns (arm result, initial adapter)."""
    from coevo.loop.build import run

    run_dir = Path(cfg.run_dir)
    shutil.rmtree(run_dir, ignore_errors=True)  # an old run directory would be resumed, not trained
    seen: dict[str, Any] = {}
    random.seed(cfg.seed)
    began = time.perf_counter()
    with watch_adapter(seen):
        run(cfg)
    wall = time.perf_counter() - began
    rows = [coevo_row(record) for record in load_run(run_dir).records]
    change = adapter_change(seen["initial"], adapter_state(seen["model"]))
    result = {"rows": rows, "wall_s": wall, "lora_change": change, "run_dir": str(run_dir)}
    seen.pop("model")  # frees the trained model before the TRL arm loads its own
    return result, seen["initial"]


def lora_model(cfg: Any, initial: dict[str, Any] | None) -> tuple[Any, Any, bool | None]:
    """(model, tokenizer, whether the replayed initialisation already equalled ``initial``): the
    model loaded and wrapped as coevo.loop.build.run does it (same seeds, loader and apply_lora), then
    given the coevo arm's initial adapter, so both arms start from the same weights."""
    import torch
    from peft import set_peft_model_state_dict

    from coevo.loop.config_check import device_of
    from coevo.policy.load import load_model
    from coevo.trainers.grpo import apply_lora

    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    model, tok = load_model(cfg.model.name, device=device_of(cfg.model.device), dtype=cfg.model.dtype)
    model = apply_lora(model, r=cfg.model.lora_r, alpha=cfg.model.lora_alpha, dropout=cfg.model.lora_dropout)
    if initial is None:
        return model, tok, None
    mine = adapter_state(model)
    same = mine.keys() == initial.keys() and all(torch.equal(mine[k], initial[k]) for k in mine)
    set_peft_model_state_dict(model, initial)
    return model, tok, same


def trl_config(cfg: Any, out: Path) -> Any:
    """GRPOConfig with coevo's settings wherever TRL has the option: one optimizer step per
    generation batch of P x G completions (micro-batches of coevo's micro_batch_size), the same lr
    schedule, optimizer, clipping, advantage scaling, loss aggregation and truncation rule."""
    import torch
    from trl import GRPOConfig

    from coevo.loop.config_check import device_of

    t, completions = cfg.trainer, cfg.batch_tasks * cfg.rollout.attempts
    micro = t.micro_batch_size if completions % t.micro_batch_size == 0 else completions
    device = device_of(cfg.model.device)
    return GRPOConfig(
        output_dir=str(out / "trl_run"), max_steps=cfg.rounds, per_device_train_batch_size=micro,
        gradient_accumulation_steps=completions // micro, num_generations=cfg.rollout.attempts,
        max_completion_length=cfg.rollout.max_new_tokens, temperature=cfg.rollout.temperature, top_p=1.0,
        learning_rate=t.lr, lr_scheduler_type="linear", warmup_steps=t.warmup_steps, weight_decay=t.weight_decay,
        max_grad_norm=t.max_grad_norm, optim="adamw_torch" if t.optimizer == "adamw" else "sgd", beta=t.beta,
        epsilon=t.eps_low, epsilon_high=t.eps_high, scale_rewards="group" if t.scale_by_std else "none",
        loss_type=LOSS_TYPES[t.aggregation],
        # episodes (rollout_func) carry coevo's truncation rule in their env_mask (trace_row)
        mask_truncated_completions=not cfg.rollout.keep_truncated and cfg.rollout.max_steps == 1,
        num_iterations=1, shuffle_dataset=False, seed=cfg.seed, logging_steps=1, save_strategy="no",
        report_to="none", use_cpu=device == "cpu", bf16=device == "cuda" and torch.cuda.is_bf16_supported(),
        gradient_checkpointing=False, dataloader_num_workers=0, remove_unused_columns=False, disable_tqdm=True,
    )


def run_trl(cfg: Any, env: Any, harness: Any, batches: list[list[Any]], out: Path,
            initial: dict[str, Any] | None) -> dict[str, Any]:
    """TRL's arm: GRPOTrainer on the coevo arm's prompts in its order (no shuffling), rewarded by
    coevo's runtime. Per-step reward from trainer.state.log_history, step time from StepClock."""
    from datasets import Dataset
    from trl import GRPOTrainer

    tasks = {t.task_id: t for batch in batches for t in batch}
    model, tok, replayed = lora_model(cfg, initial)
    calls: list[dict[str, Any]] = []
    clock = StepClock()
    if cfg.rollout.max_steps == 1:  # single turn: TRL generates, coevo's runtime scores
        prompts = {tid: score(env, harness, task, "")[2] for tid, task in tasks.items()}
        dataset = Dataset.from_list([{"prompt": prompts[t.task_id], "task_id": t.task_id} for b in batches for t in b])
        extra = {"reward_funcs": coevo_reward(env, harness, tasks, calls)}
    else:  # episodes: coevo's runtime generates with TRL's weights (rollout_func), the prompt names the task
        from coevo.loop.builders import build_policy
        from coevo.trainers.trl_rollout import coevo_reward_func, episode_rollout_func

        def log(traces: list[Any], rows: list[dict[str, Any]]) -> None:
            calls.append({"task_ids": list(dict.fromkeys(t.task_id for t in traces)),
                          "rewards": [t.reward for t in traces], "passed": [t.passed for t in traces],
                          "calls_dropped": sum(r["calls_dropped"] for r in rows)})

        dataset = Dataset.from_list([{"prompt": t.task_id} for b in batches for t in b])
        extra = {"reward_funcs": coevo_reward_func,
                 "rollout_func": episode_rollout_func(env, harness, tasks, lambda m: build_policy(cfg, m, tok)[0],
                                                      max_steps=cfg.rollout.max_steps, workers=cfg.rollout.workers,
                                                      on_traces=log)}
    trainer = GRPOTrainer(model=model, args=trl_config(cfg, out), train_dataset=dataset, processing_class=tok,
                          callbacks=[clock], **extra)
    before = adapter_state(trainer.model)
    began = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - began
    logs = [e for e in trainer.state.log_history if "reward" in e]
    if not len(logs) == len(clock.seconds) == len(calls) == cfg.rounds:
        raise RuntimeError(f"TRL ran {len(clock.seconds)} steps with {len(logs)} reward logs and {len(calls)} reward "
                           f"calls; expected {cfg.rounds} of each")
    rows = [{"step": e["step"], "reward": e["reward"], "seconds": s, "trl_step_time": e.get("step_time"),
             "pass_rate": statistics.fmean(c["passed"]), "task_ids": c["task_ids"],
             "reward_check": statistics.fmean(c["rewards"]),
             "frac_reward_zero_std": e.get("frac_reward_zero_std"), "clipped_ratio": e.get("completions/clipped_ratio"),
             "loss": e.get("loss"), "calls_dropped": c.get("calls_dropped")}  # None: single turn
            for e, s, c in zip(logs, clock.seconds, calls, strict=True)]
    return {"rows": rows, "wall_s": wall, "lora_change": adapter_change(before, adapter_state(trainer.model)),
            "replayed_init_equal": replayed, "initial_adapter": "coevo's" if initial is not None else "replayed"}


def settings(cfg: Any, harness: Any) -> dict[str, Any]:
    """What both arms share, for the JSON and the table's footnote."""
    t = cfg.trainer
    return {"model": cfg.model.name, "lora": {"r": cfg.model.lora_r, "alpha": cfg.model.lora_alpha,
                                              "dropout": cfg.model.lora_dropout},
            "env": {"name": cfg.env.name, **cfg.env.args}, "harness": harness.id, "steps": cfg.rounds,
            "max_steps": cfg.rollout.max_steps,
            "prompts": cfg.batch_tasks, "generations": cfg.rollout.attempts,
            "completions_per_step": cfg.batch_tasks * cfg.rollout.attempts, "lr": t.lr,
            "temperature": cfg.rollout.temperature, "max_new_tokens": cfg.rollout.max_new_tokens, "beta": t.beta,
            "eps_low": t.eps_low, "eps_high": t.eps_high, "scale_by_std": t.scale_by_std,
            "aggregation": t.aggregation, "keep_truncated": cfg.rollout.keep_truncated,
            "micro_batch_size": t.micro_batch_size, "max_grad_norm": t.max_grad_norm, "seed": cfg.seed}


def mean(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


def table(arms: dict[str, dict[str, Any]], completions: int) -> str:
    """The markdown comparison: early and late reward (3-step means) and time per step."""
    rows = []
    for name, arm in arms.items():
        rewards = [r["reward"] for r in arm["rows"]]
        rows.append([name, len(rewards), completions, f"{mean(rewards[:3]):.3f}", f"{mean(rewards[-3:]):.3f}",
                     f"{mean([r['seconds'] for r in arm['rows']]):.2f}"])
    return markdown_table(["arm", "steps", "completions/step", "reward first 3 steps", "reward last 3 steps",
                           "mean s/step"], rows)


def figure(arms: dict[str, dict[str, Any]], path: Path) -> None:
    """Reward per step, and against cumulative wall seconds (the issue asks for both)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(9, 3.6))
    FigureCanvasAgg(fig)
    by_step, by_time = fig.subplots(1, 2)
    for name, arm in arms.items():
        steps = [r["step"] for r in arm["rows"]]
        rewards = [r["reward"] for r in arm["rows"]]
        elapsed = [sum(r["seconds"] for r in arm["rows"][: i + 1]) for i in range(len(steps))]
        by_step.plot(steps, rewards, marker="o", label=name)
        by_time.plot(elapsed, rewards, marker="o", label=name)
    by_step.set_xlabel("optimizer step")
    by_step.xaxis.set_major_locator(MaxNLocator(integer=True))
    by_time.set_xlabel("wall seconds (generation + update)")
    for ax in (by_step, by_time):
        ax.set_ylabel("mean reward of the step's completions")
        ax.set_ylim(-0.05, 1.05)
        ax.legend()
    fig.suptitle("coevo GRPO vs TRL GRPOTrainer")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the requested arms and write the JSON, the table and the figure; returns the JSON."""
    args = parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    command = shlex.join(["python", "scripts/peer_trl.py", *(sys.argv[1:] if argv is None else argv)])
    cfg = compose_config(args, out, args.harness.resolve() if args.harness else write_harness(out))
    from coevo.loop.builders import start_harness

    harness = start_harness(cfg)
    env, batches = step_batches(cfg)
    arms: dict[str, dict[str, Any]] = {}
    initial = None
    if "coevo" in args.arms:
        arms["coevo"], initial = run_coevo(cfg)
    if "trl" in args.arms:
        arms["trl"] = run_trl(cfg, env, harness, batches, out, initial)
    expected = [[t.task_id for t in b] for b in batches]
    unmatched = UNMATCHED if cfg.rollout.max_steps == 1 else UNMATCHED_EPISODES
    result = {
        "command": command, "settings": settings(cfg, harness), "unmatched": unmatched,
        "same_prompts": all([r["task_ids"] for r in arm["rows"]] == expected for arm in arms.values()),
        "same_harness": all(r["harness"] == {"base": harness.id} for r in arms.get("coevo", {}).get("rows", [])),
        "arms": arms,
    }
    (out / "peer_trl.json").write_text(json.dumps(result, indent=2, default=str))
    completions = cfg.batch_tasks * cfg.rollout.attempts
    s = result["settings"]
    report = (f"`{command}`\n\n{table(arms, completions)}\n\n"
              f"model {s['model']} + LoRA r={s['lora']['r']} alpha={s['lora']['alpha']}; {s['prompts']} prompts x "
              f"{s['generations']} completions per step; lr {s['lr']:g}, temperature {s['temperature']:g}, "
              f"max new tokens {s['max_new_tokens']}, beta {s['beta']:g}, clip [{1 - s['eps_low']:g}, "
              f"{1 + s['eps_high']:g}], seed {s['seed']}. Same prompts in the same order: {result['same_prompts']}. "
              f"Harness {s['harness']}, at most {s['max_steps']} model calls an episode. "
              "Reward: the env verifier's score of the answer the harness extracts, through coevo's runtime "
              "for both arms (reasoning-gym gives partial credit; full-credit pass rates are in the JSON). "
              + ("TRL's episodes came from coevo's runtime and generation engine with TRL's current weights "
                 "(rollout_func), so its s/step differs from coevo's in the update and bookkeeping, not in "
                 "generation code. " if s["max_steps"] > 1 else "") +
              "s/step is generation + update (coevo: rollout + behaviour log-probs + GRPO; TRL: on_step_begin "
              "to on_step_end).\n\nNot matched between the arms:\n\n"
              + "".join(f"- {line}\n" for line in unmatched))
    (out / "peer_trl.md").write_text(report)
    figure(arms, out / "peer_trl.png")
    print(report)
    print(f"json: {out / 'peer_trl.json'}  figure: {out / 'peer_trl.png'}")
    return result


if __name__ == "__main__":
    main()
