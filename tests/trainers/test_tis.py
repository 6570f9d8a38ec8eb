"""Sampler/trainer mismatch: the per-step figures and the truncated importance sampling correction.

A fake sampler whose log-probs differ from the trainer's by a known offset per token: the GRPO loss
and gradient with ``tis_cap`` set equal a float64 reference computed here by hand (each token's
weight min(exp(old - sampler), cap) times token_mean's 1/tokens), a cap above every weight leaves
them untruncated, ``tis_cap=None`` gives the uncorrected loss, tokens of calls without sampler
log-probs keep weight 1 in the same micro-batch, and the mismatch figures equal the known |offset|.
A fake vLLM engine that reports the trainer's probabilities shifted by a known amount carries them
through ``VLLMPolicy``, the replay buffer (which keeps them beside the recomputed behaviour
log-probs) and a step's figures.
"""

import copy
import json
import math

import pytest
import torch

from coevo.agent.policy import ChatRequest
from coevo.agent.trace import ModelCall, Trace
from coevo.buffers import ReplayBuffer
from coevo.harness.events import SamplingParams
from coevo.policy.tiny import tiny_model, tiny_tokenizer
from coevo.policy.vllm import VLLMPolicy
from coevo.rundir.records import GRPOMetrics
from coevo.trainers.advantages import group_advantages
from coevo.trainers.logprobs import logprob_fn
from tests.policy.test_vllm_policy import FakeEngine
from tests.trainers.helpers import make_trainer, synthetic_traces

OFFSETS = [-1.0, -0.3, 0.0, 0.4, 2.0, -2.5]  # sampler - trainer per token, cycled: exp(-offset) = 2.7, 1.35, 1, ...
CAP = 2.0  # truncates the weights of offsets -1.0 and -2.5 (exp 2.72 and 12.2), and no others


@pytest.fixture
def tok():
    return tiny_tokenizer()


def with_sampler(traces, *, skip_every: int | None = 3):
    """Give each call sampler log-probs = behaviour + OFFSETS (cycled over the step's tokens); every
    ``skip_every``-th call has none. Returns the offsets of the tokens that have them, in order."""
    k, offsets, call_index = 0, [], 0
    for trace in traces:
        for call, old in zip(trace.model_calls, trace.behaviour_logprobs, strict=True):
            call_index += 1
            if skip_every and call_index % skip_every == 0:
                call.sampler_logprobs = None
                continue
            off = [OFFSETS[(k + j) % len(OFFSETS)] for j in range(len(old))]
            k += len(old)
            call.sampler_logprobs = [o + d for o, d in zip(old, off, strict=True)]
            offsets.extend(off)
    return offsets


def reference(model, traces, cap):
    """(loss, {name: grad}) in float64 by hand: full logits, log_softmax, the PPO clip (eps 0.2/0.28),
    token_mean weights 1/tokens, times min(exp(old - sampler), cap) where the call has sampler
    log-probs (cap None: no correction; math.inf: the untruncated ratio)."""
    m64 = copy.deepcopy(model).double()
    adv, _, _ = group_advantages([t.task_id for t in traces], [t.reward for t in traces])
    rows = []  # (prompt+completion, n prompt, completion, old, sampler, advantage)
    for trace, a in zip(traces, adv.tolist(), strict=True):
        for call, old in zip(trace.model_calls, trace.behaviour_logprobs, strict=True):
            rows.append((call.prompt_ids, call.completion_ids, old, call.sampler_logprobs, a))
    n_tokens = sum(len(r[1]) for r in rows)
    loss = torch.zeros((), dtype=torch.float64)
    for prompt, completion, old, sampler, a in rows:
        ids = torch.tensor([prompt + completion])
        logits = m64(ids).logits[0, len(prompt) - 1 : len(prompt) + len(completion) - 1]  # [n, V]
        logp = torch.log_softmax(logits, -1).gather(1, torch.tensor(completion)[:, None])[:, 0]  # [n]
        old_t = torch.tensor(old, dtype=torch.float64)
        ratio = torch.exp(logp - old_t)
        surrogate = torch.maximum(-ratio * a, -ratio.clamp(1 - 0.2, 1 + 0.28) * a)
        weight = torch.full_like(old_t, 1.0 / n_tokens)
        if cap is not None and sampler is not None:
            weight = weight * torch.exp(old_t - torch.tensor(sampler, dtype=torch.float64)).clamp(max=cap)
        loss = loss + (weight * surrogate).sum()
    loss.backward()
    return float(loss.detach()), {n: p.grad.float() for n, p in m64.named_parameters()}


def step_with_grads(trainer, model, traces):
    """One step; the gradient it applied, read at clipping time (after every micro-batch's backward)."""
    grads, clip = {}, trainer.accelerator.clip_grad_norm_

    def spy(params, max_norm):
        grads.update({n: p.grad.detach().clone() for n, p in model.named_parameters()})
        return clip(params, max_norm)

    trainer.accelerator.clip_grad_norm_ = spy
    return trainer.step(traces), grads


@pytest.mark.parametrize("cap", [CAP, math.inf, None], ids=["cap2", "no-truncation", "off"])
def test_tis_loss_and_gradient_equal_the_float64_reference(tok, cap):
    model = tiny_model(tok, seed=0)
    traces = synthetic_traces(model, tok, n_tasks=3, per_task=4, calls=2)
    offsets = with_sampler(traces)
    want_loss, want_grads = reference(model, traces, cap)
    trainer = make_trainer(model, tok, lr=0.0, micro_batch_size=8, tis_cap=cap)  # lr 0: the model stays as referenced
    m, grads = step_with_grads(trainer, model, traces)

    assert m.loss == pytest.approx(want_loss, rel=1e-5, abs=1e-7)
    scale = max(float(g.abs().max()) for g in want_grads.values())
    for name, g in want_grads.items():
        torch.testing.assert_close(grads[name], g, rtol=1e-4, atol=1e-5 * scale, msg=name)
    if cap is not None:  # the correction changes the loss: the uncorrected one is not what the step took
        assert m.loss != pytest.approx(reference(model, traces, None)[0], rel=1e-3)
    if cap == CAP:  # truncation matters: the untruncated ratio gives another loss
        assert m.loss != pytest.approx(reference(model, traces, math.inf)[0], rel=1e-3)

    d = torch.tensor(offsets, dtype=torch.float64).abs()
    assert m.sampler_tokens == len(offsets) < m.tokens  # every third call has no sampler log-probs
    assert m.sampler_mismatch_mean == pytest.approx(float(d.mean()), abs=1e-6)
    assert m.sampler_mismatch_max == pytest.approx(2.5, abs=1e-6)
    truncated = sum(math.exp(-o) > CAP for o in offsets) / len(offsets)
    assert m.tis_truncated_fraction == ({CAP: pytest.approx(truncated), math.inf: 0.0, None: None}[cap])
    assert 0 < truncated < 1


def test_without_sampler_logprobs_the_figures_are_empty_and_the_cap_changes_nothing(tok):
    model = tiny_model(tok, seed=0)
    traces = synthetic_traces(model, tok)
    plain = make_trainer(model, tok, lr=0.0, micro_batch_size=8).step(traces)
    capped = make_trainer(model, tok, lr=0.0, micro_batch_size=8, tis_cap=CAP).step(traces)
    assert capped.loss == pytest.approx(plain.loss, rel=1e-6)
    for m in (plain, capped):
        assert (m.sampler_mismatch_mean, m.sampler_mismatch_max, m.sampler_tokens, m.tis_truncated_fraction) == (
            None, None, 0, None)


def test_mismatch_figures_reach_the_round_records_steps(tok):
    """The round's record keeps every step's figures (``grpo.steps``) and writes the last step's at
    its top level (rounds.jsonl's form): the mismatch figures survive the JSON round trip both ways."""
    model = tiny_model(tok, seed=0)
    traces = synthetic_traces(model, tok)
    with_sampler(traces)
    step = make_trainer(model, tok, lr=0.0, tis_cap=CAP).step(traces)
    written = GRPOMetrics(buffer_traces=len(traces), steps=[step]).to_dict()
    back = GRPOMetrics.from_dict(json.loads(json.dumps(written)))
    keys = ("sampler_mismatch_mean", "sampler_mismatch_max", "sampler_tokens", "tis_truncated_fraction")
    assert back == GRPOMetrics(buffer_traces=len(traces), steps=[step])  # staleness too: the last step's
    assert all(written[k] == written["steps"][0][k] == getattr(step, k) for k in keys)
    assert step.sampler_mismatch_max == pytest.approx(2.5, abs=1e-6) and step.sampler_tokens > 0

def test_a_sampler_logprob_count_that_does_not_fit_the_call_is_refused(tok):
    model = tiny_model(tok, seed=0)
    traces = synthetic_traces(model, tok)
    with_sampler(traces, skip_every=None)
    traces[1].model_calls[0].sampler_logprobs.append(-1.0)
    trainer = make_trainer(model, tok, tis_cap=CAP)
    with pytest.raises(ValueError, match=r"trace tr-0-1 call 0: \d+ sampler log-probs for \d+ tokens"):
        trainer.step(traces)
    assert trainer.version == 0


def test_a_fake_vllm_engines_logprobs_travel_beside_the_recomputed_ones_to_the_step(tok, tmp_path):
    model = tiny_model(tok, seed=0)
    shift = 0.25
    policy = VLLMPolicy(FakeEngine(model, shift), tok)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=4)
    traces = []
    for t in range(2):
        for k in range(2):
            gen = policy.generate([ChatRequest([{"role": "user", "content": f"task {t} try {k}"}], sampling)])[0]
            call = ModelCall(0, [], gen.prompt_ids, gen.completion_ids, gen.logprobs, gen.text, gen.finish_reason,
                             temperature=1.0)  # as coevo/agent/episode.py records a generation
            traces.append(Trace(f"tr-{t}-{k}", f"task-{t}", "env", "train", "h", "base", "0", model_calls=[call],
                                reward=float(k), passed=bool(k)))
    buffer = ReplayBuffer(tmp_path / "buffer", capacity=16)
    buffer.add(traces, round=0, model_version=0, logprob_fn=logprob_fn(model, tok.pad_token_id, temperature=1.0,
                                                                       batch_size=8))
    loaded = buffer.load(buffer.entries())
    for trace in loaded:  # the sampler's log-probs beside the trainer's recomputation, shift apart
        behaviour, sampler = trace.behaviour_logprobs[0], trace.model_calls[0].sampler_logprobs
        assert [b - s for b, s in zip(behaviour, sampler, strict=True)] == pytest.approx([shift] * 4, abs=1e-5)
    m = make_trainer(model, tok, lr=0.0, tis_cap=1.1).step(loaded)
    assert m.sampler_tokens == 16
    assert m.sampler_mismatch_mean == pytest.approx(shift, abs=1e-5)
    assert m.sampler_mismatch_max == pytest.approx(shift, abs=1e-5)
    assert m.tis_truncated_fraction == 1.0  # exp(0.25) = 1.28 > 1.1 on every token
