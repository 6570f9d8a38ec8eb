"""Long prompts in bounded memory: a call whose past would exceed ``decode_mib`` runs as several
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
    split = TransformersPolicy(model, tok, seed=7, decode_mib=1e-6)  # every row its own batch
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
    policy.decode_bytes = 600 * per_token
    batches = policy._batches(prompts, cached, max_new_tokens=16)
    assert sorted(i for b in batches for i in b) == list(range(len(prompts)))
    for b in batches:
        tokens = len(b) * (max(cached[i] for i in b) + max(len(prompts[i]) - cached[i] for i in b) + 16)
        assert len(b) == 1 or tokens * per_token <= policy.decode_bytes
    assert len(batches) > 1
    policy.decode_bytes = 10**9
    assert policy._batches(prompts, cached, max_new_tokens=16) == [list(range(len(prompts)))]  # in order


def test_a_long_call_reports_its_progress(monkeypatch):
    monkeypatch.setattr(hf_module, "HEARTBEAT_S", 0.0)
    monkeypatch.setattr(decode_module, "PREFILL_CHUNK", 16)
    tok = tiny_tokenizer()
    policy = TransformersPolicy(tiny_model(tok, seed=0), tok, seed=1, decode_mib=1e-6)
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
policy = TransformersPolicy(model, tok, seed=0, prefix_cache_mb=0, decode_mib=48 if bounded else 10**6)
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
