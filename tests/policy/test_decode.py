"""The decode loop's sampler draws from softmax(logits / T) truncated to the top-p nucleus."""

import pytest
import torch

from coevo.policy.decode import RaceSampling, nucleus, sample


def test_nucleus_keeps_the_smallest_set_reaching_top_p():
    probs = torch.tensor([[0.1, 0.5, 0.05, 0.35], [0.97, 0.01, 0.01, 0.01]])
    kept = nucleus(probs, 0.8) > 0
    assert kept.tolist() == [[False, True, False, True], [True, False, False, False]]
    assert (nucleus(probs, 0.86) > 0).tolist()[0] == [True, True, False, True]


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.7, 1.0), (1.3, 0.75)])
def test_draws_follow_the_tempered_truncated_distribution(temperature, top_p):
    logits = torch.tensor([2.0, 1.0, 0.5, -1.0, 0.0, 1.5])
    want = torch.softmax(logits.double() / temperature, -1)
    if top_p < 1.0:
        want = nucleus(want[None], top_p)[0]
        want = want / want.sum()
    n = 40_000
    g = torch.Generator().manual_seed(0)
    noise = torch.empty(n, 6).exponential_(generator=g)
    tokens, logp = sample(logits.expand(n, -1), temperature, top_p, noise)
    freq = torch.bincount(tokens, minlength=6).double() / n
    assert torch.allclose(freq, want, atol=0.01), (freq, want)
    assert freq[want == 0].sum() == 0  # never outside the nucleus
    ref = torch.log_softmax(logits.double() / temperature, -1)[tokens]  # log-prob before truncation
    assert torch.allclose(logp.double(), ref, atol=1e-6)


def test_a_last_bit_change_of_the_logits_does_not_move_a_draw():
    """Two engines compute the same logits up to fp32 noise; their draws must agree, also when
    the drawn token lies in the long tail of a real-size vocabulary."""
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(64, 49152, generator=g) * 3  # [B, V]: most of the mass in a long tail
    noise = torch.empty(64, 49152).exponential_(generator=g)
    nudged = logits + 1e-5 * torch.randn(64, 49152, generator=g)
    a, _ = sample(logits, 0.7, 1.0, noise)
    b, _ = sample(nudged, 0.7, 1.0, noise)
    p = torch.softmax(logits / 0.7, -1).gather(-1, a[:, None])
    assert (p < 1e-3).sum() >= 8  # many draws are tail tokens
    assert a.tolist() == b.tolist()


def test_greedy_takes_the_argmax_with_its_untempered_logprob():
    logits = torch.tensor([[0.0, 3.0, 1.0], [2.0, -1.0, 0.5]])
    tokens, logp = sample(logits, 0.0, 1.0, None)
    assert tokens.tolist() == [1, 0]
    assert torch.allclose(logp, torch.log_softmax(logits, -1).max(-1).values)


def test_the_generate_processor_draws_what_the_decode_loop_draws():
    logits = torch.randn(5, 50, generator=torch.Generator().manual_seed(1))
    proc = RaceSampling(0.8, 0.9, torch.Generator().manual_seed(3))
    scores = proc(torch.zeros(5, 1, dtype=torch.long), logits)
    noise = torch.empty(5, 50).exponential_(generator=torch.Generator().manual_seed(3))
    tokens, _ = sample(logits, 0.8, 0.9, noise)
    assert scores.argmax(-1).tolist() == tokens.tolist()
