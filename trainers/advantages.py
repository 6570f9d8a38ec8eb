"""Group-relative advantages keyed by task id (cross-harness GRPO, HarnessX §5.3).

Every trace of a task joins that task's group, whichever harness version or model checkpoint
produced it; groups can have any size. A = (r − mean_g) / (std_g + ε), or r − mean_g without the
std scaling (Dr. GRPO). A group whose rewards are all equal (including a singleton) carries no
learning signal: its advantages are zero and it is reported, and optionally dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch


@dataclass(frozen=True)
class GroupStats:
    n_groups: int
    zero_variance_groups: int  # groups whose rewards are all equal (singletons included)
    zero_variance_traces: int

    @property
    def zero_variance_fraction(self) -> float:
        return self.zero_variance_groups / self.n_groups if self.n_groups else 0.0


def group_advantages(
    group_ids: Sequence[str],
    rewards: Sequence[float] | torch.Tensor,
    *,
    scale_by_std: bool = True,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor, GroupStats]:
    """(advantages [n], signal mask [n], stats) for ``n`` traces with their group ids.

    The std is the unbiased sample std of the group (as in TRL's GRPO); the signal mask is False
    for traces of zero-variance groups, so a caller can drop them.
    """
    r = torch.as_tensor(rewards, dtype=torch.float64).flatten()  # [n]
    if r.numel() != len(group_ids):
        raise ValueError(f"{len(group_ids)} group ids for {r.numel()} rewards")
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
