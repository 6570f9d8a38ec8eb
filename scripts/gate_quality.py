"""Decision quality of the Critic's gate: plant edits of known effect and count how often each ships.

    python scripts/gate_quality.py                           # SmolLM2, the main job's env and harness, 20 runs per edit
    python scripts/gate_quality.py --runs 2 --edits helpful  # a quick check of the setup
    python scripts/gate_quality.py --preset tiny             # a scripted model with known effects: seconds
    python scripts/gate_quality.py --jobs 2 -- harness=lenient  # runs side by side; overrides of configs/train.yaml

Everything but the model and the env comes from the composed main-job config (``configs/train.yaml``
plus the overrides after ``--``): the starting harness as ``coevo.loop.builders.start_harness`` builds it,
the round batch (``batch_tasks`` tasks × ``rollout.attempts``), episode limits, and the Critic of
``evolution.*`` (``coevo.loop.builders.make_critic``): the statistical gate (``evolution=stat``) with its
default budget unless overridden (``-- evolution=seesaw`` measures HarnessX's gate). The planted edits,
each a proposal judged against the starting harness:

- helpful: the forced calculator call (a ``tool_choice`` processor) with two multi-turn calculator
  demonstrations (the task, the tool call, the tool result turn, the answer) from gold references of
  a reference pool split off the train split, as the ``turns`` of a ``few_shot`` processor: the edit
  the rule meta-agent proposes for a ``premature_answer`` cluster, +44 points on SmolLM2's validation
  tasks (docs/RESULTS.md; demonstrations alone do not move SmolLM2);
- harmful: a system prompt demanding the final answer in words, never digits, which no verifier of
  a numeric answer accepts (and the last-number fallback of the lenient harness cannot read);
- neutral: the default system prompt rephrased.

A run is one edit's life under the gate, as AEGIS lives it: each round a fresh train batch is
rolled out on the starting harness (its outcomes choose the tasks the edit claims), the Critic
judges the edit, and an undecided edit is judged again next round with its evidence pooled, up to
``--rounds`` rounds. Runs differ by seed (batches, the Critic's task sample, the sampling stream).

The ``tiny`` preset swaps in the built-in arithmetic env and a scripted model whose effects are
known by construction: it passes a task with probability 0.25, 0.6 once a demonstration with a
tool call precedes the task, and never when the system prompt asks for words.

With ``--jobs N`` the runs are shared among N processes (spawned, each loading the model once with
cores/N intra-op threads). A run's outcome depends only on its seed, not on which process ran it.

Output: a markdown table (shipped share with its 95% Wilson interval against the targets:
helpful ≥ 80%, harmful ≤ 5%, neutral ≤ 20%), and with ``--out`` the table and every decision as JSON.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from coevo.agent.policy import Policy
from coevo.report.experiment import markdown_table
from coevo.report.stats import wilson
from coevo.rundir.evolve_records import Evidence, Outcome

ROOT = Path(__file__).resolve().parents[1]

HARMFUL_PROMPT = (
    "You are a careful problem solver. Think step by step and use the tools when they help. Write your "
    "final answer in words, never with digits, for example <answer>forty-two</answer>."
)
NEUTRAL_PROMPT = (
    "You solve problems carefully. Reason step by step, call the tools when they are useful, and write "
    "your final answer as <answer>...</answer>."
)
EDITS = ("helpful", "harmful", "neutral")
TARGETS = {"helpful": (">=", 0.80), "harmful": ("<=", 0.05), "neutral": ("<=", 0.20)}
"""Shipped share each planted edit should reach for the gate to be worth having: it ships a helpful
edit in most runs, a harmful one almost never and a neutral one seldom."""
POOL = 8
"""Train tasks split off as the reference pool the demonstrations come from (never judged on)."""


@dataclass
class Setup:
    """What every run shares: the env, the policy, the starting harness, the tasks and the config."""

    name: str
    env: Any
    policy: Any
    start: Any
    train: list[Any]  # tasks the batches and the Critic's sample come from
    demos: list[list[dict[str, Any]]]
    cfg: Any  # the composed TrainConfig (evolution.*, batch_tasks, rollout.*)
    load_seconds: float = 0.0


@dataclass
class Judgement:
    outcome: Outcome
    episodes: int
    seconds: float
    wins: int
    losses: int
    pairs: int
    parent_passes: int
    candidate_passes: int
    reason: str


@dataclass
class Run:
    edit: str
    seed: int
    decisions: list[Judgement] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def outcome(self) -> Outcome:
        return self.decisions[-1].outcome


def compose(overrides: Sequence[str]) -> Any:
    """The main job's typed config (``configs/train.yaml``) with Hydra ``overrides``."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from coevo.config.schema import register
    from coevo.loop.build import to_config
    from coevo.loop.config_check import check

    register()
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        # the statistical gate is what this measures (the main job itself still runs seesaw)
        gate = [] if any(o.startswith("evolution=") for o in overrides) else ["evolution=stat"]
        raw = hydra_compose("train", overrides=[f"run_dir={tempfile.gettempdir()}/gate-quality", *gate, *overrides])
    cfg = to_config(raw)
    check(cfg)
    return cfg


def demonstrations(env: Any, pool: Sequence[Any], n: int = 2) -> list[list[dict[str, Any]]]:
    """``n`` multi-turn demonstrations (a tool call and its result turn) from gold references."""
    from coevo.evolution.reference import gold_reference, reference_demo
    from coevo.harness.library.context import demo_problem

    demos = []
    for task in pool:
        ref = gold_reference(env, task)
        if ref is None:
            continue
        demo = reference_demo(ref)
        if demo_problem(demo) is None and any(t.get("role") == "tool" for t in demo):
            demos.append(demo)
        if len(demos) == n:
            return demos
    raise RuntimeError(f"only {len(demos)} of {n} multi-turn demonstrations in a reference pool of {len(pool)} tasks")


def smollm2_setup(overrides: Sequence[str]) -> Setup:
    """SmolLM2 (or ``model=...``) frozen, on the main job's env and starting harness."""
    import torch

    from coevo.envs.load import make_env
    from coevo.evolution.reference import split_reference_pool
    from coevo.loop.builders import build_policy, start_harness
    from coevo.policy.load import load_model

    began = time.perf_counter()
    cfg = compose(overrides)
    env = make_env(cfg.env.name, cfg.env.args)
    device = cfg.model.device if cfg.model.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    model, tok = load_model(cfg.model.name, device=device, dtype=cfg.model.dtype)
    policy, _ = build_policy(cfg, model, tok)
    pool, train = split_reference_pool(env.tasks("train"), POOL, cfg.seed)
    return Setup(f"{cfg.model.name} on {cfg.env.name} {cfg.env.args}, harness {cfg.harness.start}", env, policy,
                 start_harness(cfg), train, demonstrations(env, pool), cfg, time.perf_counter() - began)


class KnownEffectPolicy(Policy):
    """A scripted model whose response to each planted edit is known: it solves a task (calculator,
    then the result) with probability ``base``, ``with_demo`` when a demonstration with a tool call
    precedes the task, and answers in words (never passing) when the system prompt asks for words.
    One seeded draw per episode, at its first model call (calls arrive in job order)."""

    model_version = "known-effects"

    def __init__(self, base: float = 0.25, with_demo: float = 0.6, seed: int = 0) -> None:
        from coevo.agent.policy import ScriptedPolicy

        self.base, self.with_demo = base, with_demo
        self.rng = random.Random(seed)
        self._scripted = ScriptedPolicy(self.respond, model_version=self.model_version)

    def reseed(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def generate(self, requests: Sequence[Any]) -> list[Any]:
        return self._scripted.generate(requests)

    def respond(self, messages: list[dict[str, Any]]) -> str:
        last = messages[-1]
        if last.get("role") == "tool":
            return f"<answer>{last.get('content', '').strip()}</answer>"
        system = next((m.get("content") or "" for m in messages if m.get("role") == "system"), "")
        if "in words" in system:
            return "<answer>seven</answer>"
        task = max(i for i, m in enumerate(messages) if m.get("role") == "user")
        demo = any(m.get("role") == "assistant" and "<tool_call>" in (m.get("content") or "") for m in messages[:task])
        match = re.search(r"What is ([-\d+*/() .]+)\?", messages[task].get("content") or "")
        if match is None or self.rng.random() >= (self.with_demo if demo else self.base):
            return "<answer>unknown</answer>"
        return ('<tool_call>{"name": "calculator", "arguments": {"expression": "%s"}}</tool_call>'
                % match.group(1).strip())


def tiny_setup(overrides: Sequence[str]) -> Setup:
    """The built-in arithmetic env and ``KnownEffectPolicy``; the rest of the main job's config."""
    from coevo.envs.arithmetic import ArithmeticEnv
    from coevo.evolution.reference import split_reference_pool
    from coevo.loop.builders import start_harness

    cfg = compose(["rollout.max_new_tokens=96", *overrides])  # a scripted reply counts bytes: the main job's 64 cut it
    env = ArithmeticEnv(n_tasks=120, max_terms=2, max_operand=30, seed=0)
    pool, train = split_reference_pool(env.tasks("train"), POOL, cfg.seed)
    return Setup("known-effect scripted model on arithmetic", env, KnownEffectPolicy(), start_harness(cfg), train,
                 demonstrations(env, pool), cfg)


def planted_edits(start: Any, demos: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """The three proposals, as the rule meta-agent would write them."""
    from coevo.harness.edits import apply_edit
    from coevo.harness.library import FewShotDemos, ToolChoice
    from coevo.meta.drafts import flatten, insert_edit, set_edit
    from coevo.meta.templates import demo_tools
    from coevo.rundir.evolve_records import Proposal

    tools = sorted(set().union(*map(demo_tools, demos)))
    forced = insert_edit(start, ToolChoice(tool=tools[0] if len(tools) == 1 else ""))
    shown = forced and insert_edit(apply_edit(start, forced), FewShotDemos(turns=flatten(demos)))
    edits = {"helpful": ("the forced calculator call with two multi-turn calculator demonstrations",
                         [forced, shown], "tools", "premature_answer"),
             "harmful": ("a system prompt demanding the answer in words",
                         [set_edit(start, "system_prompt", "template", HARMFUL_PROMPT)], "context_assembly",
                         "format_error"),
             "neutral": ("the system prompt rephrased",
                         [set_edit(start, "system_prompt", "template", NEUTRAL_PROMPT)], "context_assembly",
                         "format_error")}
    out = {}
    for name, (hypothesis, parts, dimension, cluster) in edits.items():
        if not all(parts):
            raise RuntimeError(f"the {name} edit does not apply to the starting harness")
        out[name] = Proposal(hypothesis=hypothesis, edits=parts, dimension=dimension, cluster=cluster)
    return out


def quoted_tasks(proposal: Any, setup: Setup) -> set[str]:
    """Train tasks whose answer the edit's text quotes (a demonstration's numbers): the quality gate
    would refuse to judge the edit on many of them, so its runs leave them out."""
    from coevo.evolution.added_text import edit_text
    from coevo.evolution.leakage import leakage_detail

    text = edit_text(proposal.edits, setup.start)
    return set(leakage_detail(text, {t.task_id: t.answer for t in setup.train}, {}).answers_leaked)


def run_edit(setup: Setup, edit: str, proposal: Any, seed: int, rounds: int) -> Run:
    """One edit's life under the gate (see the module docstring)."""
    from coevo.agent.rollouts import RolloutService
    from coevo.evolution.meta_agent import demo_question
    from coevo.loop.builders import make_critic

    cfg = setup.cfg
    quoted = quoted_tasks(proposal, setup)
    train = [t for t in setup.train if t.task_id not in quoted]
    rollouts = RolloutService(setup.policy, setup.env, batch_size=cfg.rollout.batch_size,
                              max_steps=cfg.rollout.max_steps, workers=cfg.rollout.workers, seed=seed)
    critic = make_critic(cfg.evolution, rollouts.critic_rollout())
    reseed = getattr(setup.policy, "reseed", None)
    if reseed is not None:
        reseed(seed)  # once: every rollout and re-run of the edit's life draws from this one stream
    rng = random.Random(seed)
    run = Run(edit, seed)
    began = time.perf_counter()
    for r in range(rounds):
        batch = rng.sample(train, cfg.batch_tasks)
        outcomes = rollouts.run(setup.start, batch, attempts=cfg.rollout.attempts, phase=None).outcomes(infra="drop")
        before = {tid: outs for tid, outs in outcomes.items() if outs}
        batch_ids = set(before)
        tick, episodes = time.perf_counter(), critic.reruns
        verdict, _ = critic.judge(proposal, setup.start, before=before,
                                  tasks={t.task_id: t for t in batch if t.task_id in batch_ids},
                                  extra={t.task_id: t for t in train if t.task_id not in batch_ids},
                                  allowed=[demo_question(d) for d in setup.demos], round=r)
        if verdict.gate in ("build", "quality"):
            raise RuntimeError(f"the planted {edit} edit did not reach the gate: {verdict.reason}")
        ev = verdict.evidence or Evidence(pairs=0, wins=0, losses=0)
        run.decisions.append(Judgement(
            verdict.outcome, critic.reruns - episodes, time.perf_counter() - tick, ev.wins, ev.losses, ev.pairs,
            sum(sum(v) for v in verdict.before.values()),
            sum(sum(v) for v in verdict.after.values()), verdict.reason))
        d = run.decisions[-1]
        print(f"  [{edit} seed {seed}] judgement {r + 1}: {d.outcome}, {d.episodes} episodes, {d.wins} wins / "
              f"{d.losses} losses in {d.pairs} pooled pairs, {d.seconds:.1f} s", flush=True)
        if d.outcome is not Outcome.UNDECIDED:
            break
    run.seconds = time.perf_counter() - began
    return run


def summarise(runs: Sequence[Run]) -> dict[str, Any]:
    """Per-edit figures of the table."""
    n = len(runs)
    counts = {o.value: sum(r.outcome is o for r in runs) for o in Outcome}
    decisions = [d for r in runs for d in r.decisions]
    last = [r.decisions[-1] for r in runs]  # pooled evidence: the last decision holds every pair
    pairs = sum(d.pairs for d in last)
    low, high = wilson(counts["ship"], n)
    sign, target = TARGETS[runs[0].edit]
    shipped = counts["ship"] / n
    return {"edit": runs[0].edit, "runs": n, "shipped": shipped, "ci": (low, high),
            "rejected": counts["reject"] / n, "undecided": counts["undecided"] / n,
            "episodes_per_decision": sum(d.episodes for d in decisions) / len(decisions),
            "decisions_per_run": len(decisions) / n,
            "parent_pass": sum(d.parent_passes for d in last) / pairs if pairs else float("nan"),
            "candidate_pass": sum(d.candidate_passes for d in last) / pairs if pairs else float("nan"),
            "seconds_per_decision": sum(d.seconds for d in decisions) / len(decisions),
            "seconds_per_run": sum(r.seconds for r in runs) / n,
            "target": f"{sign} {100 * target:.0f}%",
            "met": shipped >= target if sign == ">=" else shipped <= target}


def table(rows: Sequence[dict[str, Any]]) -> str:
    pct = lambda x: f"{100 * x:.0f}%"  # noqa: E731
    return markdown_table(
        ["edit", "runs", "shipped", "95% CI", "rejected", "undecided", "episodes / decision", "decisions / run",
         "parent pass", "candidate pass", "s / decision", "s / run", "target", "met"],
        [[s["edit"], s["runs"], pct(s["shipped"]), f"{100 * s['ci'][0]:.0f}–{100 * s['ci'][1]:.0f}%",
          pct(s["rejected"]), pct(s["undecided"]), f"{s['episodes_per_decision']:.1f}", f"{s['decisions_per_run']:.2f}",
          f"{s['parent_pass']:.3f}", f"{s['candidate_pass']:.3f}", f"{s['seconds_per_decision']:.1f}",
          f"{s['seconds_per_run']:.1f}", s["target"], "yes" if s["met"] else "no"] for s in rows])


_WORKER: dict[str, Any] = {}
"""A ``--jobs`` worker process's setup and proposals, built once by ``_init_worker``."""


def _init_worker(preset: str, overrides: Sequence[str], threads: int) -> None:
    import torch

    torch.set_num_threads(threads)
    setup = (tiny_setup if preset == "tiny" else smollm2_setup)(overrides)
    _WORKER.update(setup=setup, proposals=planted_edits(setup.start, setup.demos))


def _run_in_worker(edit: str, seed: int, rounds: int) -> Run:
    return run_edit(_WORKER["setup"], edit, _WORKER["proposals"][edit], seed, rounds)


def run_all(setup: Setup, proposals: dict[str, Any], args: argparse.Namespace,
            overrides: Sequence[str]) -> dict[str, list[Run]]:
    """Every (edit, seed) run, in this process or shared among ``args.jobs`` spawned ones."""
    plan = [(edit, args.seed + i) for edit in args.edits for i in range(args.runs)]
    done: list[Run] = []

    def report(run: Run) -> None:
        done.append(run)
        print(f"[{run.edit} seed {run.seed}, {len(done)}/{len(plan)}] {run.outcome} after {len(run.decisions)} "
              f"judgement(s), {sum(d.episodes for d in run.decisions)} episodes, {run.seconds:.1f} s", flush=True)

    if args.jobs == 1:
        for edit, seed in plan:
            report(run_edit(setup, edit, proposals[edit], seed, args.rounds))
    else:
        import multiprocessing
        import os
        from concurrent.futures import ProcessPoolExecutor

        threads = max(1, (os.cpu_count() or 1) // args.jobs)
        with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn"),
                                 initializer=_init_worker, initargs=(args.preset, list(overrides), threads)) as pool:
            for future in [pool.submit(_run_in_worker, edit, seed, args.rounds) for edit, seed in plan]:
                report(future.result())
    runs: dict[str, list[Run]] = {}
    for run in done:
        runs.setdefault(run.edit, []).append(run)
    return runs


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    argv = list(sys.argv[1:] if argv is None else argv)
    overrides = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=("smollm2", "tiny"), default="smollm2")
    parser.add_argument("--runs", type=int, default=20, help="runs per edit (seeds seed .. seed + runs - 1)")
    parser.add_argument("--rounds", type=int, default=3, help="judgements per run at most (undecided edits retried)")
    parser.add_argument("--edits", nargs="+", choices=EDITS, default=list(EDITS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="write the table (.md) and every decision (.json)")
    parser.add_argument("--jobs", type=int, default=1, help="processes sharing the runs (each loads the model)")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.rounds < 1 or args.jobs < 1:
        parser.error("--runs, --rounds and --jobs must be >= 1")
    from coevo.evolution.critic import STAT_CONFIRM_ATTEMPTS, STAT_MAX_EPISODES
    from coevo.evolution.stat_gate import STAT_ALPHA, STAT_BETA, STAT_WIN_SHARE

    setup = (tiny_setup if args.preset == "tiny" else smollm2_setup)(overrides)
    proposals = planted_edits(setup.start, setup.demos)
    e = setup.cfg.evolution
    header = (f"gate {e.gate}: alpha {STAT_ALPHA}, beta {STAT_BETA}, win share {STAT_WIN_SHARE}, "
              f"{e.stat_tasks} tasks x {e.critic_attempts} paired attempt(s), budget {e.stat_budget} episodes per "
              f"decision, pooled cap {STAT_MAX_EPISODES}, confirmations {STAT_CONFIRM_ATTEMPTS}; "
              f"{setup.name}; batch {setup.cfg.batch_tasks} x {setup.cfg.rollout.attempts}; up to {args.rounds} "
              f"judgement(s) per run; setup {setup.load_seconds:.0f} s")
    print(header, flush=True)
    began = time.perf_counter()
    runs = run_all(setup, proposals, args, overrides)
    minutes = (time.perf_counter() - began) / 60
    header += f"; {args.jobs} job(s), {minutes:.1f} min for the runs"
    rows = [summarise(runs[edit]) for edit in args.edits]
    text = table(rows)
    print(header)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".md").write_text(header + "\n\n" + text + "\n")
        detail = {"header": header, "summary": rows,
                  "runs": [{"edit": r.edit, "seed": r.seed, "seconds": r.seconds,
                            "decisions": [vars(d) for d in r.decisions]} for rs in runs.values() for r in rs]}
        args.out.with_suffix(".json").write_text(json.dumps(detail, indent=1))
    return rows


if __name__ == "__main__":
    main()
