"""What one GRPO step reports: ``StepMetrics`` (the record, defined with the run's records in
``coevo.rundir.records``), computed from the step's per-micro-batch loss details by pure functions,
so the figures a round records are read off tensors, not off the trainer."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from coevo.rundir.records import StepMetrics
from coevo.trainers.batch import TrainSequence

if TYPE_CHECKING:
    from coevo.kernels import GRPOLossOutput


def sampler_mismatch(seqs: Sequence[TrainSequence], tis_cap: float | None) -> dict[str, float | int | None]:
    """The mismatch figures of ``StepMetrics`` over every sequence of the step (each process holds
    them all, so no reduction): |old - sampler| per token, and the share of tokens whose importance
    weight exp(old - sampler) exceeds ``tis_cap``. Empty when no sequence has sampler log-probs."""
    pairs = [s for s in seqs if s.sampler_logp is not None]
    if not pairs:
        return {}
    old = torch.tensor([v for s in pairs for v in s.old_logp], dtype=torch.float64)
    sampler = torch.tensor([v for s in pairs for v in s.sampler_logp or ()], dtype=torch.float64)
    delta = (old - sampler)[~torch.isnan(old)]  # forced tokens (credit_forced) were not sampled
    if not delta.numel():
        return {}
    truncated = None if tis_cap is None else float((delta.exp() > tis_cap).double().mean())
    return {"sampler_mismatch_mean": float(delta.abs().mean()), "sampler_mismatch_max": float(delta.abs().max()),
            "sampler_tokens": int(delta.numel()), "tis_truncated_fraction": truncated}


def step_metrics(*, loss: float, details: list[GRPOLossOutput], advantages: torch.Tensor, zero_variance: float,
                 sequences: int, tokens: int, start: float, grad_norm: float, staleness: dict[int, int], lr: float,
                 excluded: tuple[int, int] = (0, 0), rewards: torch.Tensor | None = None) -> StepMetrics:
    """``details``: the micro-batches' loss details (ratio, log-probs, clipped mask, KL per token);
    ``advantages``: [T] of the traces that trained; ``zero_variance``: the share of groups whose
    rewards were all equal; ``start``: ``perf_counter`` at the step's start; ``lr``: the rate the
    step used (the scheduler has already moved on); ``excluded``: (traces left out of the groups,
    infrastructure failures among them); ``rewards``: [T] of the trainable traces."""
    adv = advantages
    ratio = torch.cat([d.ratio for d in details]) if details else torch.ones(1)
    logp = torch.cat([d.logp for d in details]) if details else torch.zeros(1)
    rewards = rewards if rewards is not None and rewards.numel() else torch.zeros(1, dtype=torch.float64)
    clipped = torch.cat([d.clipped.float() for d in details]) if details else torch.zeros(1)
    kls = [d.kl for d in details if d.kl is not None]
    return StepMetrics(
        loss=loss,
        clip_fraction=float(clipped.mean()),
        kl=float(torch.cat(kls).mean()) if kls else 0.0,
        ratio_mean=float(ratio.mean()),
        ratio_min=float(ratio.min()),
        ratio_max=float(ratio.max()),
        advantage_mean=float(adv.mean()) if adv.numel() else 0.0,
        advantage_std=float(adv.std()) if adv.numel() > 1 else 0.0,
        zero_variance_fraction=zero_variance,
        excluded_traces=excluded[0],
        infra_traces=excluded[1],
        sequences=sequences,
        tokens=tokens,
        tokens_per_s=tokens / max(time.perf_counter() - start, 1e-9),
        grad_norm=grad_norm,
        lr=lr,
        staleness=staleness,
        reward_mean=float(rewards.mean()),
        reward_std=float(rewards.std()) if rewards.numel() > 1 else 0.0,
        approx_kl=float((ratio - 1 - ratio.log()).mean()),
        entropy=float(-logp.mean()),
    )
