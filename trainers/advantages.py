"""Group-relative advantages keyed by task id (cross-harness GRPO, HarnessX §5.3).

Every trace of a task joins that task's group, whichever harness version or model checkpoint
produced it; groups can have any size. A = (r − mean_g) / (std_g + ε), or r − mean_g without the
std scaling (Dr. GRPO). A group whose rewards are all equal (including a singleton) carries no
learning signal: its advantages are zero and it is reported, and optionally dropped.

Only traces that are members join a group (``members``): the trainer and the export pass
``trace.trainable``, which the runtime clears for every crashed episode (infrastructure failures —
policy, out-of-memory, environment or tool crashes — and harness processor crashes) and a
training-bridge processor clears when the machine, not the policy, decided the reward. Such a
reward of 0 would otherwise pull the group's mean and std; a group left with fewer than two
members has no signal.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class GroupStats:
    n_groups: int
    zero_variance_groups: int  # groups whose rewards are all equal (singletons included)
    zero_variance_traces: int
    excluded_traces: int = 0  # traces that are not members of any group (see ``members``)

    @property
    def zero_variance_fraction(self) -> float:
        return self.zero_variance_groups / self.n_groups if self.n_groups else 0.0


def group_advantages(
    group_ids: Sequence[str],
    rewards: Sequence[float] | torch.Tensor,
    *,
    scale_by_std: bool = True,
    eps: float = 1e-6,
    members: Sequence[bool] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, GroupStats]:
    """(advantages [n], signal mask [n], stats) for ``n`` traces with their group ids.

    The std is the unbiased sample std of the group (as in TRL's GRPO); the signal mask is False
    for traces of zero-variance groups, so a caller can drop them. ``members`` (default: all)
    says which traces join their group; the others get advantage 0, signal False, and take no
    part in any group's mean or std.
    """
    r = torch.as_tensor(rewards, dtype=torch.float64).flatten()  # [n]
    if r.numel() != len(group_ids):
        raise ValueError(f"{len(group_ids)} group ids for {r.numel()} rewards")
    if members is not None:
        if len(members) != len(group_ids):
            raise ValueError(f"{len(members)} membership flags for {len(group_ids)} traces")
        keep = [i for i, m in enumerate(members) if m]
        sub_adv, sub_signal, sub = group_advantages([group_ids[i] for i in keep], r[keep], scale_by_std=scale_by_std,
                                                    eps=eps)
        adv = torch.zeros(r.numel(), dtype=torch.float32)  # [n]
        signal = torch.zeros(r.numel(), dtype=torch.bool)  # [n]
        adv[keep], signal[keep] = sub_adv, sub_signal
        stats = GroupStats(sub.n_groups, sub.zero_variance_groups, sub.zero_variance_traces, r.numel() - len(keep))
        return adv, signal, stats
    index: dict[str, int] = {}
    gid = torch.tensor([index.setdefault(g, len(index)) for g in group_ids], dtype=torch.long)  # [n]
    n_groups = len(index)
    count = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, gid, torch.ones_like(r))  # [G]
    mean = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, gid, r) / count  # [G]
    centred = r - mean[gid]  # [n]
    sq = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, gid, centred**2)  # [G]
    std = torch.sqrt(sq / (count - 1).clamp(min=1))  # [G], 0 for singletons
    empty = torch.zeros(n_groups, dtype=torch.float64)
    spread = empty.scatter_reduce(0, gid, r, "amax", include_self=False) - empty.scatter_reduce(
        0, gid, r, "amin", include_self=False)  # [G]
    zero_var = spread == 0  # [G]: exact comparison, so 1e-12 reward noise still counts as signal
    adv = centred / (std[gid] + eps) if scale_by_std else centred
    adv = torch.where(zero_var[gid], torch.zeros_like(adv), adv)
    signal = ~zero_var[gid]
    stats = GroupStats(n_groups, int(zero_var.sum()), int((~signal).sum()))
    return adv.float(), signal, stats
