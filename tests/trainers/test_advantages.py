"""Advantages and loss aggregation against slow, obvious twins."""

import math
import random

import pytest
import torch

from coevo.kernels.objective import token_weights
from coevo.trainers.advantages import group_advantages


def loop_twin(ids, rewards, scale_by_std=True, eps=1e-6):
    groups: dict[str, list[float]] = {}
    for g, r in zip(ids, rewards, strict=True):
        groups.setdefault(g, []).append(r)
    out = []
    for g, r in zip(ids, rewards, strict=True):
        rs = groups[g]
        mean = sum(rs) / len(rs)
        if max(rs) == min(rs):
            out.append(0.0)
            continue
        std = math.sqrt(sum((x - mean) ** 2 for x in rs) / (len(rs) - 1))
        out.append((r - mean) / (std + eps) if scale_by_std else r - mean)
    return out


@pytest.mark.parametrize("scale_by_std", [True, False])
def test_advantages_match_loop_twin_with_unequal_groups_and_singletons(scale_by_std):
    rng = random.Random(0)
    ids, rewards = [], []
    for g, size in enumerate([1, 2, 3, 5, 8, 1, 4]):  # unequal sizes, two singletons
        for _ in range(size):
            ids.append(f"task-{g}")
            rewards.append(float(rng.random() < 0.5) if g % 2 else rng.random())
    order = list(range(len(ids)))
    rng.shuffle(order)  # groups interleaved, as traces from several harnesses arrive
    ids, rewards = [ids[i] for i in order], [rewards[i] for i in order]
    adv, signal, stats = group_advantages(ids, rewards, scale_by_std=scale_by_std)
    assert adv.tolist() == pytest.approx(loop_twin(ids, rewards, scale_by_std), abs=1e-5)
    zero = {g for g in set(ids) if len({r for i, r in zip(ids, rewards, strict=True) if i == g}) == 1}
    assert stats.n_groups == 7 and stats.zero_variance_groups == len(zero)
    assert signal.tolist() == [g not in zero for g in ids]
    assert stats.zero_variance_fraction == pytest.approx(len(zero) / 7)


def test_binary_group_advantages_and_all_equal_groups():
    adv, signal, stats = group_advantages(["a", "a", "a", "a", "b", "b"], [1, 0, 0, 0, 1, 1])
    std = math.sqrt((0.75**2 + 3 * 0.25**2) / 3)
    assert adv[:4].tolist() == pytest.approx([0.75 / std, -0.25 / std, -0.25 / std, -0.25 / std], rel=1e-5)
    assert adv[4:].tolist() == [0.0, 0.0] and signal.tolist() == [True] * 4 + [False] * 2
    assert stats.zero_variance_traces == 2
    with pytest.raises(ValueError):
        group_advantages(["a"], [1.0, 2.0])


def test_token_weights_match_explicit_formulas():
    lengths = [3, 1, 4, 0, 2]
    tm = token_weights(lengths, "token_mean")
    assert tm.shape == (10,) and torch.allclose(tm, torch.full((10,), 1 / 10))
    sm = token_weights(lengths, "sequence_mean")
    expected = [1 / (4 * 3)] * 3 + [1 / (4 * 1)] + [1 / (4 * 4)] * 4 + [1 / (4 * 2)] * 2
    assert sm.tolist() == pytest.approx(expected)
    assert float(sm.sum()) == pytest.approx(1.0)  # each sequence weighs the same, 1/4
    dr = token_weights(lengths, "dr_grpo", horizon=8)
    assert torch.allclose(dr, torch.full((10,), 1 / (4 * 8)))  # 4 non-empty sequences, horizon 8
    # a shard of a larger step: its weights are normalised by the step's totals
    shard = token_weights([3, 1], "sequence_mean", step_tokens=10, step_sequences=4)
    assert shard.tolist() == pytest.approx([1 / 12] * 3 + [1 / 4])
    assert torch.allclose(token_weights(lengths, "token_mean", step_tokens=40), torch.full((10,), 1 / 40))
    assert torch.allclose(token_weights([3, 1], "dr_grpo", step_sequences=4, horizon=8), torch.full((4,), 1 / 32))
    with pytest.raises(ValueError, match="aggregation"):
        token_weights(lengths, "mean")
    with pytest.raises(ValueError, match="horizon"):
        token_weights(lengths, "dr_grpo")


def test_the_three_aggregations_differ_where_their_papers_say():
    """Per sequence, the total weight of its tokens: token_mean (DAPO) ∝ its length, sequence_mean
    (GRPO) the same for every sequence, dr_grpo ∝ its length but normalised by a constant rather than
    the step's token count — so it, unlike token_mean, does not change when another sequence grows."""
    def per_sequence(lengths, mode):
        w = token_weights(lengths, mode, horizon=16)
        return [float(part.sum()) for part in torch.split(w, lengths)]

    short, long = [2, 6], [2, 12]
    assert per_sequence(short, "token_mean") == pytest.approx([2 / 8, 6 / 8])
    assert per_sequence(short, "sequence_mean") == pytest.approx([1 / 2, 1 / 2])
    assert per_sequence(short, "dr_grpo") == pytest.approx([2 / 32, 6 / 32])
    assert per_sequence(long, "token_mean")[0] == pytest.approx(2 / 14)  # the first sequence lost weight
    assert per_sequence(long, "dr_grpo")[0] == pytest.approx(2 / 32)  # it did not


def test_an_unknown_aggregation_is_refused_naming_the_table():
    with pytest.raises(ValueError, match=r"aggregation must be one of \['token_mean', 'sequence_mean', 'dr_grpo'\], "
                                         r"got 'dapo'"):
        token_weights([3, 1], "dapo")


def test_non_members_join_no_group_and_take_no_part_in_its_statistics():
    """Crashed episodes (reward 0 from the machine, not the policy) are not members: a group's
    mean and std come from its members only, and a group left with one member has no signal."""
    rng = random.Random(1)
    ids = [f"task-{rng.randrange(4)}" for _ in range(30)]
    rewards = [rng.random() for _ in ids]
    members = [rng.random() < 0.7 for _ in ids]
    ids += ["lonely", "lonely", "lonely"]
    rewards += [1.0, 0.0, 0.0]
    members += [True, False, False]
    adv, signal, stats = group_advantages(ids, rewards, members=members)
    kept = [i for i, m in enumerate(members) if m]
    twin = loop_twin([ids[i] for i in kept], [rewards[i] for i in kept])
    assert [adv[i].item() for i in kept] == pytest.approx(twin, abs=1e-5)
    assert all(adv[i] == 0 and not signal[i] for i, m in enumerate(members) if not m)
    assert adv[-3] == 0 and not signal[-3]  # the one member left of its group: no signal
    assert stats.excluded_traces == members.count(False)
    assert stats.n_groups == len({ids[i] for i in kept})
    with pytest.raises(ValueError, match="membership"):
        group_advantages(["a", "b"], [1.0, 0.0], members=[True])
