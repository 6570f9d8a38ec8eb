"""Prefix reuse is exact: the cached engine produces what re-reading every prompt produces.

The store (tree of segments, longest-prefix match, leaf-only LRU eviction, invalidation) is tested
on plain tensors; the engine on a tiny model against ``model.generate`` and against itself with
the cache off, over multi-turn conversations and across a GRPO step that changes the weights.
"""

import pytest
import torch

from coevo.agent.policy import ChatRequest
from coevo.harness.events import SamplingParams
from coevo.policy.hf import TransformersPolicy
from coevo.policy.prefix_cache import PrefixCache, common_prefix_len
from coevo.policy.tiny import tiny_model, tiny_tokenizer
from tests.trainers.helpers import make_trainer, synthetic_traces

SYSTEM = {"role": "system", "content": "You are a careful problem solver. Use the calculator for arithmetic "
          "and give the final answer as <answer>...</answer>. " * 2}
DEMO = [{"role": "user", "content": "What is 12 * 7?"},
        {"role": "assistant", "content": '<tool_call>{"name": "calculator", "arguments": {"expression": "12*7"}}</tool_call>'},
        {"role": "tool", "name": "calculator", "content": "84"},
        {"role": "assistant", "content": "<answer>84</answer>"}]
QUESTIONS = ["What is 3 + 4?", "What is 19 - 5?", "Compute 6 * 6.", "What is 100 / 4?"]


def kv(tokens: int, value: float, layers: int = 2) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """States whose every entry is ``value``: [heads=2, tokens, head_dim=3] per layer."""
    return [(torch.full((2, tokens, 3), value), torch.full((2, tokens, 3), -value)) for _ in range(layers)]


def test_common_prefix_len():
    assert common_prefix_len((1, 2, 3, 4), (1, 2, 9)) == 2
    assert common_prefix_len((1, 2, 3), (1, 2, 3, 4)) == 3
    assert common_prefix_len((5,), (1,)) == 0
    assert common_prefix_len((), (1,)) == 0
    a = tuple(range(1000))
    for k in (0, 1, 499, 998):
        assert common_prefix_len(a, a[:k] + (-1,) + a[k + 1:]) == k


def test_states_follow_the_parent_chain_and_match_stops_before_the_last_token():
    cache = PrefixCache(1 << 20)
    root = cache.insert([1, 2, 3, 4], kv(4, 1.0), None, 0)
    child = cache.insert([1, 2, 3, 7, 8], kv(2, 2.0), root, 3)  # shares 3 tokens with root
    entry, n = cache.match([1, 2, 3, 7, 8, 9], limit=5)
    assert entry is child and n == 5
    keys = cache.states(entry, n)[0][0]  # [heads, 5, head_dim]
    assert keys.shape == (2, 5, 3) and keys[0, :, 0].tolist() == [1, 1, 1, 2, 2]
    entry, n = cache.match([1, 2, 3, 4], limit=3)  # the last prompt token is always read
    assert n == 3 and cache.states(entry, n)[1][1][0, :, 0].tolist() == [-1, -1, -1]
    assert cache.match([9, 9])[1] == 0


def test_eviction_bounds_bytes_and_spares_parents():
    per_token = 2 * 2 * (2 * 3 * 4)  # layers * (k, v) * heads * head_dim * 4 bytes
    cache = PrefixCache(10 * per_token)
    root = cache.insert(list(range(4)), kv(4, 1.0), None, 0)
    a = cache.insert(list(range(4)) + [10, 11, 12], kv(3, 2.0), root, 4)
    cache.match(list(range(4)) + [10, 11, 12, 0])  # uses a (and root)
    b = cache.insert(list(range(4)) + [20, 21, 22], kv(3, 3.0), root, 4)  # 10 tokens: full
    assert cache.nbytes == 10 * per_token and a.alive and b.alive
    c = cache.insert(list(range(4)) + [30], kv(1, 4.0), root, 4)  # over budget: the least recent leaf (a) goes
    assert not a.alive and b.alive and c.alive and root.alive and cache.nbytes <= cache.max_bytes
    assert cache.insert([7] * 20, kv(20, 1.0), None, 0) is None  # larger than the whole budget
    assert cache.insert([9, 9, 9], kv(1, 1.0), a, 2) is None  # its parent is gone


def test_validate_clears_on_a_new_fingerprint():
    cache = PrefixCache(1 << 20)
    cache.validate(("0", 1))
    cache.insert([1, 2, 3], kv(3, 1.0), None, 0)
    cache.validate(("0", 1))
    assert len(cache.entries) == 1
    cache.validate(("0", 2))
    assert cache.entries == [] and cache.nbytes == 0 and cache.invalidations == 1


def policy_pair(seed: int = 1, **kwargs):
    tok = tiny_tokenizer()
    model = tiny_model(tok, seed=seed)
    cached = TransformersPolicy(model, tok, seed=7, **kwargs)
    full = TransformersPolicy(model, tok, seed=7, prefix_cache_mb=0, **kwargs)
    return cached, full


def conversations(turns: int, tool: str = "calculator") -> list[list[list[dict]]]:
    """Per question, the message lists of ``turns`` successive calls of one episode: each call
    adds an assistant turn and a tool result to the previous one."""
    out = []
    for q in QUESTIONS:
        msgs = [SYSTEM, *DEMO, {"role": "user", "content": q}]
        calls = [list(msgs)]
        for t in range(turns - 1):
            msgs = [*msgs, {"role": "assistant", "content": f'<tool_call>{{"name": "{tool}"}}</tool_call> {t}'},
                    {"role": "tool", "name": tool, "content": str(40 + t)}]
            calls.append(list(msgs))
        out.append(calls)
    return out


def run_turns(policy, sampling: SamplingParams, turns: int = 3):
    """Multi-turn episodes: each call's prompt extends the previous call's prompt and completion,
    as the runtime's conversations do (the assistant turn is the model's own text)."""
    histories = [[SYSTEM, *DEMO, {"role": "user", "content": q}] for q in QUESTIONS]
    gens_per_turn = []
    for t in range(turns):
        gens = policy.generate([ChatRequest(list(h), sampling) for h in histories])
        gens_per_turn.append(gens)
        for h, g in zip(histories, gens, strict=True):
            h += [{"role": "assistant", "content": g.text}, {"role": "tool", "name": "calculator", "content": str(t)}]
    return gens_per_turn


@pytest.mark.parametrize("sampling", [SamplingParams(temperature=0.0, max_new_tokens=12),
                                      SamplingParams(temperature=0.8, top_p=0.9, max_new_tokens=12)],
                         ids=["greedy", "sampled"])
def test_cached_engine_equals_full_prefill_over_multi_turn_episodes(sampling):
    cached, full = policy_pair()
    a, b = run_turns(cached, sampling), run_turns(full, sampling)
    for ga, gb in zip(a, b, strict=True):
        for x, y in zip(ga, gb, strict=True):
            assert x.prompt_ids == y.prompt_ids and x.completion_ids == y.completion_ids and x.text == y.text
            assert x.logprobs == pytest.approx(y.logprobs, abs=1e-5)
    # the harness prefix was read once, later turns continued from earlier ones
    assert full.prompt_tokens_computed == full.prompt_tokens
    assert cached.prompt_tokens == full.prompt_tokens
    assert cached.prompt_tokens_computed < 0.5 * cached.prompt_tokens


@pytest.mark.parametrize("sampling", [SamplingParams(temperature=0.0, max_new_tokens=10),
                                      SamplingParams(temperature=0.9, top_p=0.8, max_new_tokens=10)],
                         ids=["greedy", "sampled"])
def test_cached_engine_equals_transformers_generate(sampling):
    tok = tiny_tokenizer()
    model = tiny_model(tok, seed=2)
    cached = TransformersPolicy(model, tok, seed=5)
    hf = TransformersPolicy(model, tok, engine="hf", seed=5)
    for calls in zip(*conversations(turns=3), strict=True):  # turn by turn, all questions batched
        reqs = [ChatRequest(m, sampling) for m in calls]
        for x, y in zip(cached.generate(reqs), hf.generate(reqs), strict=True):
            assert x.completion_ids == y.completion_ids and x.finish_reason == y.finish_reason
            assert x.logprobs == pytest.approx(y.logprobs, abs=1e-5)
    assert cached.prompt_tokens_computed < hf.prompt_tokens_computed == hf.prompt_tokens


def test_a_grpo_step_invalidates_the_cache():
    cached, full = policy_pair(seed=3)
    sampling = SamplingParams(temperature=0.0, max_new_tokens=8)
    reqs = [ChatRequest(c[1], sampling) for c in conversations(turns=2)]
    cached.generate(reqs)  # fills the cache with states of the current weights
    assert cached.cache.entries
    trainer = make_trainer(cached.model, cached.tokenizer, lr=5e-2, micro_batch_size=4)
    trainer.step(synthetic_traces(cached.model, cached.tokenizer))
    after = cached.generate(reqs)
    assert cached.cache.invalidations == 1
    fresh = full.generate(reqs)
    for x, y in zip(after, fresh, strict=True):
        assert x.completion_ids == y.completion_ids
        assert x.logprobs == pytest.approx(y.logprobs, abs=1e-5)

    # the check has teeth: states kept across the step would give other log-probs
    stale, _ = policy_pair(seed=3)
    stale.generate(reqs)
    stale.cache.validate = lambda fingerprint: None
    stale.model.load_state_dict(cached.model.state_dict())
    wrong = stale.generate(reqs)
    assert any(x.logprobs != pytest.approx(y.logprobs, abs=1e-5) for x, y in zip(wrong, fresh, strict=True))


def test_sliding_window_models_use_the_transformers_engine():
    tok = tiny_tokenizer()
    model = tiny_model(tok, seed=0)
    model.config.use_sliding_window, model.config.sliding_window = True, 16
    assert TransformersPolicy(model, tok).engine == "hf"
    with pytest.raises(ValueError, match="engine='vllm'; choose one of"):
        TransformersPolicy(model, tok, engine="vllm")


PREFIX = '<tool_call>{"name": "calculator", "arguments": {'


@pytest.mark.parametrize("sampling", [SamplingParams(temperature=0.0, max_new_tokens=10),
                                      SamplingParams(temperature=0.9, top_p=0.8, max_new_tokens=10)],
                         ids=["greedy", "sampled"])
def test_a_reply_prefix_is_prompt_not_completion_in_every_engine(sampling):
    """A prefilled reply start (tool_choice) ends the prompt ids and never enters the completion;
    the cached engine (whose prefix cache matches on ids, and whose next call continues from a
    prefilled one) gives what ``model.generate`` and the uncached engine give, and every sampler
    log-prob is what a fresh forward over prompt + completion gives: the trainer's view."""
    tok = tiny_tokenizer()
    model = tiny_model(tok, seed=2)
    engines = {"cached": TransformersPolicy(model, tok, seed=5),
               "uncached": TransformersPolicy(model, tok, seed=5, prefix_cache_mb=0),
               "hf": TransformersPolicy(model, tok, engine="hf", seed=5)}
    prefix_ids = tok.encode(PREFIX, add_special_tokens=False)
    assert prefix_ids and tok.decode(prefix_ids) == PREFIX
    got = {}
    for name, policy in engines.items():
        histories = [[SYSTEM, *DEMO, {"role": "user", "content": q}] for q in QUESTIONS]
        turns = []
        for t in range(3):
            prefix = PREFIX if t < 2 else ""  # forced twice, then free
            requests = [ChatRequest(list(h), sampling, prefix) for h in histories]
            gens = policy.generate(requests)
            turns.append(gens)
            for r, h, g in zip(requests, histories, gens, strict=True):
                plain = policy.prompt_ids(r.messages)
                assert g.prompt_ids == plain + (prefix_ids if prefix else [])
                assert tok.decode(g.completion_ids, skip_special_tokens=True) == g.text
                assert not g.text.startswith(PREFIX)
                with torch.no_grad():
                    logits = model(torch.tensor([g.prompt_ids + g.completion_ids])).logits[0, len(g.prompt_ids) - 1:-1]
                temperature = sampling.temperature or 1.0
                ref = torch.log_softmax(logits.double() / temperature, -1).gather(
                    -1, torch.tensor(g.completion_ids)[:, None]).squeeze(-1)
                assert g.logprobs == pytest.approx(ref.tolist(), abs=1e-4)
                h += [{"role": "assistant", "content": prefix + g.text}, {"role": "tool", "name": "calculator",
                                                                           "content": str(t)}]
        got[name] = [[(g.prompt_ids, g.completion_ids, g.finish_reason) for g in gens] for gens in turns]
        logps = [[g.logprobs for g in gens] for gens in turns]
        if name == "cached":
            cached_logps = logps
        else:
            for a, b in zip(cached_logps, logps, strict=True):
                for x, y in zip(a, b, strict=True):
                    assert x == pytest.approx(y, abs=1e-5)
    assert got["cached"] == got["uncached"] == got["hf"]
    cached = engines["cached"]
    assert cached.prompt_tokens == engines["hf"].prompt_tokens
    assert cached.prompt_tokens_computed < 0.5 * cached.prompt_tokens  # prefixes and earlier turns reused
