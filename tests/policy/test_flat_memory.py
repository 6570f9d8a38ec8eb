"""Long prompts in bounded memory: a call whose past would exceed ``kv_mib`` runs as several
decode batches that sample exactly what one batch samples, prompts are read in chunks that give what
one forward gives, a long call reports its progress, and peak memory stops growing with the number
of long prompts in a call."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from coevo.agent.policy import ChatRequest
from coevo.harness.events import SamplingParams
from coevo.policy import decode as decode_module
from coevo.policy import hf as hf_module
from coevo.policy.decode import kv_bytes_per_token
from coevo.policy.hf import TransformersPolicy
from coevo.policy.tiny import tiny_model, tiny_tokenizer
from tests.policy.test_prefix_cache import conversations, run_turns

ROOT = Path(__file__).resolve().parents[2]
SAMPLINGS = [SamplingParams(temperature=0.0, max_new_tokens=12),
             SamplingParams(temperature=0.8, top_p=0.9, max_new_tokens=12)]


def same(a, b):
    for ga, gb in zip(a, b, strict=True):
        for x, y in zip(ga, gb, strict=True):
            assert x.prompt_ids == y.prompt_ids and x.completion_ids == y.completion_ids
            assert x.finish_reason == y.finish_reason
            assert x.logprobs == pytest.approx(y.logprobs, abs=1e-5)


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["greedy", "sampled"])
def test_a_call_split_over_decode_batches_samples_what_one_batch_samples(sampling, monkeypatch):
    tok = tiny_tokenizer()
    model = tiny_model(tok, seed=1)
    whole = TransformersPolicy(model, tok, seed=7)
    split = TransformersPolicy(model, tok, seed=7, kv_mib=1e-6)  # every row its own batch
    sizes = []
    original = decode_module.decode

    def spy(model, prompts, *args, **kwargs):
        sizes.append(len(prompts))
        return original(model, prompts, *args, **kwargs)

    monkeypatch.setattr(hf_module, "decode", spy)
    b = run_turns(split, sampling)
    assert sizes and max(sizes) == 1
    sizes.clear()
    a = run_turns(whole, sampling)
    assert max(sizes) > 1  # the unsplit policy batched the questions
    same(a, b)


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["greedy", "sampled"])
def test_prompts_read_in_chunks_give_what_model_generate_gives(sampling, monkeypatch):
    monkeypatch.setattr(decode_module, "PREFILL_CHUNK", 7)  # prompts of ~60-120 tokens: many chunks, ragged
    tok = tiny_tokenizer()
    model = tiny_model(tok, seed=2)
    cached = TransformersPolicy(model, tok, seed=5, prefix_cache_mb=0)  # every prompt read whole, in chunks
    hf = TransformersPolicy(model, tok, engine="hf", seed=5)
    for calls in zip(*conversations(turns=2), strict=True):
        reqs = [ChatRequest(m, sampling) for m in calls]
        same([cached.generate(reqs)], [hf.generate(reqs)])


def test_decode_batches_keep_their_past_within_the_budget():
    tok = tiny_tokenizer()
    policy = TransformersPolicy(tiny_model(tok, seed=0), tok)
    per_token = kv_bytes_per_token(policy.model)
    assert per_token == 2 * 2 * 2 * 16 * 4  # layers x (k, v) x kv heads x head dim x fp32
    prompts = [[1] * n for n in (40, 300, 90, 120, 35, 500, 60)]
    cached = [0, 200, 30, 0, 10, 0, 20]
    policy.kv_bytes = 600 * per_token
    batches = policy._batches(prompts, cached, max_new_tokens=16)
    assert sorted(i for b in batches for i in b) == list(range(len(prompts)))
    for b in batches:
        tokens = len(b) * (max(cached[i] for i in b) + max(len(prompts[i]) - cached[i] for i in b) + 16)
        assert len(b) == 1 or tokens * per_token <= policy.kv_bytes
    assert len(batches) > 1
    policy.kv_bytes = 10**9
    assert policy._batches(prompts, cached, max_new_tokens=16) == [list(range(len(prompts)))]  # in order


def test_the_prefix_cache_gives_way_so_cache_and_batch_stay_within_one_budget(monkeypatch):
    """``kv_mib`` bounds the cache's states, the decode batch's past and the states it copies out for the
    cache together: before each batch the cache evicts until all fit, and the samples are those of a
    policy without a cache."""
    tok = tiny_tokenizer()
    model = tiny_model(tok, seed=3)
    per_token = kv_bytes_per_token(model)
    budget_tokens = 1700  # the later turns' batches, their copies and the cache's states do not all fit
    shared = TransformersPolicy(model, tok, seed=7, kv_mib=budget_tokens * per_token / 2**20)
    held: list[int] = []  # cache + this batch's past, in tokens, at every decode
    evicted: list[int] = []
    original, shrink = decode_module.decode, shared.cache.shrink_to

    def counting_shrink(max_bytes, keep=frozenset()):
        before = len(shared.cache.entries)
        shrink(max_bytes, keep)
        evicted.append(before - len(shared.cache.entries))

    def spy(model, prompts, past, *, max_new_tokens, keep_from=None, **kwargs):
        cached = keep_from or [0] * len(prompts)
        fresh = [len(p) - c for p, c in zip(prompts, cached, strict=True)]  # tokens of each prompt not cached
        batch = len(prompts) * (max(cached) + max(fresh) + max_new_tokens)
        batch += sum(f + max_new_tokens for f in fresh)  # the copies kept for the cache
        held.append(shared.cache.nbytes // per_token + batch)
        return original(model, prompts, past, max_new_tokens=max_new_tokens, keep_from=keep_from, **kwargs)

    unrelated = [ChatRequest([{"role": "user", "content": f"{word} " * 90}], SAMPLINGS[0])
                 for word in ("alpha", "beta")]
    shared.generate(unrelated)  # states no later call reads: the first to give way
    assert shared.cache.nbytes > 0
    monkeypatch.setattr(hf_module, "decode", spy)
    monkeypatch.setattr(shared.cache, "shrink_to", counting_shrink)
    b = run_turns(shared, SAMPLINGS[1])
    monkeypatch.undo()
    uncached = TransformersPolicy(model, tok, seed=7, prefix_cache_mb=0)
    uncached.generate(unrelated)
    a = run_turns(uncached, SAMPLINGS[1])
    same(a, b)
    assert held and max(held) <= budget_tokens and sum(evicted) > 0  # the cache gave way, and kept the bound
    assert shared.prompt_tokens_computed < shared.prompt_tokens  # the cache still served prefixes
    assert 0 < shared.cache.nbytes <= budget_tokens * per_token


def test_shrinking_the_prefix_cache_evicts_least_recently_used_leaves_first_and_keeps_what_a_call_reads():
    import torch

    from coevo.policy.prefix_cache import PrefixCache

    def kv(n):
        return [(torch.zeros(1, n, 2), torch.zeros(1, n, 2))]

    cache = PrefixCache(10**6)
    root = cache.insert([1, 2, 3, 4], kv(4), None, 0)
    child = cache.insert([1, 2, 3, 4, 5, 6], kv(2), root, 4)
    other = cache.insert([9, 9, 9], kv(3), None, 0)
    cache.match([1, 2, 3, 4, 5, 6, 7])  # the chain is used last: ``other`` is the oldest leaf
    per_token = 2 * 2 * 4
    cache.shrink_to(0, keep=cache.pinned([child]))  # what a call's rows read stays, its ancestors too
    assert not other.alive and root.alive and child.alive and cache.nbytes == 6 * per_token
    cache.shrink_to(6 * per_token)
    cache.shrink_to(5 * per_token)  # a parent goes only after its children
    assert not child.alive and root.alive
    cache.shrink_to(-1)
    assert cache.entries == [] and cache.nbytes == 0
    assert cache.max_bytes == 10**6  # later inserts keep the cache's own bound


def test_a_long_call_reports_its_progress(monkeypatch):
    monkeypatch.setattr(hf_module, "HEARTBEAT_S", 0.0)
    monkeypatch.setattr(decode_module, "PREFILL_CHUNK", 16)
    tok = tiny_tokenizer()
    policy = TransformersPolicy(tiny_model(tok, seed=0), tok, seed=1, kv_mib=1e-6)
    lines: list[str] = []
    policy.on_progress = lines.append
    reqs = [ChatRequest(m, SamplingParams(temperature=1.0, max_new_tokens=6)) for m in conversations(1)[0] * 2]
    policy.generate(reqs)
    assert any("prompt tokens read" in line for line in lines)
    assert any("tokens generated" in line and "batch 2/" in line for line in lines)
    assert lines[-1].startswith(f"model calls: {len(reqs)} done")  # and after each call, across calls


PEAK = """
import json, resource, sys
import torch
from coevo.agent.policy import ChatRequest
from coevo.harness.events import SamplingParams
from coevo.policy import decode
from coevo.policy.hf import TransformersPolicy
from coevo.policy.tiny import tiny_model, tiny_tokenizer

rows, bounded = int(sys.argv[1]), sys.argv[2] == "bounded"
torch.manual_seed(0)
tok = tiny_tokenizer()
model = tiny_model(tok, seed=0, hidden_size=256, layers=4)  # 8 KB of past a token
if not bounded:
    decode.PREFILL_CHUNK = 10**6
policy = TransformersPolicy(model, tok, seed=0, prefix_cache_mb=0, kv_mib=48 if bounded else 10**6)
words = [" ".join(str((7 * i + j) % 97) for j in range(3400)) for i in range(rows)]  # ~3.4k tokens each
reqs = [ChatRequest([{"role": "user", "content": w}], SamplingParams(temperature=1.0, max_new_tokens=4))
        for w in words]
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
gens = policy.generate(reqs)
print(json.dumps({"peak_mb": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024,
                  "prompt": len(gens[0].prompt_ids)}))
"""


def peak_mb(rows: int, bounded: bool) -> float:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", PEAK, str(rows), "bounded" if bounded else "whole"], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["prompt"] > 3000
    return out["peak_mb"]


@pytest.mark.slow
def test_memory_of_a_call_stops_growing_with_its_long_prompts():
    """Growth of peak memory from 2 to 8 long prompts in one call: bounded (chunks, a 48 MiB past
    per batch) it is a fraction of the unbounded growth (one forward over every prompt, one batch)."""
    bounded = peak_mb(8, True) - peak_mb(2, True)
    whole = peak_mb(8, False) - peak_mb(2, False)
    assert whole > 100, whole  # the unbounded call does grow with its prompts
    assert bounded < 0.25 * whole, (bounded, whole)


def test_the_rollout_display_prints_a_long_calls_progress():
    import io

    from rich.console import Console

    from coevo.agent.rollouts import RolloutService
    from coevo.policy.tiny import tiny_policy
    from coevo.report.progress import RichProgress

    out = io.StringIO()
    policy = tiny_policy()
    RolloutService(policy, env=None, batch_size=1, max_steps=1, workers=1, seed=0,
                   progress=RichProgress(Console(file=out, width=200)))
    policy.on_progress("model call (8 request(s)): 512/37,600 prompt tokens read, 31 s into the call")
    assert "512/37,600 prompt tokens read" in out.getvalue()


def test_release_drops_the_prefix_cache_before_a_training_step():
    tok = tiny_tokenizer()
    policy = TransformersPolicy(tiny_model(tok, seed=0), tok, seed=1)
    run_turns(policy, SAMPLINGS[1], turns=2)
    assert policy.cache.nbytes > 0
    policy.release()
    assert policy.cache.nbytes == 0 and policy.cache.entries == []
    run_turns(policy, SAMPLINGS[1], turns=1)  # and generation goes on


def test_the_long_prompt_bench_runs_its_tiny_preset():
    """scripts/bench_long_prompts.py on the tiny model: a line per engine with its peak, and the two
    engines' ids equal."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_long_prompts.py"), "--model", "tiny",
                           "--lengths", "300", "--rows", "2", "--new-tokens", "4"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [r["engine"] for r in lines] == ["cached", "hf"] and all(r["prompt_tokens"] <= 300 for r in lines)
    assert all(r["prompt_tokens"] > 250 and r["peak_rss_mb"] > 0 for r in lines)
    assert "same ids in every engine: True" in done.stdout
