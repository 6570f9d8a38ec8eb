"""GRPO steps on a tiny model: every trainable parameter moves, LoRA moves only the adapter,
the on-policy ratio is 1, stale log-probs engage clipping, checkpoints restore exactly."""

import pytest
import torch

from coevo.policy.tiny import tiny_model, tiny_tokenizer
from coevo.trainers.grpo import apply_lora
from tests.trainers.helpers import make_trainer, synthetic_traces


@pytest.fixture
def tok():
    return tiny_tokenizer()


def snapshot(model):
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def test_step_changes_every_trainable_parameter(tok):
    model = tiny_model(tok, seed=0)
    trainer = make_trainer(model, tok, lr=1e-3, micro_batch_size=3)
    before = snapshot(model)
    m = trainer.step(synthetic_traces(model, tok))
    after = dict(model.named_parameters())
    unchanged = [k for k in before if torch.equal(before[k], after[k])]
    assert unchanged == []
    assert m.sequences == 24 and m.tokens > 0 and m.loss != 0.0 and trainer.version == 1


def test_lora_changes_every_adapter_parameter_and_no_base_parameter(tok):
    model = apply_lora(tiny_model(tok, seed=0), r=4, target_modules=("q_proj", "v_proj"))
    before = snapshot(model)
    trainer = make_trainer(model, tok, lr=1e-2, micro_batch_size=4)
    trainer.step(synthetic_traces(model, tok))  # lora_B starts at zero: two steps move lora_A too
    trainer.step(synthetic_traces(model, tok, seed=1))
    after = dict(model.named_parameters())
    lora = [k for k in before if "lora_" in k]
    assert lora and all(not torch.equal(before[k], after[k]) for k in lora)
    assert all(torch.equal(before[k], after[k]) for k in before if "lora_" not in k)


def test_on_policy_ratio_is_one_and_stale_logprobs_clip(tok):
    model = tiny_model(tok, seed=0)
    trainer = make_trainer(model, tok, lr=0.0, micro_batch_size=8)
    fresh = trainer.step(synthetic_traces(model, tok))
    assert fresh.ratio_min == pytest.approx(1.0, abs=1e-4) and fresh.ratio_max == pytest.approx(1.0, abs=1e-4)
    assert fresh.clip_fraction == 0.0
    stale = trainer.step(synthetic_traces(model, tok, stale=0.5))
    assert stale.clip_fraction > 0.2 and stale.ratio_max > 1.5


def test_zero_variance_groups_are_reported_and_dropped(tok):
    model = tiny_model(tok, seed=0)
    traces = synthetic_traces(model, tok, n_tasks=2, per_task=2)
    for t in traces:
        t.reward = 1.0 if t.task_id == "task-0" else t.reward
    trainer = make_trainer(model, tok, micro_batch_size=4)
    m = trainer.step(traces, versions=[0, 0, 1, 1])
    assert m.zero_variance_fraction == 0.5 and m.sequences == 4  # only task-1's two traces x two calls
    assert m.staleness == {0: 2, -1: 2}
    for t in traces:
        t.reward = 1.0
    empty = trainer.step(traces)
    assert empty.sequences == 0 and empty.zero_variance_fraction == 1.0 and trainer.version == 1


@pytest.mark.parametrize("kl_estimator", ["k3", "k2"])
def test_kl_to_reference_for_lora(tok, kl_estimator):
    model = apply_lora(tiny_model(tok, seed=0), r=4, target_modules=("q_proj", "v_proj"))
    trainer = make_trainer(model, tok, lr=5e-2, beta=0.1, kl_estimator=kl_estimator,
                          micro_batch_size=8)
    first = trainer.step(synthetic_traces(model, tok))
    assert first.kl == pytest.approx(0.0, abs=1e-6)  # the adapter starts as the identity
    trainer.step(synthetic_traces(model, tok, seed=1))
    assert trainer.step(synthetic_traces(model, tok, seed=2)).kl > 0.0
    with pytest.raises(ValueError, match="ref_model"):
        make_trainer(tiny_model(tok), tok, beta=0.1).step(synthetic_traces(model, tok))


def test_dr_grpo_normalises_by_the_horizon_and_an_unknown_aggregation_is_refused(tok):
    """On-policy (ratio 1) every token's loss is −A, so token_mean's step loss × tokens and dr_grpo's ×
    (sequences × horizon) are both −Σ A over the step's tokens — with micro-batches of 5 sequences that
    do not divide the step, so the normalisers must be the step's, not the micro-batch's."""
    model = tiny_model(tok, seed=0)
    with pytest.raises(ValueError, match=r"aggregation must be one of \['token_mean', 'sequence_mean', 'dr_grpo'\]"):
        make_trainer(model, tok, aggregation="dapo")
    with pytest.raises(ValueError, match="loss_horizon"):
        make_trainer(model, tok, aggregation="dr_grpo")
    traces = synthetic_traces(model, tok)
    steps = {agg: make_trainer(tiny_model(tok, seed=0), tok, lr=0.0, micro_batch_size=5,
                              aggregation=agg, loss_horizon=8).step(traces)
             for agg in ("token_mean", "dr_grpo")}
    token_mean, dr_grpo = steps["token_mean"], steps["dr_grpo"]
    assert token_mean.tokens == dr_grpo.tokens and token_mean.sequences == dr_grpo.sequences == 24
    assert abs(token_mean.loss) > 1e-3
    assert dr_grpo.loss * 24 * 8 == pytest.approx(token_mean.loss * token_mean.tokens, rel=1e-5)


@pytest.mark.parametrize("lora", [False, True])
def test_checkpoint_round_trip_continues_identically(tok, tmp_path, lora):
    def make():
        m = tiny_model(tok, seed=0)
        m = apply_lora(m, r=4, target_modules=("q_proj",)) if lora else m
        return make_trainer(m, tok, lr=1e-3, micro_batch_size=4)

    a = make()
    a.step(synthetic_traces(a.unwrapped, tok, seed=0))
    a.save(tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "model").is_dir() and (tmp_path / "ckpt" / "trainer_state.pt").is_file()
    b = make()
    b.load(tmp_path / "ckpt")
    assert b.version == 1
    traces = synthetic_traces(a.unwrapped, tok, seed=5)
    a.step(traces)
    b.step(traces)
    for (ka, va), (_kb, vb) in zip(a.unwrapped.named_parameters(), b.unwrapped.named_parameters(), strict=True):
        assert torch.allclose(va, vb, atol=1e-7), ka


def test_a_call_sampled_at_another_temperature_than_the_run_is_scored_at_its_own(tok, tmp_path):
    """The harness samples at T=0.3 in a run whose rollout temperature is 0.7: the buffer's
    behaviour log-probs equal the sampler's, and the first GRPO step is on-policy (ratio 1), its
    KL reference scored at the same temperature (0 while the LoRA adapter is the identity)."""
    from coevo.agent.episode import Job
    from coevo.agent.runtime import run_episodes
    from coevo.buffers import ReplayBuffer
    from coevo.envs.arithmetic import ArithmeticEnv
    from coevo.harness.defaults import base_harness
    from coevo.policy.hf import TransformersPolicy
    from coevo.trainers.logprobs import logprob_fn

    model = apply_lora(tiny_model(tok, seed=0), r=4, target_modules=("q_proj", "v_proj"))
    env = ArithmeticEnv(n_tasks=10)
    harness = (base_harness().set_param("sampling", "temperature", 0.3).set_param("sampling", "max_new_tokens", 12)
               .set_param("token_annotation", "exclude_truncated", False))
    jobs = [Job(env.tasks("train")[0], harness, trace_id=f"t{k}") for k in range(4)]
    traces = run_episodes(jobs, TransformersPolicy(model, tok, seed=0), env, max_steps=2)
    for k, t in enumerate(traces):
        t.reward = float(k % 2)  # a group with a signal (the random model passes nothing)
    assert all(c.temperature == 0.3 for t in traces for c in t.model_calls)
    with ReplayBuffer(tmp_path / "buffer", capacity=8) as buf:
        fn = logprob_fn(model, tok.pad_token_id, temperature=0.7, batch_size=8)
        buf.add(traces, round=0, model_version=0, logprob_fn=fn)
    for t in traces:
        for call, behaviour in zip(t.model_calls, t.behaviour_logprobs, strict=True):
            assert behaviour == pytest.approx(call.sampler_logprobs, abs=1e-4)
    trainer = make_trainer(model, tok, lr=0.0, beta=0.1, micro_batch_size=8)
    for t in traces:  # the policy's own log-probs as the behaviour: the trainer alone must agree with them
        t.behaviour_logprobs = [list(c.sampler_logprobs) for c in t.model_calls]
    m = trainer.step(traces)
    assert m.sequences == 8
    assert m.ratio_min == pytest.approx(1.0, abs=1e-3) and m.ratio_max == pytest.approx(1.0, abs=1e-3)
    assert m.clip_fraction == 0.0 and m.kl == pytest.approx(0.0, abs=1e-6)


def test_a_prefilled_reply_trains_only_on_generated_tokens(tok, tmp_path):
    """tool_choice prefills the first reply: its tokens end the recorded prompt ids, the completion
    is only what the model generated, the buffer's recomputed behaviour log-probs equal the
    sampler's, and the first GRPO step on these calls is on-policy (ratio 1)."""
    from coevo.agent.episode import Job
    from coevo.agent.runtime import run_episodes
    from coevo.buffers import ReplayBuffer
    from coevo.envs.arithmetic import ArithmeticEnv
    from coevo.harness.defaults import base_harness
    from coevo.harness.library import ToolChoice
    from coevo.harness.library.tools import forced_call_prefix
    from coevo.policy.hf import TransformersPolicy
    from coevo.trainers.logprobs import logprob_fn

    model = tiny_model(tok, seed=0)
    env = ArithmeticEnv(n_tasks=10)
    harness = (base_harness().set_param("sampling", "temperature", 0.8).set_param("sampling", "max_new_tokens", 12)
               .set_param("token_annotation", "exclude_truncated", False).insert(ToolChoice(tool="calculator")))
    jobs = [Job(env.tasks("train")[0], harness, trace_id=f"t{k}") for k in range(4)]
    traces = run_episodes(jobs, TransformersPolicy(model, tok, seed=0), env, max_steps=2)
    from coevo.envs.arithmetic import CALCULATOR

    prefix = forced_call_prefix("calculator", CALCULATOR)
    prefix_ids = tok.encode(prefix, add_special_tokens=False)
    for k, t in enumerate(traces):
        t.reward = float(k % 2)  # a group with a signal (the random model passes nothing)
        first = t.model_calls[0]
        assert t.error is None and first.reply_prefix == prefix
        assert first.prompt_ids[-len(prefix_ids):] == prefix_ids and first.prefix_tokens == len(prefix_ids)
        assert tok.decode(first.completion_ids, skip_special_tokens=True) == first.text
        assert t.messages[[m["role"] for m in t.messages].index("assistant")]["content"] == prefix + first.text
    with ReplayBuffer(tmp_path / "buffer", capacity=8) as buf:
        fn = logprob_fn(model, tok.pad_token_id, temperature=0.8, batch_size=8)
        buf.add(traces, round=0, model_version=0, logprob_fn=fn)
        loaded = buf.load(buf.entries())
    assert [c.reply_prefix for t in loaded for c in t.model_calls[:1]] == [prefix] * 4
    for t in loaded:
        for call, behaviour in zip(t.model_calls, t.behaviour_logprobs, strict=True):
            assert len(behaviour) == len(call.completion_ids)
            assert behaviour == pytest.approx(call.sampler_logprobs, abs=1e-4)
    trainer = make_trainer(model, tok, lr=0.0, micro_batch_size=8)
    m = trainer.step(loaded)
    assert m.ratio_min == pytest.approx(1.0, abs=1e-3) and m.ratio_max == pytest.approx(1.0, abs=1e-3)
    assert m.clip_fraction == 0.0


def test_calls_recorded_without_sampling_parameters_load_but_are_not_trained(tok):
    """A buffer record made before model calls kept their sampling parameters loads with none (a
    run of an earlier version can still be read); training it is refused, naming the trace and the
    call, rather than scoring its tokens at a guessed temperature. The others train at their own."""
    import json
    import struct

    from coevo.buffers import decode_trace, encode_trace
    from coevo.trainers.batch import collate, training_sequences

    model = tiny_model(tok, seed=0)
    (old, new) = synthetic_traces(model, tok, n_tasks=1, per_task=2, calls=1)
    new.model_calls[0].temperature = 0.3
    payload = encode_trace(old)
    (n,) = struct.unpack_from("<I", payload)
    meta = json.loads(payload[4 : 4 + n])
    for call in meta["model_calls"]:  # the payload as a buffer written before this change holds it
        for key in ("temperature", "top_p", "max_new_tokens"):
            del call[key]
    head = json.dumps(meta).encode()
    loaded = decode_trace(struct.pack("<I", len(head)) + head + payload[4 + n :])
    assert loaded.model_calls[0].temperature is None and loaded.model_calls[0].logprob_temperature() is None
    with pytest.raises(ValueError, match=rf"^trace {old.trace_id} call 0 has no sampling temperature \(recorded by an "
                                         r"earlier coevo\)"):
        training_sequences([loaded, new], torch.tensor([1.0, -1.0]))
    seqs = training_sequences([old, new], torch.tensor([1.0, -1.0]))
    assert [s.temperature for s in seqs] == [1.0, 0.3]
    batch = collate(seqs, tok.pad_token_id)
    lengths = [len(s.completion_ids) for s in seqs]
    assert batch.temperatures.tolist() == pytest.approx([1.0] * lengths[0] + [0.3] * lengths[1])


def test_infrastructure_failures_leave_the_groups(tok):
    """A policy crash (out of memory) gives reward 0 that says nothing about the policy: it must not
    pull a group's baseline. task-0 keeps one real trace beside two crashes (no signal left);
    task-1 keeps two real traces with different rewards."""
    model = tiny_model(tok, seed=0)
    traces = synthetic_traces(model, tok, n_tasks=2, per_task=3, calls=1)
    rewards = {"tr-0-0": 1.0, "tr-0-1": 0.0, "tr-0-2": 0.0, "tr-1-0": 1.0, "tr-1-1": 0.0, "tr-1-2": 0.0}
    for t in traces:
        t.reward = rewards[t.trace_id]
        if t.trace_id in ("tr-0-1", "tr-0-2", "tr-1-2"):
            t.error, t.error_source, t.trainable = "policy: OutOfMemoryError: CUDA out of memory", "policy", False
    trainer = make_trainer(model, tok, lr=0.0, micro_batch_size=8)
    m = trainer.step(traces)
    assert m.sequences == 2  # task-1's two real traces; task-0's lone real trace has no group left
    assert m.excluded_traces == 3 and m.infra_traces == 3
    assert m.zero_variance_fraction == 0.5
    assert m.advantage_mean == pytest.approx(0.0, abs=1e-6)


def test_a_micro_batch_mixing_temperatures_is_on_policy_token_by_token(tok):
    """Calls sampled at 0.3, 0.7 and 1.3 in one micro-batch: the behaviour log-probs are each call's
    own, and the step's ratio is 1 on every token."""
    from coevo.buffers.logprobs import behaviour_logprobs
    from coevo.trainers.logprobs import logprob_fn

    model = tiny_model(tok, seed=0)
    traces = synthetic_traces(model, tok, n_tasks=2, per_task=2, calls=2)
    temps = iter([0.3, 1.3, 0.7, 0.3, 1.3, 0.3, 1.3, 1.3])
    for t in traces:
        for call in t.model_calls:
            call.temperature = next(temps)
    fn = logprob_fn(model, tok.pad_token_id, temperature=0.7, batch_size=8)
    for t, rows in zip(traces, behaviour_logprobs(traces, fn), strict=True):
        t.behaviour_logprobs = rows
        for call, row in zip(t.model_calls, rows, strict=True):
            own = logprob_fn(model, tok.pad_token_id, temperature=call.temperature, batch_size=8)
            assert row == pytest.approx(own([(call.prompt_ids, call.completion_ids)])[0], abs=1e-5)
    call = traces[0].model_calls[0]
    at_run = fn([(call.prompt_ids, call.completion_ids)])[0]
    assert max(abs(a - b) for a, b in zip(traces[0].behaviour_logprobs[0], at_run, strict=True)) > 0.1
    trainer = make_trainer(model, tok, lr=0.0, micro_batch_size=8)
    m = trainer.step(traces)
    assert m.sequences == 8
    assert m.ratio_min == pytest.approx(1.0, abs=1e-4) and m.ratio_max == pytest.approx(1.0, abs=1e-4)


def test_credit_prefill_teaches_the_forced_opening_under_the_prompt_without_it(tok):
    """``trainer.credit_prefill``: a success whose first reply the harness prefilled trains the
    prefix as actions under the prompt without it. One step (SGD, the same model and traces) raises
    the log-prob of the whole prefix after that prompt by far more than the plain step does, whose
    gradient reaches the prefix only through shared weights; its figures stay finite."""
    import copy

    from coevo.trainers.batch import training_sequences
    from coevo.trainers.logprobs import logprob_fn

    prefix = [7, 11, 13, 17, 19]
    base = tiny_model(tok, seed=0)
    traces = synthetic_traces(base, tok, n_tasks=2, per_task=4, calls=1)
    for t in traces:
        call = t.model_calls[0]
        call.prompt_ids, call.prefix_tokens, call.reply_prefix = call.prompt_ids + prefix, len(prefix), "<forced>"
    fn = logprob_fn(base, tok.pad_token_id, temperature=1.0, batch_size=8)
    for t, row in zip(traces, fn([(t.model_calls[0].prompt_ids, t.model_calls[0].completion_ids) for t in traces]), strict=True):
        t.behaviour_logprobs = [row]
    winners = [t for t in traces if t.reward > 0]

    def prefix_logp(model) -> float:  # Σ log P(prefix | prompt without it) over the successes
        score = logprob_fn(model, tok.pad_token_id, temperature=1.0, batch_size=8)
        return sum(sum(r) for r in score([(t.model_calls[0].prompt_ids[:-len(prefix)], prefix) for t in winners]))

    before, gains = prefix_logp(base), {}
    for credit in (False, True):
        model = copy.deepcopy(base)
        m = make_trainer(model, tok, optimizer="sgd", lr=0.5, weight_decay=0.0, credit_prefill=credit).step(traces)
        assert m.loss == m.loss and m.ratio_max == pytest.approx(1.0, abs=1e-4)
        gains[credit] = prefix_logp(model) - before
    assert gains[True] > 0.5 and gains[True] > 5 * abs(gains[False])

    adv = torch.tensor([1.0 if t.reward > 0 else -1.0 for t in traces])
    seqs = training_sequences(traces, adv, credit_prefill=True)
    for t, a, s in zip(traces, adv, seqs, strict=True):
        call = t.model_calls[0]
        moved = a > 0  # only successes credit the forced opening
        assert (s.completion_ids[:len(prefix)] == prefix) == bool(moved)
        assert s.prompt_ids + s.completion_ids == call.prompt_ids + call.completion_ids
        assert sum(v != v for v in s.old_logp) == (len(prefix) if moved else 0)
