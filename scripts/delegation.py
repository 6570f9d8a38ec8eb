"""What a lead agent does with specialists: the agents axis on the office env, measured.

    python scripts/delegation.py                        # SmolLM2 as lead and specialists, office val + test
    python scripts/delegation.py --model gold           # the scripted gold lead: the plumbing, in seconds
    python scripts/delegation.py --model tiny --limit 4 # a random tiny model: the suite's preset
    python scripts/delegation.py --force-tool-call      # the lead's (and each specialist's) first reply
                                                        # prefilled with the start of a tool call
    python scripts/delegation.py --demos 2              # two worked delegations (the gold lead's own
                                                        # episodes on train tasks) before each task

The lead is the agents axis's harness with every entity released (``agents_harness``: one
``specialist`` per entity of ``OfficeEnv.tool_owners``, the lead's registry enabling only the
``ask_<entity>`` tools). Every task runs ``--attempts`` times; each episode is classified from its
trace:

- delegated: the lead called at least one ``ask_`` tool;
- to whom: the specialists it asked, against those the task needs (the owners of its gold calls);
  ``right`` = asked only needed specialists, ``complete`` = asked every needed one;
- specialist acted: a sub-episode called at least one tool of its bundle;
- passed: the env's state check.

Output: a markdown table with counts, rates and 95% Wilson intervals over episodes, per task
group (one entity, several entities), and with ``--out`` the table and every episode as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from coevo.agent.rollouts import RolloutService
from coevo.envs.office import OWNER, OfficeEnv, final_answer
from coevo.harness.defaults import base_harness, with_step_cap
from coevo.harness.library import FewShotDemos, ToolChoice
from coevo.report.stats import wilson
from coevo.streams.axes import agents_harness

ENTITIES = frozenset(OWNER.values())


def episode_row(trace: Any, task: Any) -> dict[str, Any]:
    """One episode's delegation facts (see the module docstring)."""
    needed = {OWNER[c.name] for c in task.gold_actions}
    asked = [c.name.removeprefix("ask_") for c in trace.tool_calls if not c.agent and c.name.startswith("ask_")]
    acted = {c.agent for c in trace.tool_calls if c.agent and OWNER.get(c.name) == c.agent}
    return {"task_id": task.task_id, "entities": sorted(needed), "asked": asked, "delegated": bool(asked),
            "right": bool(asked) and set(asked) <= needed, "complete": needed <= set(asked),
            "specialist_acted": bool(acted), "passed": bool(trace.passed), "lead_calls": sum(not c.agent for c in
                                                                                          trace.model_calls),
            "sub_calls": sum(bool(c.agent) for c in trace.model_calls), "stop": trace.stop_reason,
            "error": trace.error}


def delegation_demos(env: OfficeEnv, lead: Any, n: int) -> list[dict[str, Any]]:
    """The turns of the gold lead's episodes on ``n`` train tasks of different kinds (several
    entities first): the task, each ``ask_`` call, the specialist's report as the runtime shows
    it, the answer."""
    from coevo.agent.gold import GoldPolicy

    kinds: dict[str, Any] = {}  # one task per kind, the kinds needing the most entities first
    for task in sorted(env.tasks("train"), key=lambda t: -len(t.metadata["entities"])):
        kinds.setdefault(task.metadata["kind"], task)
    train = list(kinds.values())[:n]
    gold = with_step_cap(lead.set_param("sampling", "max_new_tokens", 1024), 10)
    done = RolloutService(GoldPolicy(train, answer=final_answer, owner=OWNER), env, batch_size=8, max_steps=10,
                          workers=2, seed=0).run(gold, train, attempts=1, phase=None)
    assert all(t.passed for t in done.traces), "the gold lead must pass its demonstration tasks"
    return [dict(m) for t in done.traces for m in t.messages if m["role"] != "system"]


def policy_for(model: str, tasks: list, seed: int) -> Any:
    if model == "gold":
        from coevo.agent.gold import GoldPolicy

        return GoldPolicy(tasks, answer=final_answer, owner=OWNER)
    from coevo.policy.load import transformers_policy

    return transformers_policy(model, seed=seed)


def table(rows: list[dict[str, Any]]) -> str:
    groups = {"all": rows, "one entity": [r for r in rows if len(r["entities"]) == 1],
              "several entities": [r for r in rows if len(r["entities"]) > 1]}
    lines = ["| episodes | n | delegated | right specialists | every needed one | specialist used a tool | passed |",
             "|---|---|---|---|---|---|---|"]
    for name, group in groups.items():
        cells = []
        for key in ("delegated", "right", "complete", "specialist_acted", "passed"):
            k = sum(r[key] for r in group)
            lo, hi = wilson(k, len(group))
            cells.append(f"{k} ({k / len(group):.0%} [{lo:.0%}, {hi:.0%}])" if group else "-")
        lines.append(f"| {name} | {len(group)} | " + " | ".join(cells) + " |")
    asked = Counter(a for r in rows for a in r["asked"])
    lines += ["", "asked: " + (", ".join(f"{a} {n}" for a, n in asked.most_common()) or "nobody")]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2", help="smollm2 | tiny | gold | a local model directory")
    ap.add_argument("--splits", nargs="+", default=["val", "test"])
    ap.add_argument("--limit", type=int, default=None, help="tasks per split")
    ap.add_argument("--attempts", type=int, default=2)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--max-steps", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--demos", type=int, default=0,
                    help="worked delegations shown to the lead: the gold lead's episodes on that many train tasks")
    ap.add_argument("--force-tool-call", action="store_true",
                    help="insert tool_choice: the first reply opens a <tool_call> and the model names the tool")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    env = OfficeEnv()
    tasks = [t for split in args.splits for t in env.tasks(split)[: args.limit]]
    lead = (agents_harness(base_harness(), ENTITIES, ENTITIES, owner=OWNER)
            .set_param("sampling", "temperature", args.temperature)
            .set_param("sampling", "max_new_tokens", args.max_new_tokens)
            .set_param("step_budget", "max_steps", args.max_steps))
    if args.demos:
        lead = lead.insert(FewShotDemos(turns=delegation_demos(env, lead, args.demos)))
    if args.force_tool_call:  # as the rule meta-agent proposes for answers given without the tools
        lead = lead.insert(ToolChoice())
    if args.model == "gold":  # a delegation lists its calls: longer replies than a model's
        lead = lead.set_param("sampling", "max_new_tokens", 1024)
    policy = policy_for(args.model, tasks, args.seed)
    began = time.perf_counter()
    done = RolloutService(policy, env, batch_size=32, max_steps=args.max_steps, workers=4, seed=args.seed).run(
        lead, tasks, attempts=args.attempts, phase="eval")
    by_id = {t.task_id: t for t in tasks}
    rows = [episode_row(trace, by_id[trace.task_id]) for trace in done.traces]
    forced = (", first tool call forced" if args.force_tool_call else "") + (
        f", {args.demos} worked delegation(s) shown" if args.demos else "")
    text = (f"office, {len(tasks)} tasks ({', '.join(args.splits)}) × {args.attempts} attempts, model {args.model}{forced}, "
            f"{time.perf_counter() - began:.0f} s\n\n" + table(rows))
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "delegation.md").write_text(text + "\n")
        (args.out / "episodes.json").write_text(json.dumps(rows, indent=1))
    return text


if __name__ == "__main__":
    main(sys.argv[1:])
