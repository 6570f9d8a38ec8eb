"""Peak memory and speed of one generate call against prompt length: the cached engine (prompts read in
chunks, the call's rows in decode batches within ``kv_mib``) beside transformers' ``generate`` (the
``hf`` engine), on the same prompts with the same seed, so the two must give the same ids.

    python scripts/bench_long_prompts.py                         # SmolLM2, 4 rows, 1k 2k 4k 8k tokens
    python scripts/bench_long_prompts.py --rows 8 --lengths 4700 --engines cached   # the BFCL-sized call

Each (engine, length) runs in its own process, so its peak RSS (``ru_maxrss``) is its own; the line it
prints holds the peak, the prompt tokens read per second (prefill + decode over the call's wall time,
new tokens per second beside it) and a hash of the ids. The prompts are distinct (no shared prefix
for the cache to reuse): the worst case for memory. docs/PERF.md records the figures.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORDS = ("the tool returns a list of files in the folder and each entry has its name size owner and date so "
         "the agent can choose which file to move next before it writes the note").split()


def one(engine: str, length: int, rows: int, new_tokens: int, model_name: str) -> dict:
    """In this process: one call of ``rows`` prompts of ``length`` tokens; its figures."""
    import resource
    import time

    import torch

    from coevo.agent.policy import ChatRequest
    from coevo.harness.events import SamplingParams
    from coevo.policy.hf import TransformersPolicy
    from coevo.policy.load import load_model

    torch.manual_seed(0)
    model, tok = load_model(model_name, dtype="float32")
    policy = TransformersPolicy(model, tok, engine=engine, seed=0, prefix_cache_mb=0)
    reqs = []
    for r in range(rows):  # distinct prompts of `length` tokens: words cut to length, a row's own order
        words = [WORDS[(r * 7 + j * 13) % len(WORDS)] for j in range(length)]

        def size(n: int, words: list[str] = words) -> int:
            return len(policy.prompt_ids([{"role": "user", "content": " ".join(words[:n])}]))

        n = max(1, length * length // size(length))  # words are about a token each: scale, then trim
        while n > 1 and size(n) > length:
            n = max(1, n - max(1, (size(n) - length) // 2))
        reqs.append(ChatRequest([{"role": "user", "content": " ".join(words[:n])}],
                                SamplingParams(temperature=1.0, max_new_tokens=new_tokens)))
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    gens = policy.generate(reqs)
    seconds = time.perf_counter() - start
    prompt = sum(len(g.prompt_ids) for g in gens)
    new = sum(len(g.completion_ids) for g in gens)
    ids = hashlib.sha256(json.dumps([g.completion_ids for g in gens]).encode()).hexdigest()[:12]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"engine": engine, "rows": rows, "prompt_tokens": len(gens[0].prompt_ids), "seconds": round(seconds, 1),
            "tokens_per_s": round((prompt + new) / seconds, 1), "new_tokens_per_s": round(new / seconds, 2),
            "peak_rss_mb": round(peak / 1024), "call_rss_mb": round((peak - base) / 1024), "ids": ids}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[1000, 2000, 4000, 8000])
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--engines", nargs="+", default=["cached", "hf"], choices=["cached", "hf"])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a child: one (engine, length)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.engines[0], args.lengths[0], args.rows, args.new_tokens, args.model)))
        return
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    results = []
    for length in args.lengths:
        for engine in args.engines:
            # SmolLM2's window is 8192 tokens: the longest prompt leaves room for the completion
            n = min(length, 8192 - args.new_tokens - 8)
            cmd = [sys.executable, __file__, "--one", "--engines", engine, "--lengths", str(n), "--rows",
                   str(args.rows), "--new-tokens", str(args.new_tokens), "--model", args.model]
            done = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if done.returncode != 0:
                raise SystemExit(f"{engine} at {n} tokens failed:\n{done.stderr[-2000:]}")
            results.append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(json.dumps(results[-1]), flush=True)
    by_length: dict[int, set[str]] = {}
    for r in results:
        by_length.setdefault(r["prompt_tokens"], set()).add(r["ids"])
    print("same ids in every engine:", all(len(v) == 1 for v in by_length.values()))


if __name__ == "__main__":
    main()
