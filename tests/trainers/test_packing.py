"""Packing a trace's chained model calls into one row (``GRPOTrainer(pack_calls=...)``, always on in a
run) gives the loss and the update of one row per call, in fewer tokens; the buffer's ``sampler_first`` takes recorded
sampler log-probs and computes only the calls without them."""

import random

import pytest
import torch

from coevo.agent.trace import ModelCall, Trace
from coevo.buffers.logprobs import behaviour_logprobs, sampler_first
from coevo.policy.tiny import tiny_model, tiny_tokenizer
from coevo.trainers.batch import PackedSequence, pack_calls, training_sequences
from coevo.trainers.logprobs import logprob_fn
from tests.trainers.helpers import make_trainer


def chained_traces(model, tok, *, n_tasks=3, per_task=4, calls=3, seed=0):
    """Multi-turn traces as the runtime writes them: each call's prompt is the previous call's
    prompt and completion plus a tool result; behaviour log-probs from ``model``."""
    rng = random.Random(seed)
    vocab = len(tok)
    traces = []
    for t in range(n_tasks):
        for k in range(per_task):
            prompt, mc = [rng.randrange(3, vocab) for _ in range(rng.randint(5, 11))], []
            for c in range(calls):
                completion = [rng.randrange(3, vocab) for _ in range(rng.randint(2, 7))]
                mc.append(ModelCall(c, [], list(prompt), completion, None, "", "stop", temperature=1.0))
                prompt = prompt + completion + [rng.randrange(3, vocab) for _ in range(rng.randint(1, 4))]
            traces.append(Trace(f"tr-{t}-{k}", f"task-{t}", "env", "train", "h", "base", "0", model_calls=mc,
                                reward=float((k + t) % 2), passed=bool((k + t) % 2)))
    rows = iter(logprob_fn(model, tok.pad_token_id, temperature=1.0, batch_size=8)(
        [(c.prompt_ids, c.completion_ids) for tr in traces for c in tr.model_calls]))
    for tr in traces:
        tr.behaviour_logprobs = [next(rows) for _ in tr.model_calls]
    return traces


@pytest.mark.parametrize("aggregation", ["token_mean", "sequence_mean"])
def test_packed_calls_give_the_loss_and_update_of_one_row_per_call(aggregation):
    tok = tiny_tokenizer()
    results = {}
    for pack in (True, False):
        model = tiny_model(tok, seed=0)
        traces = chained_traces(model, tok)
        traces[1].behaviour_logprobs = [[v - 0.3 for v in row] for row in traces[1].behaviour_logprobs]  # clip some
        trainer = make_trainer(model, tok, optimizer="sgd", lr=0.5, micro_batch_size=3, aggregation=aggregation,
                               pack_calls=pack)
        metrics = trainer.step(traces)
        results[pack] = (metrics, {k: v.detach().clone() for k, v in model.named_parameters()})
    (packed, w_packed), (plain, w_plain) = results[True], results[False]
    assert packed.sequences == plain.sequences == 36 and packed.tokens == plain.tokens
    assert packed.loss == pytest.approx(plain.loss, rel=1e-5, abs=1e-7)
    assert packed.clip_fraction == pytest.approx(plain.clip_fraction) and packed.clip_fraction > 0
    moved = [k for k in w_plain if not torch.equal(w_plain[k], tiny_model(tok, seed=0).state_dict()[k])]
    assert moved  # the step moved the weights, and both paths moved them alike
    for k in w_plain:
        assert torch.allclose(w_packed[k], w_plain[k], atol=1e-6), k


def test_pack_calls_merges_only_chains_of_one_trace():
    tok = tiny_tokenizer()
    model = tiny_model(tok, seed=0)
    traces = chained_traces(model, tok, n_tasks=1, per_task=2, calls=3)
    broken = traces[1].model_calls[2]
    traces[1].model_calls[2] = ModelCall(2, [], [5] + broken.prompt_ids, broken.completion_ids, None, "", "stop",
                                        temperature=1.0)
    seqs = training_sequences(traces, torch.tensor([1.0, -1.0]))
    packed = pack_calls(seqs)
    assert [len(p.parts) if isinstance(p, PackedSequence) else 1 for p in packed] == [3, 2, 1]


def test_sampler_first_takes_recorded_logprobs_and_computes_the_rest():
    calls = [ModelCall(0, [], [1, 2], [3, 4], [-0.5, -0.25], "", "stop"),
             ModelCall(1, [], [1, 2, 3, 4, 9], [7], None, "", "stop")]
    trace = Trace("t", "task", "env", "train", "h", "base", "0", model_calls=calls, reward=1.0, passed=True)
    asked = []

    def compute(queries):
        asked.extend(queries)
        return [[-1.0] * len(q[1]) for q in queries]

    assert behaviour_logprobs([trace], sampler_first([trace], compute)) == [[[-0.5, -0.25], [-1.0]]]
    assert [q[1] for q in asked] == [[7]]  # only the call without sampler log-probs was computed
