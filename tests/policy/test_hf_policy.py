"""The policy contract on a tiny model: ids, text, log-probs, batching, stops, adapters."""

import re

import pytest
import torch

from coevo.agent.policy import ChatRequest
from coevo.harness.events import SamplingParams
from coevo.policy.chat import to_template_messages
from coevo.policy.hf import TransformersPolicy
from coevo.policy.tiny import tiny_model, tiny_policy, tiny_tokenizer

MSGS = [
    [{"role": "system", "content": "You solve problems."}, {"role": "user", "content": "What is 2 + 3?"}],
    [{"role": "user", "content": "Count to 5."}],
    [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"},
     {"role": "tool", "name": "calc", "content": "42"}],
]


def fresh_logprobs(model, prompt, completion, temperature):
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].double()
    return torch.log_softmax(logits / temperature, -1).gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)


@pytest.fixture(scope="module")
def policy():
    return tiny_policy(seed=1)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_match_a_fresh_forward_and_ids_decode_to_text(policy, temperature):
    reqs = [ChatRequest(m, SamplingParams(temperature=temperature, max_new_tokens=24)) for m in MSGS]
    gens = policy.generate(reqs)
    assert len(gens) == len(reqs)
    for g in gens:
        assert len(g.completion_ids) > 0 and len(g.logprobs) == len(g.completion_ids)
        assert policy.tokenizer.decode(g.completion_ids, skip_special_tokens=True) == g.text
        ref = fresh_logprobs(policy.model, g.prompt_ids, g.completion_ids, temperature)
        assert torch.allclose(torch.tensor(g.logprobs, dtype=torch.float64), ref, atol=1e-4), (g.logprobs, ref)


def test_prompt_ids_are_the_chat_template(policy):
    g = policy.generate([ChatRequest(MSGS[2], SamplingParams(max_new_tokens=4))])[0]
    rendered = policy.tokenizer.apply_chat_template(to_template_messages(MSGS[2], False), add_generation_prompt=True,
                                                    tokenize=False)
    assert policy.tokenizer.decode(g.prompt_ids) == rendered
    assert "[calc result]\n42" in rendered  # tool turns become user turns for small chat models


def test_batched_greedy_equals_one_at_a_time(policy):
    reqs = [ChatRequest(m, SamplingParams(temperature=0.0, max_new_tokens=16)) for m in MSGS]
    batched = policy.generate(reqs)
    single = [policy.generate([r])[0] for r in reqs]
    assert batched
    for b, s in zip(batched, single, strict=True):
        assert b.completion_ids == s.completion_ids and b.prompt_ids == s.prompt_ids
        assert b.logprobs == pytest.approx(s.logprobs, abs=1e-4)


def test_sampling_is_reproducible_for_a_seed():
    reqs = [ChatRequest(MSGS[0], SamplingParams(temperature=1.0, max_new_tokens=12))] * 2
    a, b = tiny_policy(seed=3).generate(reqs), tiny_policy(seed=3).generate(reqs)
    assert [g.completion_ids for g in a] == [g.completion_ids for g in b]
    assert a[0].completion_ids != a[1].completion_ids or len(a[0].completion_ids) < 3  # two samples differ


def test_length_stop_string_and_eos():
    req = ChatRequest(MSGS[0], SamplingParams(temperature=1.0, max_new_tokens=16))
    full = tiny_policy(seed=4).generate([req])[0]
    assert full.finish_reason == "length" and len(full.completion_ids) == 16
    tok = tiny_tokenizer()
    # the same sampling seed reproduces the same tokens, so a stop string taken from the middle of
    # the full text must cut generation at the token that completes it
    pieces = [tok.decode(full.completion_ids[: k + 1]) for k in range(16)]
    k = next(k for k in range(6, 16) if len(pieces[k]) > len(pieces[k - 1]) and pieces[k][-1].strip())
    stop = pieces[k][-1]
    first = next(j for j in range(16) if stop in pieces[j])
    stopping = SamplingParams(temperature=1.0, max_new_tokens=16, stop=[stop])
    cut = tiny_policy(seed=4).generate([ChatRequest(MSGS[0], stopping)])[0]
    assert cut.finish_reason == "stop" and stop in cut.text
    assert cut.completion_ids == full.completion_ids[: first + 1]
    # in a batch, rows that stop early are padded by generate(): the padding must be cut off
    for g in tiny_policy(seed=4).generate([ChatRequest(m, stopping) for m in MSGS]):
        assert tok.pad_token_id not in g.completion_ids
        if g.finish_reason == "stop":
            assert stop in g.text and stop not in tok.decode(g.completion_ids[:-1], skip_special_tokens=True)
        else:
            assert len(g.completion_ids) == 16 and stop not in g.text
    # declare the 4th sampled token an EOS: generation stops right after it, and it is kept
    model = tiny_model(tok, seed=4)
    model.generation_config.eos_token_id = [tok.eos_token_id, full.completion_ids[3]]
    g = TransformersPolicy(model, tok, seed=4).generate([req])[0]
    j = next(j for j, t in enumerate(full.completion_ids) if t in (tok.eos_token_id, full.completion_ids[3]))
    assert g.completion_ids == full.completion_ids[: j + 1] and g.finish_reason == "stop"


def test_peft_adapter_is_used(tmp_path):
    from peft import LoraConfig, get_peft_model

    from coevo.policy.load import load_model

    tok = tiny_tokenizer()
    base = tiny_model(tok, seed=2)
    peft_model = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    peft_model.save_pretrained(tmp_path / "adapter")
    lm, _ = load_model("tiny", seed=2, adapter=str(tmp_path / "adapter"))
    policy = TransformersPolicy(lm, tok)
    plain = TransformersPolicy(tiny_model(tok, seed=2), tok)
    req = ChatRequest(MSGS[0], SamplingParams(temperature=1.0, max_new_tokens=8))
    g = policy.generate([req])[0]
    ref = fresh_logprobs(lm, g.prompt_ids, g.completion_ids, 1.0)
    assert torch.allclose(torch.tensor(g.logprobs, dtype=torch.float64), ref, atol=1e-4)
    base_ref = fresh_logprobs(plain.model, g.prompt_ids, g.completion_ids, 1.0)
    assert not torch.allclose(ref, base_ref, atol=1e-3)  # the adapter changes the distribution


def test_tiny_factory_is_deterministic():
    a, b = tiny_tokenizer(), tiny_tokenizer()
    assert a.get_vocab() == b.get_vocab()
    ma, mb = tiny_model(a, seed=5), tiny_model(b, seed=5)
    assert all(torch.equal(x, y) for x, y in zip(ma.state_dict().values(), mb.state_dict().values(), strict=True))
    assert not torch.equal(tiny_model(a, seed=6).lm_head.weight, ma.lm_head.weight)
    assert tiny_model(a, arch="llama").config.model_type == "llama"
    with pytest.raises(ValueError, match="arch"):
        tiny_model(a, arch="gpt9")


def test_tokenizer_without_template_is_refused():
    tok = tiny_tokenizer()
    tok.chat_template = None
    with pytest.raises(ValueError, match="chat template"):
        TransformersPolicy(tiny_model(tiny_tokenizer()), tok)


def test_a_prompt_over_the_context_window_is_refused_with_its_numbers(policy):
    from coevo.agent import run_episode
    from coevo.envs.arithmetic import ArithmeticEnv
    from coevo.harness.defaults import base_harness

    assert policy.context_window == 4096  # the tiny model's config.max_position_embeddings
    long = [{"role": "user", "content": "word " * 5000}]
    before = policy.prompt_tokens
    short, refused = policy.generate([ChatRequest(MSGS[1], SamplingParams(max_new_tokens=4)),
                                      ChatRequest(long, SamplingParams(max_new_tokens=16))])
    assert isinstance(refused, ValueError) and re.search(
        r"prompt has \d+ tokens and max_new_tokens is 16, \d+ in all, over the model's context window of 4096 tokens",
        str(refused))
    assert len(short.completion_ids) > 0  # the request that fits is generated all the same
    assert policy.prompt_tokens == before + len(policy.prompt_ids(MSGS[1]))  # the long prompt was never read
    n = len(policy.prompt_ids(MSGS[1]))
    (over,) = policy.generate([ChatRequest(MSGS[1], SamplingParams(max_new_tokens=4097 - n))])
    assert isinstance(over, ValueError) and "context window" in str(over)  # the completion budget counts too
    assert len(policy.generate([ChatRequest(MSGS[1], SamplingParams(max_new_tokens=2))])) == 1
    env = ArithmeticEnv(n_tasks=10)
    harness = base_harness().set_param("system_prompt", "template", "word " * 5000)
    trace = run_episode(env.tasks("test")[0], harness, policy, env)
    assert trace.error_source == "policy" and "context window of 4096" in trace.error
    # in one batch with an episode that fits, only the long one fails
    from coevo.agent.episode import Job
    from coevo.agent.runtime import run_episodes

    task = env.tasks("test")[0]
    long_run, short_run = run_episodes([Job(task, harness), Job(task, base_harness())], policy, env, batch_size=2,
                                       max_steps=1)
    assert long_run.error_source == "policy" and short_run.error is None and short_run.model_calls
