"""Reading a micro-batch's common prompt prefix once (``GRPOTrainer(share_prefix=...)``, always on in a
run) gives the loss, the gradients and the behaviour log-probs of reading every row whole."""

import pytest
import torch
from transformers import DynamicCache

from coevo.policy.tiny import tiny_model, tiny_tokenizer
from coevo.trainers.grpo import apply_lora
from coevo.trainers.logprobs import MIN_SHARED_PREFIX, logprob_fn, shared_prefix_length
from tests.trainers.helpers import make_trainer, synthetic_traces


@pytest.fixture
def repeats(monkeypatch):
    """Counts the cache expansions, i.e. forward passes that took the shared-prefix path."""
    calls = []
    original = DynamicCache.batch_repeat_interleave

    def spy(self, n):
        calls.append(n)
        return original(self, n)

    monkeypatch.setattr(DynamicCache, "batch_repeat_interleave", spy)
    return calls


def test_shared_prefix_length_stops_at_the_first_needed_position():
    ids = torch.tensor([[1, 2, 3, 4, 5, 0], [1, 2, 3, 4, 6, 7], [1, 2, 3, 9, 9, 9]])
    mask = (ids != 0).long()
    assert shared_prefix_length(ids, mask, torch.tensor([4, 4, 5])) == 3  # row 2 differs at 3
    assert shared_prefix_length(ids[:2], mask[:2], torch.tensor([2, 4])) == 2  # hidden state 2 is needed
    assert shared_prefix_length(ids[:1], mask[:1], torch.tensor([4])) == 0  # one row: nothing to share


@pytest.mark.parametrize("pack", [True, False])
@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_shared_prefix_gives_the_loss_and_update_of_whole_rows(pack, arch, repeats):
    tok = tiny_tokenizer()
    results = {}
    for share in (True, False):
        model = tiny_model(tok, seed=0, arch=arch)
        traces = synthetic_traces(model, tok, n_tasks=3, per_task=4, calls=2, seed=1, stale=0.3,
                                  system=MIN_SHARED_PREFIX + 8)
        trainer = make_trainer(model, tok, optimizer="sgd", lr=0.5, max_grad_norm=1e9, micro_batch_size=4,
                               pack_calls=pack, share_prefix=share)
        before = len(repeats)
        metrics = trainer.step(traces)
        results[share] = (metrics, {k: v.detach().clone() for k, v in model.named_parameters()}, len(repeats) - before)
    (shared, w_shared, n_shared), (whole, w_whole, n_whole) = results[True], results[False]
    assert n_shared >= 3 and n_whole == 0  # every micro-batch of the shared run took the cached path
    assert shared.sequences == whole.sequences and shared.tokens == whole.tokens
    assert shared.loss == pytest.approx(whole.loss, rel=1e-5, abs=1e-7)
    assert shared.clip_fraction == pytest.approx(whole.clip_fraction) and whole.clip_fraction > 0
    start = tiny_model(tok, seed=0, arch=arch).state_dict()
    moved = max(float((w_whole[k] - start[k]).abs().max()) for k in w_whole)
    assert moved > 1e-2
    for k in w_whole:  # the prefix's gradient is the sum over the rows that read it
        assert (w_shared[k] - w_whole[k]).abs().max() < 1e-4 * moved, k


def test_shared_prefix_under_lora_with_the_kl_reference(repeats):
    tok = tiny_tokenizer()
    results = {}
    for share in (True, False):
        torch.manual_seed(0)
        model = apply_lora(tiny_model(tok, seed=0), r=4, alpha=8, dropout=0.0)
        for name, p in model.named_parameters():
            if "lora_B" in name:  # a non-zero adapter, so the reference (adapter off) differs from the policy
                torch.nn.init.normal_(p, std=0.05, generator=torch.Generator().manual_seed(hash(name) % 2**31))
        traces = synthetic_traces(model, tok, n_tasks=2, per_task=4, seed=2, stale=0.1, system=48)
        trainer = make_trainer(model, tok, optimizer="sgd", lr=0.5, max_grad_norm=1e9, micro_batch_size=8,
                               beta=0.1, share_prefix=share)
        metrics = trainer.step(traces)
        results[share] = (metrics, {k: v.detach().clone() for k, v in model.named_parameters() if v.requires_grad})
    (shared, w_shared), (whole, w_whole) = results[True], results[False]
    assert len(repeats) >= 2  # the policy pass and the reference pass
    assert whole.kl is not None and whole.kl > 0
    assert shared.kl == pytest.approx(whole.kl, rel=1e-4) and shared.loss == pytest.approx(whole.loss, rel=1e-5)
    for k in w_whole:
        assert torch.allclose(w_shared[k], w_whole[k], atol=1e-6), k


def test_behaviour_logprobs_with_a_shared_prefix_equal_whole_rows(repeats):
    tok = tiny_tokenizer()
    model = tiny_model(tok, seed=0)
    traces = synthetic_traces(model, tok, n_tasks=2, per_task=3, seed=3, system=40)
    queries = [(c.prompt_ids, c.completion_ids, 0.7) for tr in traces for c in tr.model_calls]
    whole = logprob_fn(model, tok.pad_token_id, temperature=1.0, batch_size=4)(queries)
    shared = logprob_fn(model, tok.pad_token_id, temperature=1.0, batch_size=4, share_prefix=True)(queries)
    assert repeats and len(whole) == len(shared) == len(queries)
    for a, b in zip(whole, shared, strict=True):
        assert len(a) == len(b) and max(abs(x - y) for x, y in zip(a, b, strict=True)) < 1e-5
