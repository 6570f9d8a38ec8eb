"""Per-episode time of an agent that is a program against coevo's native episode, same tasks and model.

Three arms over the same arithmetic tasks, the same system prompt and greedy decoding, one model
call an episode, each run ``--repeats`` times alternately in this process:

- ``native``: coevo's own episode over ``ArithmeticEnv`` (no program);
- ``endpoint``: ``env=program`` with ``examples/programs/chat_agent.py`` (the OpenAI SDK pointed at
  coevo's endpoint with ``OPENAI_BASE_URL``; a Python process per episode);
- ``verifiers``: a verifiers v1 taskset of the same tasks under the ``null`` harness program in the
  subprocess runtime, its requests reaching coevo through verifiers' interception server and
  coevo's v1 client.

Greedy decoding makes every arm's completions identical, which the script checks (the prompt ids
too): the time difference is the program path's own cost. It also recomputes, as the trainer does
(one forward pass over prompt and completion), the log-probs of every program-path completion and
reports the largest difference from the ones recorded at sampling. Prints a table, and writes it as
JSON with ``--out``.

    python scripts/program_overhead.py --tasks 32 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from coevo.agent.runtime import run_attempts
from coevo.envs.arithmetic import ArithmeticEnv
from coevo.envs.command_env import CommandEnv
from coevo.harness.defaults import program_harness
from coevo.harness.library import SystemPrompt
from coevo.policy.load import transformers_policy

SYSTEM = "Answer with the number only."
ROOT = Path(__file__).resolve().parents[1]


def verifiers_env(tasks):
    """A v1 taskset of exactly ``tasks`` (instruction, answer, id), under the null harness."""
    import verifiers.v1 as vf

    from coevo.envs.verifiers_env import VerifiersEnv

    class Data(vf.TaskData):
        answer: str

    class ArithTask(vf.Task[Data]):
        @vf.reward
        async def correct(self, trace: vf.Trace) -> float:
            return float(trace.last_reply.strip() == self.data.answer)

    class Tasks(vf.Taskset[ArithTask, vf.TasksetConfig]):
        def load(self):
            for t in tasks:
                yield ArithTask(Data(id=t.task_id, prompt=t.instruction, system_prompt=SYSTEM, answer=str(t.answer)),
                                self.config.task)

    import sys
    import types

    module = types.ModuleType("overhead_tasks")
    module.Tasks = Tasks
    sys.modules["overhead_tasks"] = module
    return VerifiersEnv("overhead_tasks:Tasks", harness="null")


def recompute_drift(policy, calls) -> float:
    """The largest |recorded log-prob - the trainer's recompute| over ``calls`` (greedy: log-probs at T = 1)."""
    import torch

    worst = 0.0
    with torch.no_grad():
        for call in calls:
            ids = torch.tensor([call.prompt_ids + call.completion_ids])
            logits = policy.model(ids).logits[0, len(call.prompt_ids) - 1 : -1].float()  # [completion, vocab]
            fresh = torch.log_softmax(logits, -1).gather(-1, torch.tensor(call.completion_ids)[:, None])[:, 0]
            worst = max(worst, (fresh - torch.tensor(call.sampler_logprobs)).abs().max().item())
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    native = ArithmeticEnv(n_tasks=200, max_terms=2)
    tasks = [t for s in ("train", "val", "test") for t in native.tasks(s)][: args.tasks]
    arms = {
        "native": (native, program_harness().set_param("tool_registry", "enabled", []).insert(
            SystemPrompt(template=SYSTEM), index=0)),
        "endpoint": (CommandEnv(f"python {ROOT / 'examples/programs/chat_agent.py'}", tasks_from="arithmetic",
                                tasks_args={"n_tasks": 200, "max_terms": 2}), program_harness()),
        "verifiers": (verifiers_env(tasks), program_harness()),
    }
    import os

    os.environ["CHAT_SYSTEM_PROMPT"] = SYSTEM
    policy = transformers_policy(args.model)
    times: dict[str, list[float]] = {name: [] for name in arms}
    calls: dict[str, list] = {}
    recorded: dict[str, list] = {}
    for _ in range(args.repeats):
        for name, (env, harness) in arms.items():
            harness = harness.set_param("sampling", "temperature", 0.0).set_param(
                "sampling", "max_new_tokens", args.max_new_tokens)
            env_tasks = tasks if name != "verifiers" else [t for s in ("train", "val", "test") for t in env.tasks(s)]
            by_id = {t.task_id: t for t in env_tasks}
            start = time.perf_counter()
            traces = [t for [t] in run_attempts([by_id[t.task_id] for t in tasks], harness, policy, env,
                                                max_steps=1)]
            times[name].append((time.perf_counter() - start) / len(tasks))
            failed = [t.error for t in traces if t.error]
            if failed:
                raise SystemExit(f"{name}: {len(failed)} episodes failed, e.g. {failed[0]}")
            calls[name] = [(t.model_calls[0].prompt_ids, t.model_calls[0].completion_ids) for t in traces]
            recorded[name] = [t.model_calls[0] for t in traces]
    same = {name: calls[name] == calls["native"] for name in arms}
    drift = {name: recompute_drift(policy, recorded[name]) for name in arms}
    rows = {name: {"seconds_per_episode": statistics.median(ts), "runs": [round(x, 4) for x in ts],
                   "ratio_to_native": statistics.median(ts) / statistics.median(times["native"]),
                   "same_ids_as_native": same[name], "max_abs_logprob_vs_recompute": drift[name]}
            for name, ts in times.items()}
    print(f"{args.tasks} tasks, {args.repeats} repeats, greedy, {args.max_new_tokens} new tokens at most, "
          f"model {args.model}")
    print(f"{'arm':<10} {'s/episode':>10} {'x native':>9}  same ids  max |logprob - recompute|")
    for name, row in rows.items():
        print(f"{name:<10} {row['seconds_per_episode']:>10.3f} {row['ratio_to_native']:>9.2f}  "
              f"{str(row['same_ids_as_native']):<8}  {row['max_abs_logprob_vs_recompute']:.2e}")
    if args.out:
        args.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "arms": rows}, indent=2))


if __name__ == "__main__":
    main()
